package controllers

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestRetryLimiterCaps: a pass that keeps failing is retried with backoff, never more than
// MaxRetryDelay apart (controller-runtime's default grows to 16 minutes).
func TestRetryLimiterCaps(t *testing.T) {
	l := retryLimiter(MaxRetryDelay)
	item := reconcile.Request{}
	var last time.Duration
	for range 40 {
		last = l.When(item)
		if last > MaxRetryDelay {
			t.Fatalf("delay %s above %s", last, MaxRetryDelay)
		}
	}
	if last != MaxRetryDelay {
		t.Errorf("after 40 failures the delay is %s, want %s", last, MaxRetryDelay)
	}
	l.Forget(item)
	if d := l.When(item); d > time.Second {
		t.Errorf("after a success the first retry waits %s", d)
	}
}

// suiteRetryMaxDelay is the shared suite's RetryMaxDelay: short, so that an outage of half a
// minute shows the cap (TestRetryLimiterCaps checks the production value).
const suiteRetryMaxDelay = 4 * time.Second

// TestRecoveryAfterLongOutage stops an OutboxRelay's database for 30 s, long enough for an
// uncapped backoff (controller-runtime's default) to pass 10 s between retries, then starts it
// again: the operator's log shows the failed passes retried at most RetryMaxDelay apart, and the
// OutboxRelay recovers within RetryMaxDelay of the database's return, without anything else
// waking it.
func TestRecoveryAfterLongOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a 30 s outage")
	}
	s := sharedSuite(t)
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	url := srv.NewDatabase(t)
	ns := s.env.CreateNamespace(t, "recovery")
	s.createSecret(t, ns, "db", map[string]string{"url": url + "&connect_timeout=2"})
	s.createRelay(t, newRelay(ns, "orders", "db"))
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionMigrationsApplied, metav1.ConditionFalse, v1alpha1.ReasonDatabaseUnreachable)
	time.Sleep(30 * time.Second) // the outage
	if err := srv.StartAgain(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	s.waitCondition(t, ns, "orders", v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
	took := time.Since(back)

	// The failed passes, from the operator's log.
	re := regexp.MustCompile(`time=(\S+) .*Reconciler error`)
	var at []time.Time
	for _, line := range strings.Split(s.logs.String(), "\n") {
		if !strings.Contains(line, ns) {
			continue
		}
		if m := re.FindStringSubmatch(line); m != nil {
			if ts, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
				at = append(at, ts)
			}
		}
	}
	var widest time.Duration
	for i := 1; i < len(at); i++ {
		widest = max(widest, at[i].Sub(at[i-1]))
	}
	t.Logf("%d failed passes during the outage, at most %s apart; status recovered %s after the database came back",
		len(at), widest.Round(time.Millisecond), took.Round(time.Millisecond))
	if len(at) < 5 {
		t.Fatalf("%d failed passes logged: the test did not see the outage", len(at))
	}
	if widest > suiteRetryMaxDelay+2*time.Second {
		t.Errorf("failed passes %s apart, more than %s", widest, suiteRetryMaxDelay)
	}
	if took > suiteRetryMaxDelay+10*time.Second {
		t.Errorf("status recovered %s after the database came back", took)
	}
}

// TestDatabaseFailuresSayWhy: each way a database can fail an OutboxRelay gives a condition that
// says which, without the URL: a URL that does not parse, a role that does not exist, a host name
// that does not resolve, a port that accepts connections and never answers (whose connections the
// operator closes again), and a role that may not create the schema (the migrations fail).
func TestDatabaseFailuresSayWhy(t *testing.T) {
	s := sharedSuite(t)
	ctx := testCtx(t)
	good := pgtest.NewDatabase(t)
	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	with := func(f func(*url.URL)) string {
		c := *u
		f(&c)
		return c.String()
	}
	// A port that accepts and never answers, counting the connections still open.
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hole.Close() })
	var open atomic.Int32
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			open.Add(1)
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c) // until the client closes it
				open.Add(-1)
			}()
		}
	}()
	db := openTestDB(t, good)
	if _, err := db.ExecContext(ctx, `CREATE ROLE weak LOGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `REVOKE CREATE ON SCHEMA public FROM PUBLIC`); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name, url, reason, says string
	}{
		{"invalid URL", "postgres://u:pw@db:notaport/shop", v1alpha1.ReasonInvalidDatabaseURL, "not a valid libpq URL"},
		{"no such role", with(func(c *url.URL) { c.User = url.User("nobody") }), v1alpha1.ReasonDatabaseUnreachable, `role "nobody" does not exist`},
		{"host name not found", with(func(c *url.URL) { c.Host = "no-such-host.invalid:5432" }), v1alpha1.ReasonDatabaseUnreachable, "host name not found"},
		{"port never answers", with(func(c *url.URL) {
			c.Host = hole.Addr().String()
			q := c.Query()
			q.Set("connect_timeout", "2")
			c.RawQuery = q.Encode()
		}), v1alpha1.ReasonDatabaseUnreachable, "timed out"},
		{"may not create the schema", with(func(c *url.URL) { c.User = url.User("weak") }), v1alpha1.ReasonMigrationFailed, "permission denied"},
	}
	ns := s.env.CreateNamespace(t, "dbfail")
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("r%d", i)
			s.createSecret(t, ns, name, map[string]string{"url": tc.url})
			s.createRelay(t, newRelay(ns, name, name))
			relay := s.waitCondition(t, ns, name, v1alpha1.ConditionMigrationsApplied, metav1.ConditionFalse, tc.reason)
			c := meta.FindStatusCondition(relay.Status.Conditions, v1alpha1.ConditionMigrationsApplied)
			if !strings.Contains(c.Message, tc.says) {
				t.Errorf("message %q does not say %q", c.Message, tc.says)
			}
			if strings.Contains(c.Message, tc.url) || strings.Contains(c.Message, "pw@") {
				t.Errorf("message %q carries the URL", c.Message)
			}
			t.Logf("%s: %s", c.Reason, c.Message)
		})
	}
	// The operator closes the connections the silent port accepted: none stays open.
	eventually(t, 30*time.Second, func() error {
		if n := open.Load(); n != 0 {
			return fmt.Errorf("%d connections to the silent port still open", n)
		}
		return nil
	})
}
