package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"

	"github.com/outbox-operator/outbox-operator/test/pgtest"
	"github.com/outbox-operator/outbox-operator/test/seqtest"
)

// pgBouncer is a PgBouncer process in front of a pgtest server, started by the test.
type pgBouncer struct {
	Port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// pgBouncerBinary finds Debian's pgbouncer, or skips the test (hack/setup.sh installs it).
func pgBouncerBinary(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer"
	}
	t.Skip("pgbouncer is not installed (Debian package pgbouncer; make setup installs it)")
	return ""
}

// startPgBouncer starts PgBouncer on a free 127.0.0.1 port in front of srv, in the pool mode
// given, with at most poolSize server connections per database and user, and trust
// authentication for the user postgres, and PgBouncer's default server_reset_query (DISCARD ALL,
// which session pooling runs when a client leaves). It stops with the test (and with the test
// binary).
func startPgBouncer(t testing.TB, srv *pgtest.Server, mode string, poolSize int) *pgBouncer {
	t.Helper()
	bin := pgBouncerBinary(t)
	dir, err := os.MkdirTemp("", "outbox-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// PgBouncer refuses to run as root: run it as the user that runs the server then.
	cred := serverCredential(t)
	var lastErr error
	for range 3 {
		port, err := pgtest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ini := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
ignore_startup_parameters = extra_float_digits,search_path
logfile = %s
log_connections = 0
log_disconnections = 0
`, srv.Port, port, filepath.Join(dir, "userlist.txt"), mode, poolSize, filepath.Join(dir, "pgbouncer.log"))
		files := map[string]string{"pgbouncer.ini": ini, "userlist.txt": `"postgres" ""` + "\n"}
		for name, body := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if cred != nil {
			for _, p := range []string{dir, filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "userlist.txt")} {
				if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
					t.Fatal(err)
				}
			}
		}
		cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGTERM, Setpgid: true}
		out, err := os.Create(filepath.Join(dir, "stdout.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start pgbouncer: %v", err)
		}
		b := &pgBouncer{Port: port, dir: dir, cmd: cmd, done: make(chan struct{})}
		go func() { _ = cmd.Wait(); out.Close(); close(b.done) }()
		if lastErr = b.waitReady(srv); lastErr == nil {
			t.Cleanup(b.stop)
			return b
		}
		b.stop()
	}
	t.Fatalf("pgbouncer did not start: %v", lastErr)
	return nil
}

func (b *pgBouncer) waitReady(srv *pgtest.Server) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-b.done:
			return fmt.Errorf("pgbouncer exited: %s", b.log())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, b.URL(srv, "postgres", ""))
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w; log: %s", err, b.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *pgBouncer) log() string {
	var s strings.Builder
	for _, f := range []string{"pgbouncer.log", "stdout.log"} {
		data, _ := os.ReadFile(filepath.Join(b.dir, f))
		s.Write(data)
	}
	return bouncerTail(s.String(), 2000)
}

func bouncerTail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (b *pgBouncer) stop() {
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
}

// URL is a URL of database db through PgBouncer, with pgx's default_query_exec_mode set when
// mode is not empty.
func (b *pgBouncer) URL(srv *pgtest.Server, db, mode string) string {
	q := url.Values{"sslmode": {"disable"}}
	if mode != "" {
		q.Set("default_query_exec_mode", mode)
	}
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: "127.0.0.1:" + strconv.Itoa(b.Port), Path: "/" + db, RawQuery: q.Encode()}
	return u.String()
}

// TestWritersThroughPgBouncer: the application's writers reach PostgreSQL through PgBouncer in
// transaction pooling (the usual setup for many application instances; the relays keep direct
// sessions, which their session locks need), eight writers sharing three server connections and
// appending to the same 24 aggregates, several writers per aggregate. The writer library's
// aggregate lock is transaction-scoped (pg_advisory_xact_lock), so it holds in transaction pooling.
// Each transaction records, under that lock, its events' places in their aggregates' commit
// order in a table of the test (the count of the aggregate's events committed before it, plus
// one, visible only once the previous holder committed): the places of an aggregate must be 1, 2,
// 3 ... with no place twice (two transactions holding one aggregate at once would take the same
// one), and the independent consumer must see each aggregate's events in that order. A tenth of
// the transactions roll back: none of their events may be published. Afterwards no advisory
// lock of the writers is left on PgBouncer's server connections.
//
// The writers use the four pgx query execution modes that work through PgBouncer 1.18 (Debian
// 12's) in transaction pooling, two writers each: cache_describe and describe_exec (unnamed
// statements, described first), exec and simple_protocol (no Describe; the writer library sends
// its JSON as text since these tests found that its []byte went as bytea, which jsonb refused:
// "invalid input syntax for type json"). pgx's default, cache_statement, prepares named
// statements on whichever server connection runs them, which PgBouncer before 1.21 cannot follow
// ("prepared statement \"stmtcache_...\" already exists", SQLSTATE 42P05).
func TestWritersThroughPgBouncer(t *testing.T) { forEachTracking(t, testWritersThroughPgBouncer) }

func testWritersThroughPgBouncer(t *testing.T, tracking Tracking) {
	began := time.Now()
	pgBouncerBinary(t)
	seed := testSeed(t)
	srv := pgtest.Shared(t)
	url, pool, k, topic := newTopicDB(t, "relay.pgbouncer", 6)
	ctx := context.Background()
	dbName := strings.TrimPrefix(strings.SplitN(url[strings.LastIndex(url, "/"):], "?", 2)[0], "/")
	if _, err := pool.Exec(ctx, `CREATE TABLE commit_order (event_id uuid PRIMARY KEY, aggregate_id text NOT NULL, place int NOT NULL);
CREATE INDEX ON commit_order (aggregate_id)`); err != nil {
		t.Fatal(err)
	}
	const serverConns = 3
	b := startPgBouncer(t, srv, "transaction", serverConns)
	r := startRelay(t, withTracking(testConfig(url, k.Brokers, topic), tracking), "relay")
	waitFor(t, 30*time.Second, "relay readiness", r.Ready)
	c := newCollector(t, k, topic)
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	// The load that keeps the relay busy, directly.
	load := seqtest.StartLoad(ctx, pool, w, "order", 1000, 2, 10, 2*time.Millisecond)

	const writers, aggs, txsPerWriter = 8, 24, 150
	modes := []string{"cache_describe", "describe_exec", "exec", "simple_protocol"}
	pools := map[string]*pgxpool.Pool{}
	for _, mode := range modes {
		cfg, err := pgxpool.ParseConfig(b.URL(srv, dbName, mode))
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = writers
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		pools[mode] = p
	}
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		committed = map[string]bool{} // event ids
		rolled    = map[string]bool{}
		errs      = make(chan error, writers)
		waits     atomic.Int64 // samples that saw a writer wait for an aggregate lock
	)
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND NOT granted`).Scan(&n); err == nil && n > 0 {
				waits.Add(1)
			}
		}
	}()
	for wr := range writers {
		mode := modes[wr%len(modes)]
		wp := pools[mode]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, uint64(wr)))
			for range txsPerWriter {
				evs := make([]outbox.Event, 1+rnd.IntN(4))
				for i := range evs {
					a := fmt.Sprintf("pgb-%02d", rnd.IntN(aggs))
					p, _ := json.Marshal(seqEvent{Agg: a})
					evs[i] = outbox.Event{AggregateType: "order", AggregateID: a, EventType: "Placed", Payload: p, EventID: newUUID()}
				}
				abort := rnd.IntN(10) == 0
				err := pgx.BeginFunc(ctx, wp, func(tx pgx.Tx) error {
					if _, err := w.AppendBatch(ctx, tx, evs); err != nil {
						return err
					}
					// The aggregate locks are held now: record each event's place.
					for _, e := range evs {
						if _, err := tx.Exec(ctx, `INSERT INTO commit_order (event_id, aggregate_id, place)
SELECT $1::uuid, $2::text, count(*) + 1 FROM commit_order WHERE aggregate_id = $2::text`, e.EventID, e.AggregateID); err != nil {
							return err
						}
					}
					if rnd.IntN(3) == 0 {
						time.Sleep(time.Duration(rnd.IntN(2000)) * time.Microsecond) // work of the application's transaction
					}
					if abort {
						return errRollback
					}
					return nil
				})
				if err != nil && !errors.Is(err, errRollback) {
					errs <- fmt.Errorf("writer %d (%s): %w", wr, mode, err)
					return
				}
				mu.Lock()
				for _, e := range evs {
					if abort {
						rolled[e.EventID] = true
					} else {
						committed[e.EventID] = true
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stopSampling)
	<-sampled
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	all := load.Stop(t)
	total := load.Written() + len(committed)
	c.waitDistinct(t, total, 2*time.Minute)
	c.poll(t, 500*time.Millisecond)
	checkOrder(t, onlyAggPrefix(t, c.recs, "agg-"), all)

	// The places: 1..n per aggregate, none twice; Kafka's order (after dropping duplicates) is theirs.
	places := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT event_id::text, aggregate_id, place FROM commit_order`)
	if err != nil {
		t.Fatal(err)
	}
	perAgg := map[string]map[int]bool{}
	twice := 0
	for rows.Next() {
		var id, agg string
		var place int
		if err := rows.Scan(&id, &agg, &place); err != nil {
			t.Fatal(err)
		}
		places[id] = place
		if perAgg[agg] == nil {
			perAgg[agg] = map[int]bool{}
		}
		if perAgg[agg][place] {
			if twice < 10 {
				t.Errorf("aggregate %s: two committed transactions took place %d: they held the aggregate at once", agg, place)
			}
			twice++
		}
		perAgg[agg][place] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if twice > 0 {
		t.Errorf("%d places taken twice", twice)
	}
	if len(places) != len(committed) {
		t.Errorf("commit_order holds %d events, %d were committed", len(places), len(committed))
	}
	for agg, ps := range perAgg {
		for p := 1; p <= len(ps); p++ {
			if !ps[p] {
				t.Errorf("aggregate %s: places %d, but not place %d", agg, len(ps), p)
				break
			}
		}
	}
	seen := map[string]bool{}
	next := map[string]int{}
	published, reorders := 0, 0
	for _, rec := range sortedRecs(c.recs) {
		id := rec.Headers[HeaderEventID]
		if rolled[id] {
			t.Errorf("an event of a rolled-back transaction was published: %s of %s", id, rec.Key)
			continue
		}
		place, ok := places[id]
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		published++
		if place != next[rec.Key]+1 {
			if reorders < 10 {
				t.Errorf("aggregate %s: the event of place %d after the one of place %d", rec.Key, place, next[rec.Key])
			}
			reorders++
		}
		next[rec.Key] = place
	}
	if published != len(committed) {
		t.Errorf("%d of the %d events written through PgBouncer were published", published, len(committed))
	}
	var leaked int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1`).Scan(&leaked); err != nil || leaked != 0 {
		t.Errorf("%d aggregate locks are still held after the writers finished (%v)", leaked, err)
	}
	waitFor(t, 10*time.Second, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	t.Logf("%s tracking: %d writers through PgBouncer (transaction pooling, %d server connections; pgx modes %v) committed %d events to %d aggregates in commit order (%d events of rolled-back transactions, none published); %d samples saw a writer wait for an aggregate lock; %d events in all with the direct load; test took %s",
		tracking, writers, serverConns, modes, len(committed), len(perAgg), len(rolled), waits.Load(), total, time.Since(began).Round(time.Millisecond))
}

var errRollback = errors.New("rolled back by the test")

// onlyAggPrefix returns the records of aggregates with the prefix.
func onlyAggPrefix(t testing.TB, recs []kafkatest.Record, prefix string) []kafkatest.Record {
	t.Helper()
	var out []kafkatest.Record
	for _, r := range recs {
		if strings.HasPrefix(r.Key, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// sortedRecs orders records as a consumer reads each partition: by topic, partition, offset.
func sortedRecs(recs []kafkatest.Record) []kafkatest.Record {
	out := append([]kafkatest.Record(nil), recs...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		if out[i].Partition != out[j].Partition {
			return out[i].Partition < out[j].Partition
		}
		return out[i].Offset < out[j].Offset
	})
	return out
}

// TestRelayThroughPgBouncerSession: the relays themselves may reach PostgreSQL through PgBouncer
// in session pooling (docs/architecture.md: their session locks need a session, never transaction
// pooling). Two relay processes of the one shard, notified (LISTEN through PgBouncer) and
// polling as a fallback, both through PgBouncer, while writers append directly: the first
// publishes, the second stands by behind its presence lock; the first is stopped with SIGTERM and
// the second takes over; a third is started, the second is killed (SIGKILL: PgBouncer sees its
// client go, runs DISCARD ALL on the server session, which releases its advisory locks) and the
// third takes over. The consumer must see everything in order (duplicates allowed after the
// kill); the takeovers are measured from the stop to the new holder's readiness.
func TestRelayThroughPgBouncerSession(t *testing.T) {
	forEachTracking(t, testRelayThroughPgBouncerSession)
}

func testRelayThroughPgBouncerSession(t *testing.T, tracking Tracking) {
	began := time.Now()
	pgBouncerBinary(t)
	srv := pgtest.Shared(t)
	url, pool, k, topic := newTopicDB(t, "relay.pgbouncer.session", 3)
	ctx := context.Background()
	dbName := strings.TrimPrefix(strings.SplitN(url[strings.LastIndex(url, "/"):], "?", 2)[0], "/")
	b := startPgBouncer(t, srv, "session", 20)
	via := b.URL(srv, dbName, "")
	c := newCollector(t, k, topic)
	start := func() *proc {
		return startProc(t, via, "--brokers", strings.Join(k.Brokers, ","), "--default-topic", topic,
			"--tracking", string(tracking), "--notify", "--poll-interval", "1s", "--shard-count", "1", "--batch-size", "200")
	}
	ready := func(p *proc) func() bool { return func() bool { return p.status("/readyz") == 200 } }
	first := start()
	waitFor(t, 30*time.Second, "the first relay's readiness", ready(first))
	second := start()
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	load := seqtest.StartLoad(ctx, pool, w, "order", 500, 3, 10, 3*time.Millisecond)
	waitFor(t, 30*time.Second, "events published through PgBouncer", func() bool { return first.metric("outbox_published_total") > 3000 })
	if second.status("/readyz") == 200 {
		t.Fatal("the second relay is ready while the first holds the shard")
	}
	stopped := time.Now()
	if code := first.terminate(30 * time.Second); code != 0 {
		t.Errorf("the first relay exited with %d on SIGTERM", code)
	}
	waitFor(t, 30*time.Second, "the second relay to take the shard", ready(second))
	graceful := time.Since(stopped)
	third := start()
	waitFor(t, 30*time.Second, "events published by the second relay", func() bool { return second.metric("outbox_published_total") > 3000 })
	killed := time.Now()
	second.kill()
	waitFor(t, 60*time.Second, "the third relay to take the shard", ready(third))
	afterKill := time.Since(killed)
	waitFor(t, 30*time.Second, "events published by the third relay", func() bool { return third.metric("outbox_published_total") > 2000 })
	all := load.Stop(t)
	total := load.Written()
	c.waitDistinct(t, total, 2*time.Minute)
	c.poll(t, 500*time.Millisecond)
	dups := checkOrder(t, c.recs, all)
	waitFor(t, 30*time.Second, "nothing pending", func() bool { return pendingRows(t, pool) == 0 })
	t.Logf("%s tracking: %d events through relays connected by PgBouncer (session pooling), in order, %d duplicates (after the kill); takeover %s after SIGTERM, %s after SIGKILL; test took %s",
		tracking, total, dups, graceful.Round(time.Millisecond), afterKill.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// TestRelayRefusesTransactionPooling: a relay whose connections go through PgBouncer in
// transaction pooling has no session of its own: its session advisory locks (the buckets', the
// shard's presence lock) stay on whichever server connection took them, and its next statements
// run on any. With one server connection, two relays of the same shard share it, each "takes"
// the locks the other holds (they are re-entrant in one session), and both published everything
// before the relay checked its session: 50,940 records for 25,560 events, both relays ready.
// (pgx's default query mode fails loudly there, "prepared statement ... already exists";
// describe_exec, which an operator may set in the URL for PgBouncer, gets through.) Now the
// second relay finds the first one's mark on the session its new connection answers from and
// exits with SessionNotKeptError, before it takes a lock: never do two relays of one shard publish.
// (With the simple protocol, as here, the relay's fetch, which reads binary columns, fails at
// once, its next connection lands on the session its first one marked, and it refuses.)
func TestRelayRefusesTransactionPooling(t *testing.T) {
	pgBouncerBinary(t)
	srv := pgtest.Shared(t)
	url, pool, k, topic := newTopicDB(t, "relay.pgbouncer.txpool", 3)
	ctx := context.Background()
	dbName := strings.TrimPrefix(strings.SplitN(url[strings.LastIndex(url, "/"):], "?", 2)[0], "/")
	b := startPgBouncer(t, srv, "transaction", 1)
	via := b.URL(srv, dbName, "simple_protocol")
	start := func() *proc {
		return startProc(t, via, "--brokers", strings.Join(k.Brokers, ","), "--default-topic", topic, "--shard-count", "1")
	}
	first, second := start(), start()
	w, err := outbox.New(testTable.String())
	if err != nil {
		t.Fatal(err)
	}
	load := seqtest.StartLoad(ctx, pool, w, "order", 100, 2, 10, 3*time.Millisecond)
	both := 0
	waitFor(t, time.Minute, "5,000 events written while the relays run", func() bool {
		if first.status("/readyz") == 200 && second.status("/readyz") == 200 {
			both++
		}
		return load.Written() > 5000
	})
	load.Stop(t)
	const refusal = "does not keep its PostgreSQL session"
	p1, p2 := first.metric("outbox_published_total"), second.metric("outbox_published_total")
	if p1 > 0 && p2 > 0 || both > 0 {
		t.Errorf("through transaction pooling both relays of the shard published (%v and %v of %d events; both ready at %d checks)",
			p1, p2, load.Written(), both)
	}
	refused := 0
	for _, p := range []*proc{first, second} {
		if strings.Contains(p.log(), refusal) {
			refused++
			waitFor(t, 30*time.Second, "the refusing relay to exit", p.exited)
		}
	}
	if refused == 0 {
		t.Fatalf("through transaction pooling no relay refused (%q); logs:\n%s\n---\n%s", refusal, first.logTail(20), second.logTail(20))
	}
	t.Logf("through transaction pooling %d of 2 relays refused and exited; published %v and %v of %d events", refused, p1, p2, load.Written())
}
