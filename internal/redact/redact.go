// Package redact removes secrets (database URLs and passwords, SASL passwords) from text before
// it reaches a log line, an event, a condition, a row's error column or an HTTP answer: one
// implementation for the operator and the relay.
package redact

import (
	"net/url"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Placeholder stands where a secret was.
const Placeholder = "[redacted]"

// Redactor replaces a fixed set of secrets. The nil Redactor replaces nothing.
type Redactor struct {
	secrets []string // with their URL-escaped forms, longest first
}

// New returns a Redactor of secrets (empty ones are ignored).
func New(secrets ...string) *Redactor {
	r := &Redactor{}
	for _, s := range secrets {
		for _, v := range []string{s, url.QueryEscape(s), url.PathEscape(s)} {
			if v != "" && !slices.Contains(r.secrets, v) {
				r.secrets = append(r.secrets, v)
			}
		}
	}
	// Longest first, so that a URL is replaced whole before the password inside it.
	slices.SortStableFunc(r.secrets, func(a, b string) int { return len(b) - len(a) })
	return r
}

// DatabaseSecrets returns a libpq URL or keyword/value string with the password it carries, in
// either form, for New. Passwords shorter than 3 bytes are left out: replacing them would mangle
// every message they happen to appear in, and hide nothing worth hiding.
func DatabaseSecrets(dsn string) []string {
	if dsn == "" {
		return nil
	}
	out := []string{dsn}
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && len(p) >= 3 {
			out = append(out, p)
		}
	}
	if cfg, err := pgconn.ParseConfig(dsn); err == nil && len(cfg.Password) >= 3 {
		out = append(out, cfg.Password)
	}
	return out
}

// String returns s with every secret replaced.
func (r *Redactor) String(s string) string {
	if r == nil {
		return s
	}
	for _, sec := range r.secrets {
		if strings.Contains(s, sec) {
			s = strings.ReplaceAll(s, sec, Placeholder)
		}
	}
	return s
}

// Error returns err's message with every secret replaced ("" for nil).
func (r *Redactor) Error(err error) string {
	if err == nil {
		return ""
	}
	return r.String(err.Error())
}
