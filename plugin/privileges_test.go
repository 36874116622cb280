package plugin

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/envtestutil"
	"github.com/outbox-operator/outbox-operator/test/roletest"
)

// TestReadOnlyCommandsAsReaderRole: kubectl outbox status, events and published, given a Secret
// with the URL of a role holding only the reader's grants (outboxdb.GrantSQL, docs/privileges.md),
// read everything they show, under row tracking and under snapshot tracking (with a parked event);
// taking one grant away makes status fail with PostgreSQL's permission error.
func TestReadOnlyCommandsAsReaderRole(t *testing.T) {
	ctx := context.Background()
	table := outboxdb.MustParseTable("shop.outbox")
	d := roletest.New(t, table, nil)
	d.Migrate(t, 1)
	d.CheckRoles(t)

	f := &fixture{env: envtestutil.Shared(t), url: d.URL(d.Roles.Reader), db: d.SQL(t, roletest.Admin)}
	f.ns = f.env.CreateNamespace(t, "plugin")
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "shop-db", Namespace: f.ns}, Data: map[string][]byte{"url": []byte(f.url)}}
	if err := f.env.Client.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	f.relay = &v1alpha1.OutboxRelay{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: f.ns},
		Spec: v1alpha1.OutboxRelaySpec{
			Database:     v1alpha1.DatabaseSpec{SecretRef: v1alpha1.DatabaseSecretRef{Name: "shop-db"}, Table: table.String()},
			Kafka:        v1alpha1.KafkaSpec{Brokers: []v1alpha1.Broker{"127.0.0.1:9092"}},
			DefaultTopic: "orders",
		},
	}
	if err := f.env.Client.Create(ctx, f.relay); err != nil {
		t.Fatal(err)
	}
	f.kubeconfig = f.env.KubeconfigFor(t, testUser, "system:masters")

	// Events appended as the writer role; the owner marks a's sent and records a failure on b's
	// first, as a row relay would.
	w, err := outbox.New(table.String())
	if err != nil {
		t.Fatal(err)
	}
	writer := d.Pool(t, d.Roles.Writer)
	for s := 1; s <= 3; s++ {
		for _, agg := range []string{"a", "b"} {
			if err := pgx.BeginFunc(ctx, writer, func(tx pgx.Tx) error {
				_, err := w.Append(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: agg, EventType: "Seq", Payload: []byte(fmt.Sprintf(`{"seq":%d}`, s))})
				return err
			}); err != nil {
				t.Fatalf("outbox.Append as the writer: %v", err)
			}
		}
	}
	var a1, b1 int64
	if err := f.db.QueryRow(`SELECT min(id) FILTER (WHERE aggregate_id = 'a'), min(id) FILTER (WHERE aggregate_id = 'b') FROM shop.outbox`).Scan(&a1, &b1); err != nil {
		t.Fatal(err)
	}
	d.Exec(t, d.Roles.Owner, `UPDATE shop.outbox SET sent_at = now() WHERE aggregate_id = 'a'`)
	d.Exec(t, d.Roles.Owner, `UPDATE shop.outbox SET attempts = 2, error = 'refused' WHERE id = $1`, b1)

	check := func(tracking contract.Tracking, pending int64) {
		t.Helper()
		var s Status
		f.runJSON(t, &s, "status", "orders")
		if s.Tracking != tracking || s.Table != table.String() || s.SchemaVersion != outboxdb.LatestVersion() ||
			s.Backlog.PendingCount != pending || s.Partitions.Count < 2 || len(s.Blocked) != 1 || s.Blocked[0].AggregateID != "b" {
			t.Errorf("status as the reader (%s tracking): %+v", tracking, s)
		}
		out, errOut, code := f.run(t, "status", "orders")
		if code != 0 || !strings.Contains(out, "outbox_default") {
			t.Errorf("status table as the reader: exit %d, %s\n%s", code, errOut, out)
		}
		var evs []Event
		f.runJSON(t, &evs, "events", "orders", "--aggregate", "b")
		if len(evs) != 3 {
			t.Errorf("events --aggregate b as the reader: %+v", evs)
		}
		var p Published
		f.runJSON(t, &p, "published", "orders", "--event", fmt.Sprint(a1))
		if !p.Published {
			t.Errorf("published a/1 as the reader: %+v", p)
		}
	}
	check(contract.TrackRow, 3)

	// Snapshot tracking: the owner resets the cursor past every event, then parks b's events as a
	// snapshot relay would.
	owner := d.SQL(t, d.Roles.Owner)
	if _, err := outboxdb.ResetCursor(ctx, owner, table, outboxdb.ResetToNow, "test"); err != nil {
		t.Fatal(err)
	}
	d.Exec(t, d.Roles.Owner, `INSERT INTO shop.outbox_parked (id, created_at, event_id, aggregate_type, aggregate_id, event_type, payload, headers, bucket, attempts, error)
SELECT id, created_at, event_id, aggregate_type, aggregate_id, event_type, payload, headers, `+outboxdb.BucketExprOf("o")+`,
  CASE WHEN id = $1 THEN 2 ELSE 0 END, CASE WHEN id = $1 THEN 'refused' END
FROM shop.outbox o WHERE aggregate_id = 'b'`, b1)
	check(contract.TrackSnapshot, 3)

	// Without SELECT on the parked events, status says so.
	d.Exec(t, d.Roles.Owner, `REVOKE SELECT ON shop.outbox_parked FROM `+pgx.Identifier{d.Roles.Reader}.Sanitize())
	_, errOut, code := f.run(t, "status", "orders")
	if code == 0 || !strings.Contains(errOut, "permission denied for table outbox_parked") {
		t.Errorf("status without SELECT on outbox_parked: exit %d, %q; want a permission error", code, errOut)
	} else {
		t.Logf("status without SELECT on outbox_parked: %s", strings.TrimSpace(errOut))
	}
	d.GrantAsOwner(t)
	var s Status
	f.runJSON(t, &s, "status", "orders")
}
