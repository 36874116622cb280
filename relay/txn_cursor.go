package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The cursor record of exactly-once delivery (txn_track.go): with each
// batch's events, a shard's transaction carries the shard's position to the cursor topic (a
// compacted topic, keyed by the shard), so that what a read_committed consumer has seen and where
// the shard stands commit together. The database's cursor rows become a copy written after the
// commit, never ahead of it; a tenure that starts reads the record (after fencing the
// transactional id) and reconciles the database's rows with it (reconcileCursor).

// txnCursorVersion is the record format's version; a relay refuses a record of another.
const txnCursorVersion = 1

// txnCursor is a shard's committed position: the cursor rows of the tenure's groups as the
// cursor table holds them, and the events parked since the database last confirmed a write
// (parked again from here if the relay ended before the database had them).
type txnCursor struct {
	V      int              `json:"v"`
	Shard  string           `json:"shard"` // txnShardID: the record's key, repeated
	Groups []txnCursorGroup `json:"groups"`
	Parked []txnRow         `json:"parked,omitempty"`
	// Unparked: parked events published (from the parked table) since the database last
	// confirmed a write: deleted from the parked table again if the relay ended before.
	Unparked []int64 `json:"unparked,omitempty"`
}

// txnRow names an event row (the outbox table is partitioned by created_at).
type txnRow struct {
	ID      int64     `json:"id"`
	Created time.Time `json:"created"`
}

// txnCursorGroup is one cursor row's position (see cursorGroup; -1 where a bound is not known).
type txnCursorGroup struct {
	Buckets   []int16 `json:"buckets"`
	Snap      string  `json:"snap,omitempty"`
	SnapFloor int64   `json:"snapFloor"`
	Next      string  `json:"next,omitempty"`
	NextFloor int64   `json:"nextFloor"`
	NextCeil  int64   `json:"nextCeil"`
	Last      int64   `json:"last"`
}

// txnShardID names a shard of a table for exactly-once delivery: its transactional id and its
// cursor record's key. The database's system identifier keeps two databases with a table of the
// same name apart (a promoted standby keeps its primary's); the layout's generation changes with
// every reshard, so the shards of two layouts never share an id.
func txnShardID(systemID, table string, gen int64, index, count int) string {
	return fmt.Sprintf("outbox-relay/%s/%s/gen-%d/shard-%d-of-%d", systemID, table, gen, index, count)
}

// cursorRecordOf returns the record of st's groups for shard, with parked the events parked
// and not yet confirmed written by the database.
func cursorRecordOf(shard string, groups []*cursorGroup, parked []txnRow) txnCursor {
	c := txnCursor{V: txnCursorVersion, Shard: shard, Parked: parked}
	for _, g := range groups {
		c.Groups = append(c.Groups, txnGroupOf(g))
	}
	return c
}

// txnGroupOf is g's position as a cursor record holds it.
func txnGroupOf(g *cursorGroup) txnCursorGroup {
	return txnCursorGroup{Buckets: g.buckets, Snap: g.snap.text, SnapFloor: g.snap.floor,
		Next: g.next.text, NextFloor: g.next.floor, NextCeil: g.next.ceil, Last: g.last}
}

func (c txnCursor) encode() []byte {
	b, _ := json.Marshal(c) // plain fields only: cannot fail
	return b
}

// decodeCursor reads a cursor record for shard; an error says why it cannot be used.
func decodeCursor(shard string, b []byte) (txnCursor, error) {
	var c txnCursor
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("the cursor record of %s is not one: %w", shard, err)
	}
	switch {
	case c.V != txnCursorVersion:
		return c, fmt.Errorf("the cursor record of %s has format version %d; this relay reads version %d", shard, c.V, txnCursorVersion)
	case c.Shard != shard:
		return c, fmt.Errorf("the cursor record under the key %s names the shard %s", shard, c.Shard)
	case len(c.Groups) == 0:
		return c, fmt.Errorf("the cursor record of %s has no position", shard)
	}
	return c, nil
}

// errCursorLayout: the cursor record's groups cover other buckets than the database's rows (a
// reshard since it was written, which exactly-once resharding must merge first).
var errCursorLayout = errors.New("the cursor record's groups are not the database's")

// reconcileCursor compares the database's cursor rows of a tenure (groups) with the shard's
// committed cursor record (nil: none yet) and returns the positions to adopt, by group index (nil
// when the database's are current). The record is ahead after a crash between a commit and the
// database's copy: its positions are adopted. The database is ahead only where the shard was
// published at-least-once since the record was written: its rows stand, and the next transaction
// writes a record that agrees. Groups that do not pair by buckets are errCursorLayout.
// dbAhead reports whether the database stands past the record in some group.
func reconcileCursor(groups []*cursorGroup, rec *txnCursor) (adopt map[int]txnCursorGroup, dbAhead bool, err error) {
	if rec == nil {
		return nil, false, nil
	}
	if len(rec.Groups) != len(groups) {
		return nil, false, fmt.Errorf("%w: %d groups in the record, %d in the database", errCursorLayout, len(rec.Groups), len(groups))
	}
	for i, g := range groups {
		j := slices.IndexFunc(rec.Groups, func(k txnCursorGroup) bool { return slices.Equal(k.Buckets, g.buckets) })
		if j < 0 {
			return nil, false, fmt.Errorf("%w: no group of buckets %v in the record", errCursorLayout, g.buckets)
		}
		kx, err := posKey(rec.Groups[j].Snap, rec.Groups[j].Next, rec.Groups[j].Last)
		if err != nil {
			return nil, false, err
		}
		gx, err := posKey(g.snap.text, g.next.text, g.last)
		if err != nil {
			return nil, false, err
		}
		dbAhead = dbAhead || slices.Compare(gx, kx) > 0
		if slices.Compare(kx, gx) > 0 {
			if adopt == nil {
				adopt = map[int]txnCursorGroup{}
			}
			adopt[i] = rec.Groups[j]
		}
	}
	return adopt, dbAhead, nil
}

// posKey orders positions: the xmax of the snapshot the group stands at (each snapshot the relay
// takes has a later xmax than the last: it is widened to the relay's own transaction id), then
// whether a range from there is under way (next set), then the last id published within it. A
// position with no snapshot (before the first batch) comes first.
func posKey(snap, next string, last int64) ([]int64, error) {
	sx, err := snapXmax(snap)
	if err != nil {
		return nil, err
	}
	if next == "" {
		return []int64{sx, 0, 0, 0}, nil // between batches: before any range that starts there
	}
	nx, err := snapXmax(next)
	if err != nil {
		return nil, err
	}
	return []int64{sx, 1, nx, last}, nil
}

// snapXmax is the xmax of a pg_snapshot in text form ("xmin:xmax:xip,..."); -1 for none.
func snapXmax(s string) (int64, error) {
	if s == "" {
		return -1, nil
	}
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 {
		return 0, fmt.Errorf("snapshot %q is not xmin:xmax:xip", s)
	}
	xmin, err1 := strconv.ParseInt(parts[0], 10, 64)
	xmax, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil || xmin > xmax {
		return 0, fmt.Errorf("snapshot %q is not xmin:xmax:xip", s)
	}
	return xmax, nil
}
