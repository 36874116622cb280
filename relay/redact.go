package relay

import "github.com/outbox-operator/outbox-operator/internal/redact"

// redactor removes secrets (the database URL and its password, the SASL password) from text
// before it reaches a log line, a row's error column or an HTTP answer (internal/redact, shared
// with the operator).
type redactor = redact.Redactor

func newRedactor(secrets ...string) *redactor { return redact.New(secrets...) }
