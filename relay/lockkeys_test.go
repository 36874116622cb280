package relay

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestLockKeysWaitsHoldingOnlyLowerKeys: with key 5 of 1..10 held by another session, lockKeys
// takes 1..4, names the key it waits for and its holder, and holds none of 6..10 while it waits
// (so two relays locking in ascending order never deadlock); once 5 is free it holds all ten.
func TestLockKeysWaitsHoldingOnlyLowerKeys(t *testing.T) {
	url := pgtest.NewDatabase(t)
	ctx := context.Background()
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	const lockKey = int32(4242)
	other, relayConn, observer := connect(), connect(), connect()
	if _, err := other.Exec(ctx, `SELECT pg_advisory_lock($1::int4, 5)`, lockKey); err != nil {
		t.Fatal(err)
	}
	var otherPID int32
	if err := other.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&otherPID); err != nil {
		t.Fatal(err)
	}
	held := func(pid uint32) []int32 {
		t.Helper()
		rows, err := observer.Query(ctx, `SELECT objid::int4 FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND classid = $1::int4::oid AND objsubid = 2 AND pid = $2 ORDER BY 1`, lockKey, int32(pid))
		if err != nil {
			t.Fatal(err)
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}

	keys := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	waited := make(chan [2]int32, 1)
	done := make(chan error, 1)
	go func() {
		done <- lockKeys(ctx, relayConn, lockKey, keys, 0, func(k, holder int32) { waited <- [2]int32{k, holder} })
	}()
	select {
	case w := <-waited:
		if w != [2]int32{5, otherPID} {
			t.Fatalf("waits for key %d held by %d, want 5 held by %d", w[0], w[1], otherPID)
		}
	case err := <-done:
		t.Fatalf("lockKeys returned %v while key 5 is held", err)
	case <-time.After(30 * time.Second):
		t.Fatal("lockKeys neither waited nor returned")
	}
	if got := held(relayConn.PgConn().PID()); !slices.Equal(got, []int32{1, 2, 3, 4}) {
		t.Fatalf("while waiting for key 5 the relay holds %v, want [1 2 3 4]", got)
	}
	if _, err := other.Exec(ctx, `SELECT pg_advisory_unlock($1::int4, 5)`, lockKey); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("lockKeys did not return once key 5 was free")
	}
	if got := held(relayConn.PgConn().PID()); !slices.Equal(got, keys) {
		t.Fatalf("the relay holds %v, want %v", got, keys)
	}
}
