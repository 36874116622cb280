package outboxdb_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// holdLocks holds session advisory locks of the table on a connection of its own, as a relay
// does, until the test ends or release is called.
func holdLocks(t *testing.T, db *sql.DB, tb outboxdb.Table, keys ...int) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1::int4, $2::int4)`, tb.LockKey(), k); err != nil {
			t.Fatal(err)
		}
	}
	done := false
	release = func() {
		if !done {
			done = true
			_, _ = conn.ExecContext(ctx, `SELECT pg_advisory_unlock_all()`)
			_ = conn.Close()
		}
	}
	t.Cleanup(release)
	return release
}

func TestLayoutSwitchNeedsEveryBucketFree(t *testing.T) {
	ctx := context.Background()
	db, _ := openDB(t)
	tb := outboxdb.MustParseTable("shop.events")
	if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
		t.Fatal(err)
	}
	if l, err := outboxdb.ReadLayout(ctx, db, tb); err != nil || l != nil {
		t.Fatalf("fresh table: layout %+v, %v; want none", l, err)
	}
	// A request without a layout does nothing.
	if err := outboxdb.RequestLayout(ctx, db, tb, 4); err != nil {
		t.Fatal(err)
	}
	if ok, err := outboxdb.SwitchLayout(ctx, db, tb, 1); err != nil || !ok {
		t.Fatalf("first layout: %v, %v", ok, err)
	}
	l, err := outboxdb.ReadLayout(ctx, db, tb)
	if err != nil || l == nil || l.ShardCount != 1 || l.Generation != 1 || l.Requested != 0 {
		t.Fatalf("layout %+v, %v", l, err)
	}

	// A relay of the 1-shard layout holds bucket 200 (and its presence lock).
	release := holdLocks(t, db, tb, outboxdb.PresenceLock+0, 200)
	locks, err := outboxdb.ReadRelayLocks(ctx, db, tb)
	if err != nil || len(locks.Buckets) != 1 || len(locks.Present) != 1 || len(locks.Holders()) != 1 {
		t.Fatalf("locks %+v, %v", locks, err)
	}
	if _, ok := locks.Present[0]; !ok {
		t.Fatalf("shard 0 not present: %+v", locks)
	}

	if err := outboxdb.RequestLayout(ctx, db, tb, 4); err != nil {
		t.Fatal(err)
	}
	if ok, err := outboxdb.SwitchLayout(ctx, db, tb, 4); err != nil || ok {
		t.Fatalf("switch while bucket 200 is held: %v, %v; want false", ok, err)
	}
	l, _ = outboxdb.ReadLayout(ctx, db, tb)
	if l.ShardCount != 1 || l.Requested != 4 || l.RequestedAt.IsZero() {
		t.Fatalf("after a refused switch: %+v", l)
	}
	// The refused switch released every bucket it had taken: a relay can lock bucket 0.
	holdLocks(t, db, tb, 0)()

	release()
	time.Sleep(10 * time.Millisecond) // released_at must differ from requested_at measurably
	if _, err := db.ExecContext(ctx, outboxdb.LayoutStatements(tb).Released, l.Generation); err != nil {
		t.Fatal(err)
	}
	if ok, err := outboxdb.SwitchLayout(ctx, db, tb, 4); err != nil || !ok {
		t.Fatalf("switch with every bucket free: %v, %v", ok, err)
	}
	l, _ = outboxdb.ReadLayout(ctx, db, tb)
	if l.ShardCount != 4 || l.Generation != 2 || l.Requested != 0 || l.Previous != 1 || !l.ReleasedAt.After(l.RequestedAt) {
		t.Fatalf("after the switch: %+v", l)
	}
	if _, ok := l.Pause(); ok {
		t.Fatal("pause reported before the buckets are held")
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if _, err := outboxdb.WaitForPause(short, outboxdb.RealClock{}, db, tb, l.Generation, 10*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitForPause before the buckets are held: %v", err)
	}
	cancel()
	if _, err := outboxdb.WaitForPause(ctx, outboxdb.RealClock{}, db, tb, l.Generation-1, 10*time.Millisecond); err == nil {
		t.Fatal("WaitForPause of a past generation returned")
	}

	// The new layout's relays lock their buckets; the last one to lock ends the pause.
	for k := range 4 {
		var keys []int
		for b := k; b < outboxdb.Buckets; b += 4 {
			keys = append(keys, b)
		}
		holdLocks(t, db, tb, keys...)
		if _, err := db.ExecContext(ctx, outboxdb.LayoutStatements(tb).Locked, l.Generation); err != nil {
			t.Fatal(err)
		}
		l2, _ := outboxdb.ReadLayout(ctx, db, tb)
		if _, ok := l2.Pause(); ok != (k == 3) {
			t.Fatalf("after shard %d locked: pause reported %v", k, ok)
		}
		claimed, err := outboxdb.ClaimLayoutReport(ctx, db, tb, l.Generation)
		if err != nil || claimed != (k == 3) {
			t.Fatalf("after shard %d locked: report claimed %v, %v", k, claimed, err)
		}
		if k == 3 {
			if d, _ := l2.Pause(); d <= 0 || d > time.Minute {
				t.Fatalf("pause %v", d)
			}
			if w, err := outboxdb.WaitForPause(ctx, outboxdb.RealClock{}, db, tb, l.Generation, 10*time.Millisecond); err != nil || w.ResumedAt.IsZero() {
				t.Fatalf("WaitForPause once every bucket is held: %+v, %v", w, err)
			}
			if again, err := outboxdb.ClaimLayoutReport(ctx, db, tb, l.Generation); err != nil || again {
				t.Fatalf("the report claimed twice: %v, %v", again, err)
			}
		}
	}

	// Asking for the current layout cancels a request; a switch to it is a no-op that succeeds
	// even while relays run.
	if err := outboxdb.RequestLayout(ctx, db, tb, 2); err != nil {
		t.Fatal(err)
	}
	if err := outboxdb.RequestLayout(ctx, db, tb, 4); err != nil {
		t.Fatal(err)
	}
	if ok, err := outboxdb.SwitchLayout(ctx, db, tb, 4); err != nil || !ok {
		t.Fatalf("switch to the current layout: %v, %v", ok, err)
	}
	l, _ = outboxdb.ReadLayout(ctx, db, tb)
	if l.ShardCount != 4 || l.Generation != 2 || l.Requested != 0 {
		t.Fatalf("after cancelling: %+v", l)
	}
	if _, err := outboxdb.SwitchLayout(ctx, db, tb, 300); err == nil {
		t.Fatal("switch to 300 shards accepted")
	}
}

// TestRetrySwitch: with a bucket held, a bounded retry gives up (false, no error); an unbounded
// one switches once the bucket is released.
func TestRetrySwitch(t *testing.T) {
	ctx := context.Background()
	db, _ := openDB(t)
	tb := outboxdb.MustParseTable("outbox")
	if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
		t.Fatal(err)
	}
	release := holdLocks(t, db, tb, 17)
	start := time.Now()
	if ok, err := outboxdb.RetrySwitch(ctx, outboxdb.RealClock{}, db, tb, 2, 10*time.Millisecond, 100*time.Millisecond); ok || err != nil {
		t.Fatalf("bounded retry while bucket 17 is held: %v, %v", ok, err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("gave up after %s, before its 100ms", d)
	}
	// Its time is the clock it is given: an hour's bound on a fake clock passes in 60 polls a
	// minute apart, stepped as soon as the retry waits, without an hour going by.
	fake := clocktesting.NewFakeClock(time.Now())
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if fake.HasWaiters() {
				fake.Step(time.Minute)
			} else {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	start = time.Now()
	ok, err := outboxdb.RetrySwitch(ctx, fake, db, tb, 2, time.Minute, time.Hour)
	close(done)
	if ok || err != nil {
		t.Fatalf("bounded retry on a fake clock while bucket 17 is held: %v, %v", ok, err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("an hour's bound on a fake clock took %s of real time: the retry reads the wall clock", d)
	}
	released := make(chan struct{})
	time.AfterFunc(200*time.Millisecond, func() { release(); close(released) })
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ok, err = outboxdb.RetrySwitch(rctx, outboxdb.RealClock{}, db, tb, 2, 10*time.Millisecond, 0)
	<-released
	if !ok || err != nil {
		t.Fatalf("unbounded retry: %v, %v", ok, err)
	}
	if l, err := outboxdb.ReadLayout(ctx, db, tb); err != nil || l.ShardCount != 2 {
		t.Fatalf("layout %+v, %v", l, err)
	}
}

// TestLayoutChangesNotify: a request and a switch each notify the table's channel with the
// layout payload, which relays tell from the empty payload of inserts.
func TestLayoutChangesNotify(t *testing.T) {
	ctx := context.Background()
	db, url := openDB(t)
	tb := outboxdb.MustParseTable("outbox")
	if _, err := outboxdb.Apply(ctx, db, tb); err != nil {
		t.Fatal(err)
	}
	listener, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close(context.Background()) })
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{tb.Channel()}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	expect := func(what string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		if err != nil || n.Payload != outboxdb.LayoutNotification {
			t.Fatalf("after %s: notification %+v, %v; want payload %q", what, n, err, outboxdb.LayoutNotification)
		}
	}
	if ok, err := outboxdb.SwitchLayout(ctx, db, tb, 1); err != nil || !ok {
		t.Fatalf("first layout: %v, %v", ok, err)
	}
	expect("the first switch")
	if err := outboxdb.RequestLayout(ctx, db, tb, 3); err != nil {
		t.Fatal(err)
	}
	expect("a request")
}
