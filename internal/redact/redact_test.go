package redact

import (
	"errors"
	"strings"
	"testing"
)

func TestRedactor(t *testing.T) {
	for _, dsn := range []string{
		"postgres://outbox:s3cr3t%21pw@db:5432/shop?sslmode=disable",
		"host=db user=outbox password=s3cr3t!pw dbname=shop",
	} {
		r := New(append(DatabaseSecrets(dsn), "sasl-pass")...)
		msg := "failed: " + dsn + " / s3cr3t!pw / s3cr3t%21pw / sasl-pass"
		got := r.String(msg)
		for _, leak := range []string{dsn, "s3cr3t!pw", "s3cr3t%21pw", "sasl-pass"} {
			if strings.Contains(got, leak) {
				t.Errorf("%q left in %q", leak, got)
			}
		}
		if !strings.HasPrefix(got, "failed: "+Placeholder) {
			t.Errorf("the URL is not replaced whole: %q", got)
		}
		if e := r.Error(errors.New(msg)); e != got {
			t.Errorf("Error %q, String %q", e, got)
		}
	}
	if got := New(DatabaseSecrets("postgres://u:pw@db/x")...).String("a pw in a pwd"); got != "a pw in a pwd" {
		t.Errorf("a two-byte password replaced everywhere: %q", got)
	}
	var nilR *Redactor
	if nilR.String("x") != "x" || nilR.Error(nil) != "" {
		t.Error("the nil Redactor changes text")
	}
}
