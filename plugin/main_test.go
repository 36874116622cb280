package plugin

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/envtestutil"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	envtestutil.StopShared()
	kafkatest.StopShared()
	os.Exit(code)
}

var testTable = outboxdb.MustParseTable("public.outbox")

// fixture is an OutboxRelay in its own namespace of the shared control plane, the Secret holding
// the URL of a fresh database with the outbox schema, and a kubeconfig for the user jane.
type fixture struct {
	env        *envtestutil.Env
	ns         string
	url        string
	db         *sql.DB
	relay      *v1alpha1.OutboxRelay
	kubeconfig string
}

const testUser = "jane"

// newFixture creates the fixture; edit changes the OutboxRelay before it is created.
func newFixture(t *testing.T, edit func(*v1alpha1.OutboxRelay)) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := &fixture{env: envtestutil.Shared(t), url: pgtest.NewDatabase(t)}
	f.ns = f.env.CreateNamespace(t, "plugin")
	if err := pgtest.OutboxSchema(ctx, f.url, testTable, 1); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.db, err = sql.Open("pgx", f.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.db.Close() })
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "shop-db", Namespace: f.ns}, Data: map[string][]byte{"url": []byte(f.url)}}
	if err := f.env.Client.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	f.relay = &v1alpha1.OutboxRelay{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: f.ns},
		Spec: v1alpha1.OutboxRelaySpec{
			Database:     v1alpha1.DatabaseSpec{SecretRef: v1alpha1.DatabaseSecretRef{Name: "shop-db"}},
			Kafka:        v1alpha1.KafkaSpec{Brokers: []v1alpha1.Broker{"127.0.0.1:9092"}},
			DefaultTopic: "orders",
		},
	}
	if edit != nil {
		edit(f.relay)
	}
	if err := f.env.Client.Create(ctx, f.relay); err != nil {
		t.Fatal(err)
	}
	f.kubeconfig = f.env.KubeconfigFor(t, testUser, "system:masters")
	return f
}

// run runs kubectl outbox with args as jane, in the fixture's namespace.
func (f *fixture) run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return f.runAs(t, f.kubeconfig, args...)
}

func (f *fixture) runAs(t *testing.T, kubeconfig string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code = Execute(ctx, append(args, "--kubeconfig", kubeconfig, "-n", f.ns), &out, &errOut)
	return out.String(), errOut.String(), code
}

// runJSON runs a command with -o json, fails the test unless it succeeds, and decodes its output.
func (f *fixture) runJSON(t *testing.T, into any, args ...string) {
	t.Helper()
	out, errOut, code := f.run(t, append(args, "-o", "json")...)
	if code != 0 {
		t.Fatalf("kubectl outbox %s: exit %d: %s", strings.Join(args, " "), code, errOut)
	}
	if err := json.Unmarshal([]byte(out), into); err != nil {
		t.Fatalf("kubectl outbox %s: %v in %s", strings.Join(args, " "), err, out)
	}
}

// exec runs SQL on the fixture's database.
func (f *fixture) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := f.db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// idOf returns the id and event_id of the seq-th event (1-based) of an aggregate.
func (f *fixture) idOf(t *testing.T, agg string, seq int) (id int64, eventID string) {
	t.Helper()
	if err := f.db.QueryRow(`SELECT id, event_id::text FROM outbox WHERE aggregate_id = $1 ORDER BY id OFFSET $2 LIMIT 1`, agg, seq-1).
		Scan(&id, &eventID); err != nil {
		t.Fatal(err)
	}
	return id, eventID
}

// byState maps each event of evs to its state, keyed aggregate/seq in id order.
func statesOf(evs []Event) map[string]string {
	seq := map[string]int{}
	out := map[string]string{}
	for _, e := range evs {
		seq[e.AggregateID]++
		out[e.AggregateID+"/"+string(rune('0'+seq[e.AggregateID]))] = e.State
	}
	return out
}
