package controllers

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	relaypkg "github.com/outbox-operator/outbox-operator/relay"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
	"github.com/outbox-operator/outbox-operator/test/roletest"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// TestRelayDeploymentDatabaseURLSource: OUTBOX_DATABASE_URL comes from spec.relay.databaseSecretRef
// when it is set, else from spec.database.secretRef, default key "url" either way, always as a
// secretKeyRef and never as a value.
func TestRelayDeploymentDatabaseURLSource(t *testing.T) {
	tests := map[string]struct {
		db, relayDB *v1alpha1.DatabaseSecretRef
		want        [2]string // Secret, key
	}{
		"the operator's Secret":                {db: &v1alpha1.DatabaseSecretRef{Name: "shop-db", Key: "dsn"}, want: [2]string{"shop-db", "dsn"}},
		"the operator's Secret, default key":   {db: &v1alpha1.DatabaseSecretRef{Name: "shop-db"}, want: [2]string{"shop-db", "url"}},
		"the relays' own Secret":               {relayDB: &v1alpha1.DatabaseSecretRef{Name: "shop-relay-db", Key: "relay"}, want: [2]string{"shop-relay-db", "relay"}},
		"the relays' own Secret, default key":  {relayDB: &v1alpha1.DatabaseSecretRef{Name: "shop-relay-db"}, want: [2]string{"shop-relay-db", "url"}},
		"another key of the operator's Secret": {relayDB: &v1alpha1.DatabaseSecretRef{Name: "shop-db", Key: "relay"}, want: [2]string{"shop-db", "relay"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			relay := testRelay(func(r *v1alpha1.OutboxRelay) {
				if tc.db != nil {
					r.Spec.Database.SecretRef = *tc.db
				}
				r.Spec.Relay.DatabaseSecretRef = tc.relayDB
			})
			c := build(t, relay, 0, "h").Spec.Template.Spec.Containers[0]
			var found []corev1.EnvVar
			for _, e := range c.Env {
				if e.Name == envDatabaseURL {
					found = append(found, e)
				}
			}
			if len(found) != 1 {
				t.Fatalf("%d %s variables: %+v", len(found), envDatabaseURL, found)
			}
			e := found[0]
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.FieldRef != nil {
				t.Fatalf("%s is not only a secretKeyRef: %+v", envDatabaseURL, e)
			}
			if got := [2]string{e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key}; got != tc.want {
				t.Errorf("%s from %v, want %v", envDatabaseURL, got, tc.want)
			}
			// Both Secrets are watched: a change of either brings a pass.
			refs := secretRefsOf(relay)
			for _, name := range []string{string(relay.Spec.Database.SecretRef.Name), tc.want[0]} {
				if !slices.Contains(refs, name) {
					t.Errorf("secretRefsOf = %v lacks %q", refs, name)
				}
			}
		})
	}
}

// TestCheckRelayDatabase runs the loadDatabase step and the check of the relays' own URL against
// a real PostgreSQL, with the Secrets in a fake API: what the relays' pod template hash covers,
// the condition and the error, and that no URL or password reaches either.
func TestCheckRelayDatabase(t *testing.T) {
	ctx := context.Background()
	ownerURL, otherURL := pgtest.NewDatabase(t), pgtest.NewDatabase(t)
	u, err := url.Parse(ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	const password = "Relay-S3cret-pw"
	// The same database by another host name, as another user spelling (trust authentication
	// ignores the password).
	alias := *u
	alias.Host = strings.Replace(u.Host, "127.0.0.1", "localhost", 1)
	alias.User = url.UserPassword(u.User.Username(), password)
	other, err := url.Parse(otherURL)
	if err != nil {
		t.Fatal(err)
	}
	other.User = url.UserPassword(u.User.Username(), password)
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	down := fmt.Sprintf("postgres://outbox_relay:%s@127.0.0.1:%d/shop?sslmode=disable&connect_timeout=2", password, port)
	notURL := "postgres://outbox_relay:" + password + "@db:notaport/shop"
	secrets := []string{password, alias.String(), other.String(), down, notURL, ownerURL}

	relayDB := &v1alpha1.DatabaseSecretRef{Name: "relay-db"}
	tests := map[string]struct {
		relayDB     *v1alpha1.DatabaseSecretRef
		data        map[string]string // the relay Secret's data; nil: no such Secret
		wantErr     string            // "" none, "wait" errWait, else a part of the error
		wantReason  string            // RelaysAvailable's reason, "" for no condition
		wantMessage string            // a part of its message
		wantHashed  []string
		wantOpens   int32
	}{
		"unset: the operator's URL": {wantHashed: []string{"shop-db/url"}},
		"Secret missing": {relayDB: relayDB, wantErr: "wait",
			wantReason: v1alpha1.ReasonSecretNotFound, wantMessage: `relay database: Secret "relay-db" not found`},
		"key missing": {relayDB: relayDB, data: map[string]string{"dsn": alias.String()}, wantErr: "wait",
			wantReason: v1alpha1.ReasonSecretKeyMissing, wantMessage: `relay database: Secret "relay-db" has no key "url"`},
		"not a libpq URL": {relayDB: relayDB, data: map[string]string{"url": notURL}, wantErr: "wait",
			wantReason:  v1alpha1.ReasonInvalidDatabaseURL,
			wantMessage: `relay database: Secret "relay-db" key "url": the value is not a valid libpq URL`},
		"the operator's URL in the relays' Secret": {relayDB: relayDB, data: map[string]string{"url": ownerURL},
			wantHashed: []string{"relay-db/url"}},
		"another spelling of the same database": {relayDB: relayDB, data: map[string]string{"url": alias.String()},
			wantHashed: []string{"relay-db/url"}, wantOpens: 1},
		"another key of the operator's Secret": {relayDB: &v1alpha1.DatabaseSecretRef{Name: "shop-db", Key: "relay"},
			wantHashed: []string{"shop-db/relay"}, wantOpens: 1},
		"another database": {relayDB: relayDB, data: map[string]string{"url": other.String()}, wantErr: "wait",
			wantReason:  v1alpha1.ReasonInvalidDatabaseURL,
			wantMessage: `relay database: Secret "relay-db" key "url" names another database than spec.database.secretRef`, wantOpens: 1},
		"unreachable": {relayDB: relayDB, data: map[string]string{"url": down}, wantErr: "cannot connect with it",
			wantReason:  v1alpha1.ReasonDatabaseUnreachable,
			wantMessage: `relay database: Secret "relay-db" key "url": cannot connect with it: `, wantOpens: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			objs := []client.Object{&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "shop-db"},
				Data: map[string][]byte{"url": []byte(ownerURL), "relay": []byte(alias.String())}}}
			if tc.data != nil {
				sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "relay-db"}, Data: map[string][]byte{}}
				for k, v := range tc.data {
					sec.Data[k] = []byte(v)
				}
				objs = append(objs, sec)
			}
			var opens atomic.Int32
			r := &OutboxRelayReconciler{APIReader: fake.NewClientBuilder().WithObjects(objs...).Build(),
				OpenDB: func(ctx context.Context, url string) (*sql.DB, error) { opens.Add(1); return OpenDB(ctx, url) }}
			t.Cleanup(r.relays.closeAll)
			relay := testRelay(func(r *v1alpha1.OutboxRelay) { r.Spec.Relay.DatabaseSecretRef = tc.relayDB })
			s := &scope{relay: relay, before: relay.DeepCopy(), secretValues: map[string][]byte{}}
			if _, err := r.loadDatabase(ctx, s); err != nil {
				t.Fatalf("loadDatabase: %v", err)
			}
			if _, err := r.connectDatabase(ctx, s); err != nil {
				t.Fatalf("connectDatabase: %v", err)
			}
			opens.Store(0) // the operator's own handle

			err := r.checkRelayDatabase(ctx, s)
			switch {
			case tc.wantErr == "" && err != nil, tc.wantErr == "wait" && !errors.Is(err, errWait):
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			case tc.wantErr != "" && tc.wantErr != "wait" && (err == nil || errors.Is(err, errWait) || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
			}
			c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionRelaysAvailable)
			switch {
			case tc.wantReason == "" && c != nil:
				t.Errorf("condition %+v, want none (ensureDeployments sets it)", c)
			case tc.wantReason != "" && (c == nil || c.Status != metav1.ConditionFalse || c.Reason != tc.wantReason ||
				!strings.HasPrefix(c.Message, tc.wantMessage)):
				t.Errorf("RelaysAvailable %+v, want False/%s starting %q", c, tc.wantReason, tc.wantMessage)
			}
			if c != nil {
				t.Logf("RelaysAvailable %s: %s", c.Reason, c.Message)
			}
			if tc.wantErr == "" {
				var hashed []string
				for k := range s.secretValues {
					hashed = append(hashed, k)
				}
				if slices.Sort(hashed); !slices.Equal(hashed, tc.wantHashed) {
					t.Errorf("the pod template hash covers %v, want %v", hashed, tc.wantHashed)
				}
			}
			if got := opens.Load(); got != tc.wantOpens {
				t.Errorf("%d connections with the relays' URL, want %d", got, tc.wantOpens)
			}
			everything := fmt.Sprint(err)
			if c != nil {
				everything += c.Message
			}
			for _, secret := range secrets {
				if strings.Contains(everything, secret) {
					t.Errorf("%q leaked into %q", secret, everything)
				}
			}
		})
	}
}

// TestCheckRelayDatabaseOncePerURL: a URL found to name the table's database is not checked again
// until its value changes; one that names another database is checked on every pass (until it is
// fixed, a pass does not roll the relays).
func TestCheckRelayDatabaseOncePerURL(t *testing.T) {
	ctx := context.Background()
	ownerURL, otherURL := pgtest.NewDatabase(t), pgtest.NewDatabase(t)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "relay-db"},
		Data: map[string][]byte{"url": []byte(ownerURL + "&application_name=relay")}}
	reader := fake.NewClientBuilder().WithObjects(sec,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "shop-db"}, Data: map[string][]byte{"url": []byte(ownerURL)}}).Build()
	var opens atomic.Int32
	r := &OutboxRelayReconciler{APIReader: reader,
		OpenDB: func(ctx context.Context, url string) (*sql.DB, error) { opens.Add(1); return OpenDB(ctx, url) }}
	t.Cleanup(r.relays.closeAll)
	relay := testRelay(func(r *v1alpha1.OutboxRelay) {
		r.Spec.Relay.DatabaseSecretRef = &v1alpha1.DatabaseSecretRef{Name: "relay-db"}
	})
	pass := func(wantErr error, wantOpens int32) string {
		t.Helper()
		s := &scope{relay: relay, before: relay.DeepCopy(), secretValues: map[string][]byte{}}
		if _, err := r.loadDatabase(ctx, s); err != nil {
			t.Fatal(err)
		}
		if _, err := r.connectDatabase(ctx, s); err != nil {
			t.Fatal(err)
		}
		before := opens.Load()
		if err := r.checkRelayDatabase(ctx, s); !errors.Is(err, wantErr) {
			t.Fatalf("error %v, want %v", err, wantErr)
		}
		if got := opens.Load() - before; got != wantOpens {
			t.Fatalf("%d connections with the relays' URL in this pass, want %d", got, wantOpens)
		}
		return secretHash(s.secretValues)
	}
	set := func(v string) {
		t.Helper()
		sec.Data["url"] = []byte(v)
		if err := reader.Update(ctx, sec); err != nil {
			t.Fatal(err)
		}
	}
	h1 := pass(nil, 1)
	if pass(nil, 0) != h1 {
		t.Fatal("the hash moved without a change")
	}
	set(ownerURL + "&application_name=rotated")
	h2 := pass(nil, 1)
	if h2 == h1 {
		t.Fatal("a changed relay URL leaves the hash as it was: the relays would not roll")
	}
	pass(nil, 0)
	set(otherURL)
	pass(errWait, 1)
	pass(errWait, 1)
}

// TestRelayDatabaseSecret: with spec.relay.databaseSecretRef the relay Deployments take their URL
// from that Secret, while the operator keeps working with spec.database.secretRef: a missing
// relay Secret or key holds the relays back with RelaysAvailable False (and no Deployment), a
// change of the relay Secret's value rolls the relay pods, a value naming another database is
// refused (the pods are not rolled onto it), and no URL or password reaches status, events or logs.
func TestRelayDatabaseSecret(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	ns := s.env.CreateNamespace(t, "relaydb")
	ownerURL, otherURL := pgtest.NewDatabase(t), pgtest.NewDatabase(t)
	u, err := url.Parse(ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	const password = "Relay-S3cret-pw"
	relayURL := *u
	relayURL.Host = strings.Replace(u.Host, "127.0.0.1", "localhost", 1) // another spelling of the same database
	relayURL.User = url.UserPassword(u.User.Username(), password)
	s.createSecret(t, ns, "db", map[string]string{"url": ownerURL})
	s.createRelay(t, newRelay(ns, "orders", "db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Relay.DatabaseSecretRef = &v1alpha1.DatabaseSecretRef{Name: "relay-db"}
	}))

	relay := s.waitCondition(t, ns, "orders", v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound)
	if c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionRelaysAvailable); c.Message != `relay database: Secret "relay-db" not found` {
		t.Errorf("message %q", c.Message)
	}
	if c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionMigrationsApplied); c.Status != metav1.ConditionTrue {
		t.Errorf("MigrationsApplied %s %s: the operator's own steps do not need the relays' Secret", c.Status, c.Message)
	}
	if r := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionReady); r.Reason != v1alpha1.ReasonSecretNotFound {
		t.Errorf("Ready reason %q", r.Reason)
	}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "orders-shard-0"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Deployment without its relay Secret: %v", err)
	}

	sec := s.createSecret(t, ns, "relay-db", map[string]string{"dsn": relayURL.String()})
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonSecretKeyMissing)
	setURL := func(v string) {
		t.Helper()
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(sec), sec); err != nil {
			t.Fatal(err)
		}
		sec.Data["url"] = []byte(v)
		if err := s.c.Update(ctx, sec); err != nil {
			t.Fatal(err)
		}
	}
	setURL(relayURL.String())
	d := s.deployment(t, ns, "orders-shard-0")
	env := envByName(d.Spec.Template.Spec.Containers[0])[envDatabaseURL]
	if env.Value != "" || env.ValueFrom == nil || env.ValueFrom.SecretKeyRef == nil ||
		env.ValueFrom.SecretKeyRef.Name != "relay-db" || env.ValueFrom.SecretKeyRef.Key != "url" {
		t.Fatalf("%s %+v, want the relay Secret's key url", envDatabaseURL, env)
	}
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonRelaysUnavailable)
	hash := d.Spec.Template.Annotations[AnnotationSecretHash]

	// A new value of the relay Secret rolls the relay pods.
	rotated := relayURL
	rotated.RawQuery += "&application_name=rotated"
	setURL(rotated.String())
	eventually(t, 30*time.Second, func() error {
		if h := s.deployment(t, ns, "orders-shard-0").Spec.Template.Annotations[AnnotationSecretHash]; h == hash {
			return fmt.Errorf("secret hash unchanged: %s", h)
		}
		return nil
	})
	hash = s.deployment(t, ns, "orders-shard-0").Spec.Template.Annotations[AnnotationSecretHash]

	// Another database: refused, and the pods stay on the last URL found right.
	otherU, err := url.Parse(otherURL)
	if err != nil {
		t.Fatal(err)
	}
	otherU.User = url.UserPassword(u.User.Username(), password)
	setURL(otherU.String())
	relay = s.waitCondition(t, ns, "orders", v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonInvalidDatabaseURL)
	c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionRelaysAvailable)
	if !strings.Contains(c.Message, `Secret "relay-db" key "url" names another database than spec.database.secretRef`) ||
		!strings.Contains(c.Message, "table public.outbox") {
		t.Errorf("message %q", c.Message)
	}
	t.Logf("RelaysAvailable: %s", c.Message)
	if h := s.deployment(t, ns, "orders-shard-0").Spec.Template.Annotations[AnnotationSecretHash]; h != hash {
		t.Errorf("the relays were rolled onto another database's URL")
	}
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)

	// The relay Secret deleted: reported; the Deployment is left as it is.
	if err := s.c.Delete(ctx, sec); err != nil {
		t.Fatal(err)
	}
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionRelaysAvailable, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound)
	if h := s.deployment(t, ns, "orders-shard-0").Spec.Template.Annotations[AnnotationSecretHash]; h != hash {
		t.Errorf("the Deployment changed while its relay Secret is missing")
	}

	relay = s.getRelay(t, ns, "orders")
	everything := fmt.Sprintf("%+v\n%q\n%s", relay.Status, s.eventsFor(t, ns, "orders"), s.logs.String())
	for _, secret := range []string{password, relayURL.String(), rotated.String(), otherU.String(), ownerURL, otherURL} {
		if strings.Contains(everything, secret) {
			t.Fatalf("%q leaked into status, events or logs", secret)
		}
	}
}

// TestRelaysRunAsTheRelayRole: the relays run as the least-privilege relay role of
// outboxdb.GrantSQL under the operator. Every role holds only what the script grants
// (test/roletest); the operator's Secret is the owner's URL, the relays' Secret the relay role's.
// The operator migrates and keeps the partitions as the owner, and grants the relay role the
// relay's share of the owner's part of the script (outboxdb.RelayGrants) itself; a relay run from
// its Deployment as a pod would run it (its args, its environment resolved from the Secrets it
// names) connects as the relay role and publishes without anyone running the owner's part. The
// writer role, which the operator does not know, may append only once the owner's part ran.
func TestRelaysRunAsTheRelayRole(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	table := outboxdb.MustParseTable("public.outbox")
	rdb := roletest.New(t, table, nil)
	k := kafkatest.NewKfake(t)

	ns := s.env.CreateNamespace(t, "relayrole")
	s.createSecret(t, ns, "owner-db", map[string]string{"url": rdb.URL(rdb.Roles.Owner)})
	s.createSecret(t, ns, "relay-db", map[string]string{"url": rdb.URL(rdb.Roles.Relay)})
	brokers := make([]v1alpha1.Broker, len(k.Brokers))
	for i, b := range k.Brokers {
		brokers[i] = v1alpha1.Broker(b)
	}
	s.createRelay(t, newRelay(ns, "orders", "owner-db", func(r *v1alpha1.OutboxRelay) {
		r.Spec.Relay.DatabaseSecretRef = &v1alpha1.DatabaseSecretRef{Name: "relay-db"}
		r.Spec.Kafka.Brokers = brokers
		r.Spec.Topics = nil
		r.Spec.DefaultTopic = "test.events"
	}))
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionPartitionsReady, metav1.ConditionTrue, v1alpha1.ReasonPartitionsReady)
	rdb.CheckRoles(t)

	cfg := s.podConfig(t, s.deployment(t, ns, "orders-shard-0"))
	if got, err := url.Parse(cfg.DatabaseURL); err != nil || got.User.Username() != rdb.Roles.Relay {
		t.Fatalf("the relay pod connects as %v (%v), want the relay role %s", got.User, err, rdb.Roles.Relay)
	}
	cfg.HTTPAddr = ""
	cfg.StatsInterval = time.Second
	r, err := relaypkg.New(cfg, relaypkg.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	f := &follower{Relay: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		_ = r.Run(rctx)
	}()
	t.Cleanup(f.stop)
	s.podsFollow(t, ns, "orders", []*follower{f})

	w, err := outbox.New(table.String())
	if err != nil {
		t.Fatal(err)
	}
	events := func(from, n int) []outbox.Event {
		var evs []outbox.Event
		for i := from; i < from+n; i++ {
			p, _ := json.Marshal(map[string]int{"n": i})
			evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i), EventType: "created", Payload: p})
		}
		return evs
	}
	// Before the owner's part: the writer role may not append; the relay role, granted by the
	// operator, publishes what another role appended.
	if err := seqtest.AppendEvents(ctx, rdb.Pool(t, rdb.Roles.Writer), w, events(0, 1)); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("the writer role appended before the owner's grants: %v", err)
	}
	if err := seqtest.AppendEvents(ctx, rdb.Pool(t, roletest.Admin), w, events(0, 3)); err != nil {
		t.Fatal(err)
	}
	consumer := k.NewConsumer(t, "test.events")
	recs := consumer.ReadN(t, 3, time.Minute)
	event := false
	for _, e := range s.eventsFor(t, ns, "orders") {
		event = event || strings.HasPrefix(e, "Normal "+v1alpha1.ReasonGrantedRelayRole+" Granted role \""+rdb.Roles.Relay+"\"")
	}
	if !event {
		t.Errorf("no %s event: %q", v1alpha1.ReasonGrantedRelayRole, s.eventsFor(t, ns, "orders"))
	}
	// What the operator granted is the script's share for the relay, no more and no less: the
	// owner's part, run now, adds nothing to the relay role's privileges (the catalog's ACLs).
	granted := relayACL(t, rdb)
	rdb.GrantAsOwner(t)
	if after := relayACL(t, rdb); len(granted) < 10 || !slices.Equal(granted, after) {
		t.Errorf("the relay role's privileges: granted by the operator %q, after the owner's part %q", granted, after)
	}
	rdb.CheckRoles(t)
	if err := seqtest.AppendEvents(ctx, rdb.Pool(t, rdb.Roles.Writer), w, events(3, 2)); err != nil {
		t.Fatalf("outbox.Append as the writer role: %v", err)
	}
	recs = append(recs, consumer.ReadN(t, 2, time.Minute)...)
	var keys []string
	for _, rec := range recs {
		keys = append(keys, rec.Key)
	}
	slices.Sort(keys)
	if want := []string{"o-0", "o-1", "o-2", "o-3", "o-4"}; !slices.Equal(keys, want) {
		t.Errorf("published %v, want %v", keys, want)
	}
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionRelaysAvailable, metav1.ConditionTrue, v1alpha1.ReasonRelaysAvailable)
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReady)
	eventually(t, 30*time.Second, func() error { // the relay role marked them sent
		if p := ptr.Deref(s.getRelay(t, ns, "orders").Status.PendingEvents, -1); p != 0 {
			return fmt.Errorf("pending %d after publishing", p)
		}
		return nil
	})
	var sessions int
	if err := rdb.SQL(t, roletest.Admin).QueryRowContext(ctx,
		`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND usename = $1`, rdb.Roles.Relay).Scan(&sessions); err != nil || sessions == 0 {
		t.Errorf("%d sessions of the relay role (%v)", sessions, err)
	}
}

// relayACL lists the relay role's privileges on the objects of rdb's schema (tables, sequences,
// columns, functions), as the catalog's access control lists hold them.
func relayACL(t *testing.T, rdb *roletest.DB) []string {
	t.Helper()
	rows, err := rdb.SQL(t, roletest.Admin).QueryContext(testCtx(t), `
SELECT c.relname || ' ' || a.privilege_type FROM pg_class AS c, aclexplode(c.relacl) AS a
WHERE c.relnamespace = $1::regnamespace AND a.grantee = $2::regrole
UNION ALL
SELECT c.relname || '.' || at.attname || ' ' || a.privilege_type FROM pg_attribute AS at JOIN pg_class AS c ON c.oid = at.attrelid, aclexplode(at.attacl) AS a
WHERE c.relnamespace = $1::regnamespace AND a.grantee = $2::regrole
UNION ALL
SELECT p.proname || ' ' || a.privilege_type FROM pg_proc AS p, aclexplode(p.proacl) AS a
WHERE p.pronamespace = $1::regnamespace AND a.grantee = $2::regrole
ORDER BY 1`, rdb.Table.Schema, rdb.Roles.Relay)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// podConfig is the relay configuration of Deployment d's container as the kubelet would start it:
// its args, and its environment with each Secret reference resolved from the API server.
func (s *suite) podConfig(t *testing.T, d *appsv1.Deployment) relaypkg.Config {
	t.Helper()
	return containerConfig(t, d.Spec.Template.Spec.Containers[0], func(name, key string) (string, error) {
		sec := &corev1.Secret{}
		if err := s.c.Get(testCtx(t), client.ObjectKey{Namespace: d.Namespace, Name: name}, sec); err != nil {
			return "", err
		}
		v, ok := sec.Data[key]
		if !ok {
			return "", fmt.Errorf("Secret %s has no key %s", name, key)
		}
		return string(v), nil
	})
}
