package controllers

import (
	"context"
	"strings"
	"testing"

	"k8s.io/client-go/tools/events"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/roletest"
)

// TestGrantRelayRole: the operator's grant of the relays' own role, on real roles (test/roletest),
// with the catalog as the observer: as the owner it grants once per schema version and role and
// says so in an event; as a role that does not own the table it grants nothing and says why in a
// Warning event (GRANT itself would only have warned); for relays that run as the operator's role
// there is nothing to grant.
func TestGrantRelayRole(t *testing.T) {
	ctx := context.Background()
	table := outboxdb.MustParseTable("public.outbox")
	rdb := roletest.New(t, table, nil)
	if _, err := outboxdb.Apply(ctx, rdb.SQL(t, rdb.Roles.Owner), table); err != nil {
		t.Fatal(err)
	}
	canUpdate := func() bool {
		var ok bool
		if err := rdb.SQL(t, roletest.Admin).QueryRowContext(ctx,
			`SELECT has_column_privilege($1, 'public.outbox', 'sent_at', 'UPDATE') AND has_table_privilege($1, 'public.outbox_relay_cursor', 'DELETE')`,
			rdb.Roles.Relay).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	reconciler := func() (*OutboxRelayReconciler, *events.FakeRecorder) {
		rec := events.NewFakeRecorder(10)
		return &OutboxRelayReconciler{Recorder: rec}, rec
	}
	run := func(r *OutboxRelayReconciler, rec *events.FakeRecorder, operatorRole, relayRole string) []string {
		relay := testRelay()
		relay.Status.TableID = "system/1/public.outbox"
		s := &scope{relay: relay, table: table, db: rdb.SQL(t, operatorRole)}
		r.grantRelayRole(ctx, s, relayRole)
		var got []string
		for len(rec.Events) > 0 {
			got = append(got, <-rec.Events)
		}
		return got
	}

	// Not the owner: nothing granted, a Warning naming the cause.
	r, rec := reconciler()
	evs := run(r, rec, rdb.Roles.Reader, rdb.Roles.Relay)
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+v1alpha1.ReasonRelayGrantFailed) || !strings.Contains(evs[0], "does not own table public.outbox") {
		t.Errorf("as a role that does not own the table: events %q", evs)
	}
	if canUpdate() {
		t.Fatal("the relay role holds the relay's privileges before any grant")
	}
	// The owner: granted, once.
	evs = run(r, rec, rdb.Roles.Owner, rdb.Roles.Relay)
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Normal "+v1alpha1.ReasonGrantedRelayRole+" Granted role \""+rdb.Roles.Relay+"\"") {
		t.Errorf("as the owner: events %q", evs)
	}
	if !canUpdate() {
		t.Error("the relay role lacks the relay's privileges after the operator's grant")
	}
	if evs = run(r, rec, rdb.Roles.Owner, rdb.Roles.Relay); len(evs) != 0 {
		t.Errorf("granted again at the same schema version: %q", evs)
	}
	// Relays that run as the operator's role: nothing to grant, nothing said.
	r2, rec2 := reconciler()
	if evs = run(r2, rec2, rdb.Roles.Owner, rdb.Roles.Owner); len(evs) != 0 {
		t.Errorf("relays as the owner: %q", evs)
	}
}
