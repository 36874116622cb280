package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"

	"github.com/jackc/pgx/v5"
)

// The lock connection must keep its PostgreSQL session: the shard's presence and bucket locks are
// session advisory locks, held by the server session that took them. Behind a pooler in
// transaction mode (PgBouncer's pool_mode = transaction) each transaction may run on another
// server session, and a session may serve several clients in turn: the locks stay on whichever
// session took them, and two relays of one shard that land on it both "hold" them (a session's
// advisory locks are re-entrant), both publishing every event (measured through PgBouncer: 50,940
// records for 25,560 events). So the relay marks the session that holds its presence lock with a
// token of its own (a session setting, outbox.relay_session), set only where pg_locks shows that
// lock held by the session itself, and every round trip that fetches checks the mark first. A
// missing or foreign mark ends the relay with SessionNotKeptError: no retry mends it.

// SessionNotKeptError is the relay's refusal to publish through a connection that does not keep
// its session.
type SessionNotKeptError struct{ why string }

func (e *SessionNotKeptError) Error() string {
	return "the relay's lock connection does not keep its PostgreSQL session (" + e.why + "): is it going through a pooler " +
		"in transaction mode (PgBouncer pool_mode = transaction)? The relays' locks need a session of their own: connect them " +
		"to PostgreSQL directly, or through session pooling"
}

// markSessionSQL sets the token ($3) on the session only if that session holds the presence lock
// ($1, $2) itself, and reports whether it did.
const markSessionSQL = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND granted
    AND pid = pg_catalog.pg_backend_pid() AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2)
  AND pg_catalog.set_config('outbox.relay_session', $3, false) = $3`

// freshSessionSQL reports whether a new connection's session is new: no relay's mark, and none of
// the table's ($1) advisory locks. Through a pooler in transaction mode a relay's connection may
// land on a session where another relay took the shard's locks, and would take them again
// (re-entrant), so the check comes before any lock is taken.
const freshSessionSQL = `SELECT coalesce(pg_catalog.current_setting('outbox.relay_session', true), '') = ''
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()
                  AND classid = $1::int4::oid)`

// checkSessionSQL reports whether the session carries the token ($1).
var checkSessionSQL = `SELECT ` + sessionMarked("$1")

// sessionMarked is the check of the session's mark as an expression, its token the parameter
// param: a fetching statement may answer it in a column of its own rather than in a statement
// (row tracking's fetch, withPosition).
func sessionMarked(param string) string {
	return `pg_catalog.current_setting('outbox.relay_session', true) IS NOT DISTINCT FROM ` + param
}

// checkFreshSession refuses a new connection whose session is not new.
func (r *Relay) checkFreshSession(ctx context.Context, conn *pgx.Conn) error {
	var fresh bool
	if err := conn.QueryRow(ctx, freshSessionSQL, r.lockKey).Scan(&fresh); err != nil {
		return err
	}
	if !fresh {
		return &SessionNotKeptError{why: "a new connection answers from a session that another relay marked or that holds the table's locks"}
	}
	return nil
}

// markSession marks the lock connection's session, just after it took the presence lock.
func (r *Relay) markSession(ctx context.Context, conn *pgx.Conn, presence int32) error {
	var b [16]byte
	_, _ = rand.Read(b[:])
	r.session = hex.EncodeToString(b[:])
	var ok bool
	if err := conn.QueryRow(ctx, markSessionSQL, r.lockKey, presence, r.session).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return &SessionNotKeptError{why: "the presence lock it took is not held by the session that answers next"}
	}
	return nil
}

// queueSessionCheck queues the check of the session's mark; done reports, after the round trip,
// a session that is not the one that took the locks.
func (r *Relay) queueSessionCheck(pb *pgx.Batch) (done func() error) {
	var same bool
	pb.Queue(checkSessionSQL, r.session).QueryRow(func(row pgx.Row) error { return row.Scan(&same) })
	return sessionChecked(&same)
}

// sessionChecked reports, after the round trip whose statement scanned the check of the
// session's mark into same, a session that is not the one that took the locks.
func sessionChecked(same *bool) func() error {
	return func() error {
		if !*same {
			return &SessionNotKeptError{why: "a round trip ran on a session that does not carry the mark set where its locks were taken"}
		}
		return nil
	}
}

// sessionNotKept reports whether err is a SessionNotKeptError.
func sessionNotKept(err error) bool {
	var e *SessionNotKeptError
	return errors.As(err, &e)
}
