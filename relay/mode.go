// The tracking modes as the relay holds them for its whole life, across tenures and connections:
// what each keeps between tenures (its statements, what it tells readiness) and how it starts a
// tenure's tracker (loop.go), which holds the rest.

package relay

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// trackingMode is one tracking mode for the relay's lifetime: rowMode or snapMode.
type trackingMode interface {
	// begin starts tenure ten on conn: it checks that the table may be tracked this way and
	// returns the tenure's tracker.
	begin(ctx context.Context, conn *pgx.Conn, ten *tenure) (tracker, error)
	// refusal is why the mode keeps the relay from publishing while it holds its locks (the
	// relay is then not ready), "" when nothing does.
	refusal() string
}

func newMode(r *Relay) trackingMode {
	if r.cfg.Tracking == TrackSnapshot {
		return &snapMode{r: r, sql: newCursorSQL(r.cfg.Table)}
	}
	return &rowMode{r: r, snapshotTracked: snapshotTrackedSQL(r.cfg.Table)}
}

// rowMode is row tracking (row_track.go).
type rowMode struct {
	r *Relay
	// snapshotTracked asks whether the table's cursor table has rows: a snapshot relay tracks it.
	snapshotTracked string
	// floor is the lowest floor of the buckets the last fetch read (row_resume.go): every row at
	// or below it was read, or was written by a transaction the watch leaves open.
	floor atomic.Int64
}

// begin refuses a table tracked by snapshot (a row relay would publish every event again).
func (m *rowMode) begin(ctx context.Context, conn *pgx.Conn, ten *tenure) (tracker, error) {
	var snapshotTracked bool
	if err := conn.QueryRow(ctx, m.snapshotTracked).Scan(&snapshotTracked); err != nil {
		return nil, err
	}
	if snapshotTracked {
		why := fmt.Sprintf("%s is tracked by snapshot (its cursor table %s has rows): a relay with --tracking=row would publish "+
			"every event again; run this relay with --tracking=snapshot", m.r.cfg.Table, m.r.cfg.Table.Derived("relay_cursor"))
		m.r.standbyWhy.Store(&why)
		return nil, &errCursor{msg: why}
	}
	// A new tenure or connection reads from the oldest unsent row.
	return &rowTracker{r: m.r, mode: m, pos: &resume{sharded: ten.count > 1}}, nil
}

func (m *rowMode) refusal() string { return "" }

// snapMode is snapshot tracking (snapshot_track.go).
type snapMode struct {
	r   *Relay
	sql cursorSQL // the cursor table's statements
	// why the table's cursor is refused; the relay is not ready while it is set, though it
	// holds its locks, until a tenure takes the cursor.
	why atomic.Pointer[string]
}

// begin takes the cursor rows of ten's buckets (takeCursor). A cursor that cannot be trusted
// keeps the relay not ready, saying why, until a tenure takes one.
func (m *snapMode) begin(_ context.Context, conn *pgx.Conn, ten *tenure) (tracker, error) {
	return m.newSnapTracker(conn, ten)
}

func (m *snapMode) refusal() string {
	if why := m.why.Load(); why != nil {
		return *why
	}
	return ""
}
