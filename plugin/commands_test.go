package plugin

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// writeEvents inserts events of aggregate type order: n per aggregate, in aggregate order.
func (f *fixture) writeEvents(t *testing.T, n int, aggs ...string) {
	t.Helper()
	for s := 1; s <= n; s++ {
		for _, a := range aggs {
			f.exec(t, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'Seq', jsonb_build_object('seq', $2::int))`, a, s)
		}
	}
}

// TestCommandsRowTracking runs every command against a row-tracked table with events in each
// state a relay leaves them in (the relay itself runs in TestThroughKafka): what they show, what
// they record, and the bad input they refuse without changing anything.
func TestCommandsRowTracking(t *testing.T) {
	f := newFixture(t, nil)
	f.writeEvents(t, 3, "a", "b", "c")
	f.exec(t, `UPDATE outbox SET sent_at = now() WHERE aggregate_id = 'a' OR (aggregate_id = 'c' AND (payload->>'seq')::int < 3)`)
	b1, _ := f.idOf(t, "b", 1)
	f.exec(t, `UPDATE outbox SET attempts = 3, error = 'publish to orders failed: [10] Message Size Too Large' WHERE id = $1`, b1)

	// The operator's conditions (no operator runs here: set as it would).
	f.relay.Status.Conditions = []metav1.Condition{
		{Type: v1alpha1.ConditionRelaysAvailable, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonKafkaUnreachable, Message: "0 of 1 relay shards available", LastTransitionTime: metav1.Now()},
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonKafkaUnreachable, Message: "relays unavailable", LastTransitionTime: metav1.Now()},
	}
	if err := f.env.Client.Status().Update(context.Background(), f.relay); err != nil {
		t.Fatal(err)
	}
	var s Status
	f.runJSON(t, &s, "status", "orders")
	if len(s.Conditions) != 2 || s.Conditions[0].Type != v1alpha1.ConditionRelaysAvailable || s.Conditions[0].Reason != v1alpha1.ReasonKafkaUnreachable {
		t.Errorf("status: conditions %+v", s.Conditions)
	}
	if s.Tracking != "row" || s.Table != "public.outbox" || s.SchemaVersion != outboxdb.LatestVersion() ||
		s.Backlog.PendingCount != 4 || !s.Backlog.Exact || s.Partitions.Count < 2 || len(s.Shards.Relays) != 0 {
		t.Errorf("status: %+v", s)
	}
	if len(s.Blocked) != 1 || s.Blocked[0].AggregateID != "b" || s.Blocked[0].FirstID != b1 || s.Blocked[0].Attempts != 3 ||
		s.Blocked[0].Error == nil || !strings.Contains(*s.Blocked[0].Error, "Message Size Too Large") {
		t.Errorf("status: blocked %+v, want aggregate b, first event %d, 3 attempts, its error", s.Blocked, b1)
	}
	out, errOut, code := f.run(t, "status", "orders")
	t.Logf("kubectl outbox status orders:\n%s", out)
	for _, want := range []string{"OutboxRelay:", "row tracking", "Ready:        False (KafkaUnreachable)", "0 of 1 relay shards available", "Blocked aggregates:", "Message Size Too Large", "no relay is connected", "Partitions:", "outbox_default"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("status table lacks %q (exit %d, %s):\n%s", want, code, errOut, out)
		}
	}

	var evs []Event
	f.runJSON(t, &evs, "events", "orders", "--aggregate", "b")
	if got := statesOf(evs); fmt.Sprint(got) != fmt.Sprint(map[string]string{"b/1": StateBlocked, "b/2": StateHeldBack, "b/3": StateHeldBack}) {
		t.Errorf("events --aggregate b: %v", got)
	}
	f.runJSON(t, &evs, "events", "orders", "--pending")
	if len(evs) != 4 || evs[0].ID != b1 {
		t.Errorf("events --pending: %d events, first %d; want 4, first %d", len(evs), evs[0].ID, b1)
	}
	f.runJSON(t, &evs, "events", "orders", "--blocked", "--since", "1h", "--limit", "2")
	if len(evs) != 2 || evs[0].State != StateBlocked || evs[1].State != StateHeldBack {
		t.Errorf("events --blocked --limit 2: %+v", evs)
	}

	// Bad input: refused with a clear error; nothing recorded, nothing changed.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"skip", "orders", "--event", fmt.Sprint(b1), "--drop"}, "--reason is required"},
		{[]string{"skip", "orders", "--event", fmt.Sprint(b1), "--drop", "--reason", "  "}, "--reason is required"},
		{[]string{"skip", "orders", "--event", fmt.Sprint(b1), "--reason", "x"}, "exactly one of --to-dead-letter and --drop"},
		{[]string{"skip", "orders", "--event", fmt.Sprint(b1), "--drop", "--to-dead-letter", "--reason", "x"}, "exactly one of"},
		{[]string{"skip", "orders", "--event", "order-42", "--drop", "--reason", "x"}, "want the event's id"},
		{[]string{"skip", "orders", "--event", fmt.Sprint(b1), "--to-dead-letter", "--reason", "x"}, "has no dead-letter topic"},
		{[]string{"skip", "orders", "--event", "999999", "--drop", "--reason", "x"}, "no such event"},
		{[]string{"skip", "orders", "--event", fmt.Sprint(b1 - 1), "--drop", "--reason", "x"}, "already published"},
		{[]string{"retry", "orders"}, "retry needs --aggregate"},
		{[]string{"events", "orders", "--pending", "--blocked"}, "exclude each other"},
		{[]string{"status", "nosuch"}, "OutboxRelay " + f.ns + "/nosuch not found"},
		{[]string{"status", "orders", "-o", "xml"}, "want table, json or yaml"},
	} {
		_, errOut, code := f.run(t, c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("kubectl outbox %s: exit %d, %q; want an error containing %q", strings.Join(c.args, " "), code, errOut, c.want)
		}
	}
	var n int
	if err := f.db.QueryRow(`SELECT (SELECT count(*) FROM outbox_skips) + (SELECT count(*) FROM outbox_retries) +
  (SELECT count(*) FROM outbox WHERE id = $1 AND (sent_at IS NOT NULL OR attempts <> 3))`, b1).Scan(&n); err != nil || n != 0 {
		t.Fatalf("bad input changed something: %d rows (%v)", n, err)
	}

	// skip --drop: recorded with jane's name (SelfSubjectReview); the aggregate's next event is pending.
	var sk outboxdb.Skip
	f.runJSON(t, &sk, "skip", "orders", "--event", fmt.Sprint(b1), "--drop", "--reason", "duplicate of order 41")
	if sk.SkippedBy != testUser || sk.PreviousAttempts != 3 || sk.Action != outboxdb.SkipDrop || sk.AggregateID != "b" {
		t.Errorf("skip: %+v", sk)
	}
	f.runJSON(t, &evs, "events", "orders", "--aggregate", "b")
	if evs[0].State != StateSkippedDropped || evs[0].Skip == nil || evs[0].Skip.SkippedBy != testUser || evs[0].Skip.Reason != "duplicate of order 41" ||
		evs[1].State != StatePending {
		t.Errorf("events after the drop: %+v", evs)
	}
	out, _, _ = f.run(t, "events", "orders", "--aggregate", "b")
	t.Logf("kubectl outbox events orders --aggregate b:\n%s", out)
	if !strings.Contains(out, "drop by jane at ") || !strings.Contains(out, "duplicate of order 41") {
		t.Errorf("events table does not show who skipped and why:\n%s", out)
	}
	if _, errOut, code := f.run(t, "skip", "orders", "--event", fmt.Sprint(b1), "--drop", "--reason", "again"); code == 0 || !strings.Contains(errOut, "already skipped (drop by jane") {
		t.Errorf("second skip: exit %d, %s", code, errOut)
	}

	// retry: the failed events' attempts reset and the retry recorded.
	b2, _ := f.idOf(t, "b", 2)
	f.exec(t, `UPDATE outbox SET attempts = 2, error = 'boom' WHERE id = $1`, b2)
	var r RetryResult
	f.runJSON(t, &r, "retry", "orders", "--aggregate", "b")
	if r.Events != 1 || r.MaxAttempts != 2 || r.RetriedBy != testUser || r.FirstError == nil || *r.FirstError != "boom" || r.RelaysListening != 0 {
		t.Errorf("retry: %+v", r)
	}
	var attempts int
	if err := f.db.QueryRow(`SELECT attempts FROM outbox WHERE id = $1`, b2).Scan(&attempts); err != nil || attempts != 0 {
		t.Errorf("attempts after retry: %d (%v)", attempts, err)
	}

	// published: yes with its time and topic, no for a pending one; partition and offset unknown.
	a1, _ := f.idOf(t, "a", 1)
	var p Published
	f.runJSON(t, &p, "published", "orders", "--event", fmt.Sprint(a1))
	if !p.Published || p.PublishedAt == nil || p.Topic != "orders" || p.Key != "a" || !strings.HasPrefix(p.Partition, "unknown") || !strings.HasPrefix(p.Offset, "unknown") {
		t.Errorf("published a/1: %+v", p)
	}
	_, c3 := f.idOf(t, "c", 3)
	f.runJSON(t, &p, "published", "orders", "--event", strings.ToUpper(c3))
	if p.Published || p.Answer != "no: pending" {
		t.Errorf("published c/3: %+v", p)
	}
	f.runJSON(t, &p, "published", "orders", "--event", fmt.Sprint(b1))
	if p.Published || !strings.Contains(p.Answer, "dropped") {
		t.Errorf("published b/1 (dropped): %+v", p)
	}
}

// TestSecretForbidden: a user who may read the OutboxRelay but not its Secret is told which
// Secret and which verb; a database URL with a password never shows in an error.
func TestSecretForbidden(t *testing.T) {
	f := newFixture(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "relay-reader", Namespace: f.ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"outboxrelays"}, Verbs: []string{"get"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bob", Namespace: f.ns},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "bob"}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "relay-reader"}}
	if err := f.env.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := f.env.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	bob := f.env.KubeconfigFor(t, "bob")
	_, errOut, code := f.runAs(t, bob, "status", "orders")
	want := fmt.Sprintf(`you (bob) may not get Secret %s/shop-db, which holds the database URL of OutboxRelay orders`, f.ns)
	if code != 1 || !strings.Contains(errOut, want) || !strings.Contains(errOut, `ask for the verb "get" on secrets named shop-db in namespace `+f.ns) {
		t.Errorf("status as bob: exit %d, %q; want %q", code, errOut, want)
	}
	_, errOut, _ = f.runAs(t, f.env.KubeconfigFor(t, "carol"), "status", "orders")
	if !strings.Contains(errOut, `may not get OutboxRelay `+f.ns+`/orders`) {
		t.Errorf("status as carol: %q", errOut)
	}

	// A URL whose server does not answer: the error names no secret.
	const password = "s3cret-Pa55"
	sec := fmt.Sprintf("postgres://outbox:%s@127.0.0.1:1/shop?connect_timeout=2", password)
	g := newFixture(t, nil)
	if err := g.env.Client.Delete(ctx, secretOf(g)); err != nil {
		t.Fatal(err)
	}
	s := secretOf(g)
	s.Data = map[string][]byte{"url": []byte(sec)}
	if err := g.env.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = g.run(t, "status", "orders")
	if code == 0 || strings.Contains(errOut, password) || !strings.Contains(errOut, "connecting to the database of OutboxRelay") {
		t.Errorf("status with an unreachable database: exit %d, %q", code, errOut)
	}
}

func secretOf(f *fixture) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "shop-db", Namespace: f.ns}}
}
