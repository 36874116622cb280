package controllers

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func openTestDB(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func regclassExists(t *testing.T, db *sql.DB, name string) bool {
	t.Helper()
	var ok bool
	if err := db.QueryRow(`SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func args(d *appsv1.Deployment) []string { return d.Spec.Template.Spec.Containers[0].Args }

// TestLifecycle follows one OutboxRelay from creation to deletion against a real API server and a
// real PostgreSQL.
func TestLifecycle(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	ns := s.env.CreateNamespace(t, "lifecycle")
	url := pgtest.NewDatabase(t)
	db := openTestDB(t, url)
	s.createSecret(t, ns, "shop-db", map[string]string{"url": url})
	s.createSecret(t, ns, "kafka-user", map[string]string{"username": "relay", "password": "kafka-pw"})
	s.createRelay(t, newRelay(ns, "orders", "shop-db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Shards = 2
		r.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: v1alpha1.SASLScramSHA256,
			SecretRef: v1alpha1.SASLSecretRef{Name: "kafka-user"}, Plaintext: v1alpha1.SASLPlaintextAllowed}
	}))

	// Migrations and partitions land in PostgreSQL.
	relay := s.waitCondition(t, ns, "orders", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionPartitionsReady, metav1.ConditionTrue, v1alpha1.ReasonPartitionsReady)
	for _, name := range []string{"public.outbox", "public.outbox_default", "public.outbox_pending_idx", "public.inbox",
		"public.outbox_schema_version", "public." + partName(utcDay(time.Now())), "public." + partName(utcDay(time.Now()).AddDate(0, 0, 3))} {
		if !regclassExists(t, db, name) {
			t.Errorf("%s does not exist", name)
		}
	}
	// The default wake-up is polling: the operator drops the insert trigger the migrations made.
	eventually(t, 30*time.Second, func() error {
		var trigger int
		if err := db.QueryRow(`SELECT count(*) FROM pg_trigger WHERE tgname = 'outbox_notify' AND tgrelid = 'public.outbox'::regclass`).Scan(&trigger); err != nil {
			return err
		}
		if trigger != 0 {
			return fmt.Errorf("the insert trigger is still there")
		}
		return nil
	})

	// One Deployment per shard, with the relay's command line, secrets by reference, restricted security.
	var hashes []string
	for k := int32(0); k < 2; k++ {
		d := s.deployment(t, ns, DeploymentName("orders", k))
		a := args(d)
		for _, w := range []string{"run", "--table=public.outbox", "--shard-count=0", fmt.Sprintf("--shard-index=%d", k),
			"--brokers=kafka-0.kafka.svc:9092", "--topic-map=order=orders.events", "--kafka-sasl-mechanism=scram-sha-256"} {
			if !slices.Contains(a, w) {
				t.Errorf("shard %d args %q lack %q", k, a, w)
			}
		}
		env := envByName(d.Spec.Template.Spec.Containers[0])
		for name, ref := range map[string][2]string{
			"OUTBOX_DATABASE_URL":        {"shop-db", "url"},
			"OUTBOX_KAFKA_SASL_PASSWORD": {"kafka-user", "password"},
		} {
			e := env[name]
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
				e.ValueFrom.SecretKeyRef.Name != ref[0] || e.ValueFrom.SecretKeyRef.Key != ref[1] {
				t.Errorf("shard %d env %s = %+v", k, name, e)
			}
		}
		sc := d.Spec.Template.Spec.Containers[0].SecurityContext
		if sc == nil || !ptr.Deref(sc.ReadOnlyRootFilesystem, false) || !ptr.Deref(sc.RunAsNonRoot, false) || ptr.Deref(sc.AllowPrivilegeEscalation, true) {
			t.Errorf("shard %d security context %+v", k, sc)
		}
		if !metav1.IsControlledBy(d, relay) {
			t.Errorf("shard %d not controlled by the relay: %+v", k, d.OwnerReferences)
		}
		if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			t.Errorf("shard %d strategy %q", k, d.Spec.Strategy.Type)
		}
		var owners []string
		for _, mf := range d.ManagedFields {
			owners = append(owners, mf.Manager+"/"+string(mf.Operation))
		}
		if !slices.Contains(owners, fieldOwnerName+"/Apply") {
			t.Errorf("shard %d managed by %v, want %s/Apply", k, owners, fieldOwnerName)
		}
		hashes = append(hashes, d.Spec.Template.Annotations[AnnotationSecretHash])
	}
	if hashes[0] == "" || hashes[0] != hashes[1] {
		t.Errorf("secret hashes %v", hashes)
	}

	// Not Ready until the relays are available; then Ready.
	relay = s.waitCondition(t, ns, "orders", v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonRelaysUnavailable)
	if c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status == metav1.ConditionTrue {
		t.Fatalf("Ready before the relays are available: %+v", c)
	}
	s.markAvailable(t, ns, "orders-shard-0")
	s.markAvailable(t, ns, "orders-shard-1")
	relay = s.waitCondition(t, ns, "orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReady)
	st := relay.Status
	if st.ObservedGeneration != relay.Generation || st.Shards != 2 || st.ReadyShards != 2 || st.Selector != Selector("orders") ||
		st.SchemaVersion != outboxdb.LatestVersion() || st.Partitions == nil || ptr.Deref(st.PendingEvents, -1) != 0 {
		t.Errorf("status %+v", st)
	}
	evs := s.waitEvents(t, ns, "orders", "Normal AppliedMigrations", "Normal CreatedPartitions")
	t.Logf("events: %q", evs)

	// Rows inserted show up as pending count and lag; lag over the target turns Ready False.
	if _, err := db.ExecContext(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT 'order', 'o-' || i, 'created', '{}', now() - interval '2 minutes' FROM generate_series(1, 3) i`); err != nil {
		t.Fatal(err)
	}
	relay = s.waitCondition(t, ns, "orders", v1alpha1.ConditionLagWithinTarget, metav1.ConditionFalse, v1alpha1.ReasonLagExceeded)
	if p, l := ptr.Deref(relay.Status.PendingEvents, -1), ptr.Deref(relay.Status.LagSeconds, -1); p != 3 || l < 120 || l > 600 {
		t.Errorf("pending %d lag %d, want 3 and about 120", p, l)
	}
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonLagExceeded)
	if _, err := db.ExecContext(ctx, `UPDATE public.outbox SET sent_at = now()`); err != nil {
		t.Fatal(err)
	}
	relay = s.waitCondition(t, ns, "orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReady)
	if p := ptr.Deref(relay.Status.PendingEvents, -1); p != 0 {
		t.Errorf("pending %d after sending everything", p)
	}

	// Resharding with real relays standing in for the pods (envtest runs none): they follow the
	// table's layout, so the shard count is not in the pod template and no pod restarts.
	k := kafkatest.NewKfake(t)
	pods := startFollowers(t, url, k.Brokers, 3)
	eventually(t, 30*time.Second, func() error {
		if !pods[0].Ready() || !pods[1].Ready() || pods[2].Ready() {
			return fmt.Errorf("relays ready: %s; want shards 0 and 1 of 2", readyFollowers(pods))
		}
		return nil
	})
	tmpl0 := s.deployment(t, ns, "orders-shard-0").Spec.Template.DeepCopy()

	// More shards: a new Deployment; the switch waits for its relay, then the layout moves.
	s.setShards(t, ns, "orders", 3)
	d2 := s.deployment(t, ns, "orders-shard-2")
	if !slices.Contains(args(d2), "--shard-count=0") || !slices.Contains(args(d2), "--shard-index=2") {
		t.Errorf("shard 2 args %q", args(d2))
	}
	relay = s.waitResharded(t, ns, "orders", 2, 3)
	eventually(t, 10*time.Second, func() error {
		if !pods[2].Ready() {
			return fmt.Errorf("shard 2's relay does not publish after the switch: %s", readyFollowers(pods))
		}
		return nil
	})
	if d0 := s.deployment(t, ns, "orders-shard-0"); !equality.Semantic.DeepEqual(d0.Spec.Template, *tmpl0) {
		t.Error("resharding changed shard 0's pod template: its pod would restart")
	}
	s.waitEvents(t, ns, "orders", "Normal Resharding", "Normal SwitchedLayout", "Normal Resharded")
	t.Logf("2 -> 3 shards: paused %d ms", ptr.Deref(relay.Status.LastReshard.PauseMilliseconds, -1))

	// Fewer shards: the surplus Deployments go once the layout switched.
	s.setShards(t, ns, "orders", 1)
	s.waitResharded(t, ns, "orders", 3, 1)
	for _, gone := range []string{"orders-shard-1", "orders-shard-2"} {
		eventually(t, 30*time.Second, func() error {
			err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: gone}, &appsv1.Deployment{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("%s still there (%w)", gone, err)
		})
	}
	eventually(t, 10*time.Second, func() error {
		if !pods[0].Ready() || pods[1].Ready() || pods[2].Ready() {
			return fmt.Errorf("relays ready: %s; want shard 0 only", readyFollowers(pods))
		}
		return nil
	})
	for _, p := range pods {
		p.stop()
	}
	s.markAvailable(t, ns, "orders-shard-0")
	relay = s.waitCondition(t, ns, "orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReady)
	if relay.Status.Shards != 1 || relay.Status.ReadyShards != 1 || relay.Status.DesiredShards != 1 {
		t.Errorf("shards %d ready %d desired %d", relay.Status.Shards, relay.Status.ReadyShards, relay.Status.DesiredShards)
	}

	// A changed Secret rolls the relays through the pod template annotation.
	before := s.deployment(t, ns, "orders-shard-0").Spec.Template.Annotations[AnnotationSecretHash]
	sec := &corev1.Secret{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shop-db"}, sec); err != nil {
		t.Fatal(err)
	}
	sec.Data["url"] = []byte(url + "&application_name=rotated")
	if err := s.c.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		after := s.deployment(t, ns, "orders-shard-0").Spec.Template.Annotations[AnnotationSecretHash]
		if after == before {
			return fmt.Errorf("secret hash unchanged: %s", after)
		}
		return nil
	})

	// Paused: replicas 0, RelaysAvailable False.
	s.patchRelay(t, ns, "orders", func(r *v1alpha1.OutboxRelay) { r.Spec.Paused = true })
	eventually(t, 30*time.Second, func() error {
		if r := ptr.Deref(s.deployment(t, ns, "orders-shard-0").Spec.Replicas, -1); r != 0 {
			return fmt.Errorf("replicas %d while paused", r)
		}
		return nil
	})
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonPaused)

	// Deleting the OutboxRelay leaves the database alone; the Deployments carry owner references for
	// the garbage collector (which envtest does not run).
	if _, err := db.ExecContext(ctx, `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o-9', 'created', '{}')`); err != nil {
		t.Fatal(err)
	}
	relay = s.getRelay(t, ns, "orders")
	if err := s.c.Delete(ctx, relay); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		err := s.c.Get(ctx, client.ObjectKeyFromObject(relay), &v1alpha1.OutboxRelay{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("relay still there: %w", err)
	})
	var total, pending int
	if err := db.QueryRow(`SELECT count(*), count(*) FILTER (WHERE sent_at IS NULL) FROM public.outbox`).Scan(&total, &pending); err != nil {
		t.Fatal(err)
	}
	if total != 4 || pending != 1 {
		t.Errorf("after delete: %d rows, %d pending; want 4 and 1", total, pending)
	}
	d := s.deployment(t, ns, "orders-shard-0")
	if len(d.OwnerReferences) != 1 || d.OwnerReferences[0].UID != relay.UID || !ptr.Deref(d.OwnerReferences[0].Controller, false) {
		t.Errorf("owner references %+v", d.OwnerReferences)
	}
}

func (s *suite) patchRelay(t *testing.T, ns, name string, f func(*v1alpha1.OutboxRelay)) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		r := s.getRelay(t, ns, name)
		before := r.DeepCopy()
		f(r)
		return s.c.Patch(testCtx(t), r, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	})
}

func (s *suite) setShards(t *testing.T, ns, name string, n int32) {
	s.patchRelay(t, ns, name, func(r *v1alpha1.OutboxRelay) { r.Spec.Shards = n })
}

// waitResharded waits until status reports the layout moved from one shard count to another,
// with its publishing pause, and ShardsSettled is True.
func (s *suite) waitResharded(t *testing.T, ns, name string, from, to int32) *v1alpha1.OutboxRelay {
	t.Helper()
	var relay *v1alpha1.OutboxRelay
	eventually(t, time.Minute, func() error {
		relay = s.getRelay(t, ns, name)
		st := relay.Status
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionShardsSettled)
		if st.Shards != to || st.LastReshard == nil || st.LastReshard.FromShards != from || st.LastReshard.ToShards != to ||
			st.LastReshard.PauseMilliseconds == nil || c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("status: shards %d, last reshard %+v, ShardsSettled %+v", st.Shards, st.LastReshard, c)
		}
		return nil
	})
	return relay
}

// waitEvents waits until events with each prefix (type and reason) exist for the object.
func (s *suite) waitEvents(t *testing.T, ns, name string, prefixes ...string) []string {
	t.Helper()
	var evs []string
	eventually(t, 30*time.Second, func() error {
		evs = s.eventsFor(t, ns, name)
		for _, p := range prefixes {
			if !slices.ContainsFunc(evs, func(e string) bool { return strings.HasPrefix(e, p) }) {
				return fmt.Errorf("no %q event among %q", p, evs)
			}
		}
		return nil
	})
	return evs
}

// TestSecretMissingThenCreated: a relay whose Secret does not exist waits with a condition and is
// woken by the Secret watch (the suite's WaitInterval is an hour).
func TestSecretMissingThenCreated(t *testing.T) {
	s := sharedSuite(t)
	ns := s.env.CreateNamespace(t, "nosecret")
	s.createRelay(t, newRelay(ns, "late", "late-db"))
	relay := s.waitCondition(t, ns, "late", v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound)
	if c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionMigrationsApplied); !strings.Contains(c.Message, `Secret "late-db" not found`) {
		t.Errorf("message %q", c.Message)
	}
	if relay.Status.ObservedGeneration != 0 {
		t.Errorf("observedGeneration %d moved on a failed pass", relay.Status.ObservedGeneration)
	}
	var deps appsv1.DeploymentList
	if err := s.c.List(testCtx(t), &deps, client.InNamespace(ns)); err != nil || len(deps.Items) != 0 {
		t.Fatalf("deployments %d, err %v", len(deps.Items), err)
	}

	// A Secret without the key.
	s.createSecret(t, ns, "late-db", map[string]string{"dsn": "x"})
	s.waitCondition(t, ns, "late", v1alpha1.ConditionMigrationsApplied, metav1.ConditionFalse, v1alpha1.ReasonSecretKeyMissing)

	// The right key.
	url := pgtest.NewDatabase(t)
	sec := &corev1.Secret{}
	if err := s.c.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: "late-db"}, sec); err != nil {
		t.Fatal(err)
	}
	sec.Data["url"] = []byte(url)
	if err := s.c.Update(testCtx(t), sec); err != nil {
		t.Fatal(err)
	}
	s.waitCondition(t, ns, "late", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
	s.deployment(t, ns, "late-shard-0")
}

// TestDatabaseUnreachableLeaksNoSecret points a relay at a closed port with a password in the URL:
// a False condition with a reason, retries, and the password nowhere in status, events or logs.
func TestDatabaseUnreachableLeaksNoSecret(t *testing.T) {
	s := sharedSuite(t)
	ns := s.env.CreateNamespace(t, "unreachable")
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	const password = "Sup3r-S3cret-pw"
	url := fmt.Sprintf("postgres://outbox:%s@127.0.0.1:%d/shop?sslmode=disable&connect_timeout=2", password, port)
	s.createSecret(t, ns, "down-db", map[string]string{"url": url})
	s.createRelay(t, newRelay(ns, "down", "down-db"))
	relay := s.waitCondition(t, ns, "down", v1alpha1.ConditionMigrationsApplied, metav1.ConditionFalse, v1alpha1.ReasonDatabaseUnreachable)
	c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionMigrationsApplied)
	if !strings.Contains(c.Message, "connection refused") {
		t.Errorf("message %q does not say why", c.Message)
	}
	if ready := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionReady); ready.Reason != v1alpha1.ReasonDatabaseUnreachable {
		t.Errorf("Ready reason %q", ready.Reason)
	}
	// Retries happen (with backoff); none leaks.
	eventually(t, 30*time.Second, func() error {
		n := 0
		for _, line := range strings.Split(s.logs.String(), "\n") {
			if strings.Contains(line, "Reconciler error") && strings.Contains(line, ns) {
				n++
			}
		}
		if n < 2 {
			return fmt.Errorf("%d reconcile errors logged for the relay, want at least 2", n)
		}
		return nil
	})
	relay = s.getRelay(t, ns, "down")
	evs := s.eventsFor(t, ns, "down")
	everything := fmt.Sprintf("%+v\n%q\n%s", relay.Status, evs, s.logs.String())
	for _, secret := range []string{password, url, "outbox:" + password} {
		if strings.Contains(everything, secret) {
			t.Fatalf("%q leaked into status, events or logs", secret)
		}
	}
	if !strings.Contains(s.logs.String(), "cannot reach the database") {
		t.Errorf("the reconcile error was not logged")
	}
}

// TestTableConflict: an OutboxRelay whose Secret comes to point at a table another, older relay
// already relays is refused and its relay Deployments go; one on another table of the same
// database is fine.
func TestTableConflict(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	ns1 := s.env.CreateNamespace(t, "conflict-a")
	ns2 := s.env.CreateNamespace(t, "conflict-b")
	urlA, urlB := pgtest.NewDatabase(t), pgtest.NewDatabase(t)
	s.createSecret(t, ns1, "db", map[string]string{"url": urlA})
	s.createSecret(t, ns2, "db", map[string]string{"url": urlB})
	s.createRelay(t, newRelay(ns1, "first", "db"))
	first := s.waitCondition(t, ns1, "first", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
	// creationTimestamp has second resolution; on a tie namespace/name decides, and conflict-a-N
	// sorts before conflict-b-M, so "first" is the older either way.
	s.createRelay(t, newRelay(ns2, "second", "db"))
	s.createRelay(t, newRelay(ns2, "other-table", "db", func(r *v1alpha1.OutboxRelay) { r.Spec.Database.Table = "billing.outbox" }))
	second := s.waitCondition(t, ns2, "second", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
	s.deployment(t, ns2, "second-shard-0")
	if first.Status.TableID == "" || first.Status.TableID == second.Status.TableID {
		t.Fatalf("tableIDs %q and %q on different databases", first.Status.TableID, second.Status.TableID)
	}

	// The second relay's Secret now names the first one's database (spelled differently).
	sec := &corev1.Secret{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns2, Name: "db"}, sec); err != nil {
		t.Fatal(err)
	}
	sec.Data["url"] = []byte(urlA + "&application_name=second")
	if err := s.c.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	second = s.waitCondition(t, ns2, "second", v1alpha1.ConditionMigrationsApplied, metav1.ConditionFalse, v1alpha1.ReasonTableConflict)
	c := meta.FindStatusCondition(second.Status.Conditions, v1alpha1.ConditionMigrationsApplied)
	if !strings.Contains(c.Message, ns1+"/first") || !strings.Contains(c.Message, "public.outbox") || strings.Contains(c.Message, "127.0.0.1") {
		t.Errorf("message %q", c.Message)
	}
	if second.Status.TableID != first.Status.TableID {
		t.Errorf("tableID %q, want the first relay's %q", second.Status.TableID, first.Status.TableID)
	}
	s.waitEvents(t, ns2, "second", "Warning TableConflict")
	eventually(t, 30*time.Second, func() error {
		err := s.c.Get(ctx, client.ObjectKey{Namespace: ns2, Name: "second-shard-0"}, &appsv1.Deployment{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("the refused relay keeps its Deployment (%w)", err)
	})
	// Another table of the same database is no conflict.
	s.waitCondition(t, ns2, "other-table", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
	s.deployment(t, ns2, "other-table-shard-0")
	// The first one is unaffected.
	s.waitCondition(t, ns1, "first", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
	s.deployment(t, ns1, "first-shard-0")
}

// TestForeignDeploymentIsNotAdopted: a Deployment with a relay's name that the relay does not
// control is left alone, with a condition and a Warning event.
func TestForeignDeploymentIsNotAdopted(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	ns := s.env.CreateNamespace(t, "foreign")
	labels := map[string]string{"app": "someone-else"}
	foreign := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing-shard-0", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app:1"}}}},
		},
	}
	if err := s.c.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	s.createSecret(t, ns, "db", map[string]string{"url": pgtest.NewDatabase(t)})
	s.createRelay(t, newRelay(ns, "billing", "db"))
	s.waitCondition(t, ns, "billing", v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonDeploymentNotOwned)
	s.waitEvents(t, ns, "billing", "Warning DeploymentNotOwned")
	got := s.deployment(t, ns, "billing-shard-0")
	if len(got.OwnerReferences) != 0 || got.Spec.Template.Spec.Containers[0].Image != "example.invalid/app:1" || got.ResourceVersion != foreign.ResourceVersion {
		t.Errorf("foreign Deployment changed: owners %v image %s rv %s->%s", got.OwnerReferences,
			got.Spec.Template.Spec.Containers[0].Image, foreign.ResourceVersion, got.ResourceVersion)
	}
}

// TestKubectlWaitForReady runs `kubectl wait --for=condition=Ready` against the API server while the
// relay becomes Ready.
func TestKubectlWaitForReady(t *testing.T) {
	s := sharedSuite(t)
	ns := s.env.CreateNamespace(t, "kubectl")
	s.createSecret(t, ns, "db", map[string]string{"url": pgtest.NewDatabase(t)})
	s.createRelay(t, newRelay(ns, "waited", "db"))
	s.deployment(t, ns, "waited-shard-0")

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := s.env.Kubectl(t, ctx, "wait", "--for=condition=Ready", "--timeout=60s", "-n", ns, "outboxrelay/waited")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("kubectl wait returned before the relay was Ready: %v\n%s", err, out.String())
	case <-time.After(2 * time.Second):
	}
	s.markAvailable(t, ns, "waited-shard-0")
	if err := <-done; err != nil {
		t.Fatalf("kubectl wait: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "condition met") {
		t.Errorf("kubectl wait said %q", out.String())
	}

	// The printer columns and the short name work too.
	get := s.env.Kubectl(t, ctx, "get", "obr", "-n", ns, "-o", "wide")
	b, err := get.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get obr: %v\n%s", err, b)
	}
	for _, col := range []string{"READY", "REASON", "SHARDS", "PENDING", "LAG", "AGE", "waited", "True"} {
		if !strings.Contains(string(b), col) {
			t.Errorf("kubectl get obr -o wide lacks %q:\n%s", col, b)
		}
	}
	t.Logf("kubectl get obr -o wide:\n%s", b)
}

// TestKafkaSecretMissing: wrong Kafka settings (a SASL Secret that is missing, then lacks a key)
// hold the relays back with a condition, while the database side proceeds.
func TestKafkaSecretMissing(t *testing.T) {
	s := sharedSuite(t)
	ns := s.env.CreateNamespace(t, "kafkasecret")
	s.createSecret(t, ns, "db", map[string]string{"url": pgtest.NewDatabase(t)})
	s.createRelay(t, newRelay(ns, "sasl", "db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: v1alpha1.SASLPlain, SecretRef: v1alpha1.SASLSecretRef{Name: "kafka-user"},
			Plaintext: v1alpha1.SASLPlaintextAllowed}
	}))
	relay := s.waitCondition(t, ns, "sasl", v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound)
	if c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionRelaysAvailable); c.Message != `Kafka settings: Secret "kafka-user" not found` {
		t.Errorf("message %q", c.Message)
	}
	if c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionMigrationsApplied); c.Status != metav1.ConditionTrue {
		t.Errorf("MigrationsApplied %s", c.Status)
	}
	if err := s.c.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: "sasl-shard-0"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Deployment without its Kafka Secret: %v", err)
	}
	sec := s.createSecret(t, ns, "kafka-user", map[string]string{"username": "relay"})
	s.waitCondition(t, ns, "sasl", v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonSecretKeyMissing)
	sec.StringData = map[string]string{"password": "pw"}
	if err := s.c.Update(testCtx(t), sec); err != nil {
		t.Fatal(err)
	}
	s.deployment(t, ns, "sasl-shard-0")
	s.waitCondition(t, ns, "sasl", v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonRelaysUnavailable)
}

// TestTableClaimIsPostgreSQLsWord: which OutboxRelay relays a table is decided by what PostgreSQL
// says once a relay's own credentials got in, not by the URLs in Secrets. An older OutboxRelay
// whose Secret names the database with credentials that do not get in claims nothing (the old
// check, which compared URLs, let it take the table from the relay that can reach it); and one
// that names the same database by another host name ("localhost" for 127.0.0.1) is refused (the
// old check let it through, and two relays of one table would have started).
func TestTableClaimIsPostgreSQLsWord(t *testing.T) {
	s := sharedSuite(t)
	ns := s.env.CreateNamespace(t, "claim")
	dbURL := pgtest.NewDatabase(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	intruder := *u
	intruder.User = url.User("intruder") // no such role: the connection is refused
	s.createSecret(t, ns, "intruder-db", map[string]string{"url": intruder.String()})
	// Names decide between OutboxRelays created in the same second: "a-..." is the older.
	s.createRelay(t, newRelay(ns, "a-intruder", "intruder-db"))
	s.waitCondition(t, ns, "a-intruder", v1alpha1.ConditionMigrationsApplied, metav1.ConditionFalse, v1alpha1.ReasonDatabaseUnreachable)

	s.createSecret(t, ns, "db", map[string]string{"url": dbURL})
	s.createRelay(t, newRelay(ns, "owner", "db"))
	owner := s.waitCondition(t, ns, "owner", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
	s.deployment(t, ns, "owner-shard-0")

	alias := *u
	alias.Host = strings.Replace(u.Host, "127.0.0.1", "localhost", 1)
	s.createSecret(t, ns, "alias-db", map[string]string{"url": alias.String()})
	s.createRelay(t, newRelay(ns, "z-alias", "alias-db"))
	refused := s.waitCondition(t, ns, "z-alias", v1alpha1.ConditionMigrationsApplied, metav1.ConditionFalse, v1alpha1.ReasonTableConflict)
	if c := meta.FindStatusCondition(refused.Status.Conditions, v1alpha1.ConditionMigrationsApplied); !strings.Contains(c.Message, ns+"/owner") {
		t.Errorf("message %q", c.Message)
	}
	if refused.Status.TableID != owner.Status.TableID {
		t.Errorf("tableID %q, want the owner's %q", refused.Status.TableID, owner.Status.TableID)
	}
	if got := s.getRelay(t, ns, "a-intruder").Status.TableID; got != "" {
		t.Errorf("the relay that cannot get in claimed table %q", got)
	}
	s.waitCondition(t, ns, "owner", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
}

// TestSchemaRegistrySettings: a schemas ConfigMap that is missing holds the relays back with a
// condition naming it; once it exists the relays start with it mounted, and a change of a schema
// in it (which the relays read when they start) rolls them: the pod template's hash changes.
func TestSchemaRegistrySettings(t *testing.T) {
	s := sharedSuite(t)
	ns := s.env.CreateNamespace(t, "schemas")
	s.createSecret(t, ns, "db", map[string]string{"url": pgtest.NewDatabase(t)})
	s.createRelay(t, newRelay(ns, "framed", "db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Publish.SchemaRegistry = &v1alpha1.SchemaRegistrySpec{URL: "http://registry:8081", Format: v1alpha1.SchemaAvro,
			SchemasConfigMapRef: &v1alpha1.ConfigMapRef{Name: "shop-schemas"}}
	}))
	relay := s.waitCondition(t, ns, "framed", v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonConfigMapNotFound)
	if c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionRelaysAvailable); c.Message != `schema registry settings: ConfigMap "shop-schemas" not found` {
		t.Errorf("message %q", c.Message)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shop-schemas"},
		Data: map[string]string{"OrderPlaced.avsc": `{"type": "record", "name": "OrderPlaced", "fields": []}`}}
	if err := s.c.Create(testCtx(t), cm); err != nil {
		t.Fatal(err)
	}
	d := s.deployment(t, ns, "framed-shard-0")
	before := d.Spec.Template.Annotations[AnnotationSecretHash]
	var mounted bool
	for _, v := range d.Spec.Template.Spec.Volumes {
		mounted = mounted || v.ConfigMap != nil && v.ConfigMap.Name == "shop-schemas"
	}
	if !mounted || before == "" {
		t.Fatalf("the relays' pods do not mount the schemas (volumes %+v) or carry no hash", d.Spec.Template.Spec.Volumes)
	}
	cm.Data["OrderPlaced.avsc"] = `{"type": "record", "name": "OrderPlaced", "fields": [{"name": "id", "type": "string"}]}`
	if err := s.c.Update(testCtx(t), cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if err := s.c.Get(testCtx(t), client.ObjectKeyFromObject(d), d); err != nil {
			return err
		}
		if d.Spec.Template.Annotations[AnnotationSecretHash] == before {
			return fmt.Errorf("the pod template's hash did not change with the schemas")
		}
		return nil
	})
}
