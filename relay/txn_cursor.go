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
	// Dead: events published to the dead-letter topic since the database last confirmed a
	// write: recorded in <table>_dead_lettered again if the relay ended before.
	Dead []txnDead `json:"dead,omitempty"`
}

// txnDead is a dead letter as <table>_dead_lettered records it.
type txnDead struct {
	ID      int64  `json:"id"`
	EventID string `json:"eventId"`
	AggID   string `json:"aggregateId"`
	Error   string `json:"error"`
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
	return txnTablePrefix(systemID, table) + fmt.Sprintf("gen-%d/shard-%d-of-%d", gen, index, count)
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

// errCursorLayout: committed cursor records that disagree within one of the database's cursor
// rows (positions for some of its buckets and not others, or different ones, ahead of the row):
// no position can be adopted for the row as a whole.
var errCursorLayout = errors.New("the cursor records do not agree with the database's cursor rows")

// txnTablePrefix is the part of txnShardID common to every shard of every layout of a table.
func txnTablePrefix(systemID, table string) string {
	return fmt.Sprintf("outbox-relay/%s/%s/", systemID, table)
}

// txnGeneration is the layout generation a shard id of the table with prefix names (ok false
// for a key that is not such a shard id).
func txnGeneration(prefix, id string) (gen int64, ok bool) {
	rest, found := strings.CutPrefix(id, prefix)
	if !found {
		return 0, false
	}
	var index, count int
	n, err := fmt.Sscanf(rest, "gen-%d/shard-%d-of-%d", &gen, &index, &count)
	return gen, err == nil && n == 3 && fmt.Sprintf("gen-%d/shard-%d-of-%d", gen, index, count) == rest
}

// reconcileCursor compares the database's cursor rows (groups) with committed cursor records
// and returns the positions to adopt, by group index (nil when the database's are current), and
// the records they come from (by index: their parks and unparks follow them). A record is ahead
// of the database after a crash between a commit and the database's copy (or when the database's
// copy was coalesced), for its shard's own rows or, after a reshard, for rows of the layout
// before, which may since have been split or merged: so positions pair bucket by bucket. Each
// bucket's position is the furthest any record gives it (positions only move forward); a row
// adopts one where every bucket of the row has the same, ahead of the row's. The database is
// ahead only where the shard published at-least-once since the record: it stands (dbAhead).
// Records that give a row's buckets positions ahead of it that differ, or give only some of them
// one, are errCursorLayout.
func reconcileCursor(groups []*cursorGroup, recs []txnCursor) (adopt map[int]txnCursorGroup, from []int, dbAhead bool, err error) {
	type pos struct {
		rec int
		g   *txnCursorGroup
		key []int64
	}
	best := map[int16]pos{}
	for ri := range recs {
		for gi := range recs[ri].Groups {
			k := &recs[ri].Groups[gi]
			key, err := posKey(k.Snap, k.Next, k.Last)
			if err != nil {
				return nil, nil, false, err
			}
			for _, b := range k.Buckets {
				if cur, ok := best[b]; !ok || slices.Compare(key, cur.key) > 0 {
					best[b] = pos{rec: ri, g: k, key: key}
				}
			}
		}
	}
	used := map[int]bool{}
	for i, g := range groups {
		gx, err := posKey(g.snap.text, g.next.text, g.last)
		if err != nil {
			return nil, nil, false, err
		}
		var cand *pos
		partial, differ, ahead := false, false, false
		for _, b := range g.buckets {
			p, ok := best[b]
			if !ok {
				partial = true
				continue
			}
			ahead = ahead || slices.Compare(p.key, gx) > 0
			dbAhead = dbAhead || slices.Compare(gx, p.key) > 0
			switch {
			case cand == nil:
				cand = &p
			case !samePos(*cand.g, *p.g):
				differ = true
			}
		}
		if !ahead {
			continue
		}
		if partial || differ {
			return nil, nil, false, fmt.Errorf("%w: the cursor row of buckets %v stands behind the committed records of some of its buckets and not of others", errCursorLayout, g.buckets)
		}
		if adopt == nil {
			adopt = map[int]txnCursorGroup{}
		}
		adopt[i] = *cand.g
		used[cand.rec] = true
	}
	for ri := range recs {
		if used[ri] {
			from = append(from, ri)
		}
	}
	return adopt, from, dbAhead, nil
}

// samePos reports whether two record groups give the same position.
func samePos(a, b txnCursorGroup) bool {
	return a.Snap == b.Snap && a.Next == b.Next && a.Last == b.Last && a.SnapFloor == b.SnapFloor &&
		a.NextFloor == b.NextFloor && a.NextCeil == b.NextCeil
}

// posKey orders positions: the snapshot the group stands at (snapKey), then whether a range
// from there is under way (next set), then the snapshot it runs to and the last id published
// within it. A position with no snapshot (before the first batch) comes first.
func posKey(snap, next string, last int64) ([]int64, error) {
	sx, err := snapKey(snap)
	if err != nil {
		return nil, err
	}
	if next == "" {
		return []int64{sx[0], sx[1], 0, 0, 0, 0}, nil // between batches: before any range that starts there
	}
	nx, err := snapKey(next)
	if err != nil {
		return nil, err
	}
	return []int64{sx[0], sx[1], 1, nx[0], nx[1], last}, nil
}

// snapKey orders the snapshots the relays take: by xmax, widened to the next transaction id to
// be assigned when the snapshot was taken (openSQL), which never goes back; two snapshots with
// the same xmax were taken with no id assigned between them, so the later one lists a subset of
// the earlier one's transactions in progress (those still in progress): fewer is later, the same
// list the same snapshot. (Until the open statement took no id, each snapshot took one, and its
// xmax alone ordered them.) s is pg_snapshot text, "xmin:xmax:xip,..."; {-1, 0} for none.
func snapKey(s string) ([2]int64, error) {
	if s == "" {
		return [2]int64{-1, 0}, nil
	}
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 {
		return [2]int64{}, fmt.Errorf("snapshot %q is not xmin:xmax:xip", s)
	}
	xmin, err1 := strconv.ParseInt(parts[0], 10, 64)
	xmax, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil || xmin > xmax {
		return [2]int64{}, fmt.Errorf("snapshot %q is not xmin:xmax:xip", s)
	}
	inProgress := 0
	if parts[2] != "" {
		inProgress = strings.Count(parts[2], ",") + 1
	}
	return [2]int64{xmax, -int64(inProgress)}, nil
}
