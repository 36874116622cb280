package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// TestGrantsCommand: relay grants prints outboxdb.GrantSQL (or its owner part) for the table of
// --table or OUTBOX_TABLE, and refuses a missing or invalid role.
func TestGrantsCommand(t *testing.T) {
	env := map[string]string{"OUTBOX_TABLE": "shop.orders"}
	run := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := command(context.Background(), append([]string{"grants"}, args...), func(k string) string { return env[k] }, &out, &errOut)
		return out.String(), errOut.String(), code
	}
	roles := outboxdb.Roles{Owner: "outbox_owner", Relay: "outbox_relay", Writer: "orders_app"}
	out, errOut, code := run("--owner-role", roles.Owner, "--relay-role", roles.Relay, "--writer-role", roles.Writer)
	want, err := outboxdb.GrantSQL(outboxdb.MustParseTable("shop.orders"), roles)
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 || out != want || errOut != "" {
		t.Errorf("relay grants: exit %d, stderr %q, output equal to GrantSQL: %v\n%s", code, errOut, out == want, out)
	}
	out, _, code = run("--table", "public.outbox", "--owner-role", roles.Owner, "--reader-role", "ops", "--owner-part")
	want, _ = outboxdb.OwnerGrantSQL(outboxdb.MustParseTable("public.outbox"), outboxdb.Roles{Owner: roles.Owner, Reader: "ops"})
	if code != 0 || out != want || strings.Contains(out, "DATABASE") {
		t.Errorf("relay grants --owner-part: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--owner-role is required"},
		{[]string{"--owner-role", "public"}, "reserved role name"},
		{[]string{"--owner-role", "o", "--relay-role", "pg_monitor"}, "relay role"},
		{[]string{"--owner-role", "o", "--table", "Shop.Orders"}, "invalid outbox table name"},
		{[]string{"--owner-role", "o", "--nosuch"}, "flag provided but not defined"},
	} {
		if _, errOut, code := run(c.args...); code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("relay grants %v: exit %d, %q; want exit 2 and %q", c.args, code, errOut, c.want)
		}
	}
}
