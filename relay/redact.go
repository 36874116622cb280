package relay

import (
	"net/url"
	"strings"
)

// redactor removes secrets (the database URL and its password, the SASL password) from text
// before it reaches a log line, a row's error column or an HTTP answer.
type redactor struct {
	secrets []string
}

const redacted = "[REDACTED]"

func newRedactor(secrets ...string) *redactor {
	r := &redactor{}
	seen := map[string]bool{}
	for _, s := range secrets {
		for _, v := range []string{s, url.QueryEscape(s), url.PathEscape(s)} {
			if v != "" && !seen[v] {
				seen[v] = true
				r.secrets = append(r.secrets, v)
			}
		}
	}
	// Longest first, so that a URL is replaced whole before the password inside it.
	for i := 1; i < len(r.secrets); i++ {
		for j := i; j > 0 && len(r.secrets[j]) > len(r.secrets[j-1]); j-- {
			r.secrets[j], r.secrets[j-1] = r.secrets[j-1], r.secrets[j]
		}
	}
	return r
}

// String returns s with every secret replaced.
func (r *redactor) String(s string) string {
	if r == nil {
		return s
	}
	for _, sec := range r.secrets {
		if strings.Contains(s, sec) {
			s = strings.ReplaceAll(s, sec, redacted)
		}
	}
	return s
}

// Error returns err's message with every secret replaced ("" for nil).
func (r *redactor) Error(err error) string {
	if err == nil {
		return ""
	}
	return r.String(err.Error())
}
