// Where a row-tracking fetch starts reading: past what the fetches before it have read, rather
// than at the oldest unsent row (docs/architecture.md, "Tracking progress").

package relay

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// resumeFullEvery bounds how long a relay under row tracking goes without reading its buckets
// from their oldest unsent row: a row made unsent again by hand (sent_at set back to NULL), which
// no resumed read looks for, waits at most this long.
const resumeFullEvery = 30 * time.Second

// resume is the position a row-tracking fetch starts from. A fetch that reads from the oldest
// unsent row passes every row it does not return on every call: the events of blocked
// aggregates (under policy block a poison aggregate's tail grows without bound: 100,000 of them
// made a fetch cost 15 ms instead of 0.3 ms), and, until vacuum removes them, the index entries
// of rows just marked sent (after the drain of a backlog, a million of them). So a fetch reads
// each bucket after its floor, and below the floors only the rows that could not be read before:
//
// Invariant: every unsent row that a fetch may return (not in flight, its aggregate not blocked)
// and that no fetch returned yet has an id above its bucket's floor, or was written by a
// transaction still in progress at the watch snapshot W (listed in its xip, or at or past its
// xmax).
//
// A fetch (one statement, snapshot S, that also answers S and the id sequence's value read after
// S was taken: withPosition) returns, within the batch size: first the rows at or below their
// floor written by the transactions W leaves open (through the (txid, id) index: those in
// progress at W, one by one, and those that began after it, as one range), then each bucket's
// rows above its floor, bucket by bucket in fetch order, in id order. Afterwards the watch
// becomes S: a row with an id up to the sequence's value that S does not show was written by a
// transaction in progress at S (in its xip, or at or past its xmax, as is one that drew its id
// before its transaction id and one that began after S). A bucket read to its end (before the
// one where the batch filled up, or every bucket when it did not fill up) has returned every row
// S shows: its floor moves to the sequence's value (or
// past the rows returned); the bucket where the batch filled up moves its floor to the last row
// returned; the buckets after it keep theirs. Should the rows below the floors alone fill the
// batch (a large transaction open across fetches), their order across transactions is not known
// to be complete: the batch is dropped and the next fetch reads from the oldest unsent row.
//
// Whatever the invariant does not cover starts over from the oldest unsent row (reset): a new
// tenure or connection, an aggregate leaving the blocked set (its backoff ended, a retry), a
// fetched row left unpublished (skipped behind a failed event, or the whole batch put back in an
// outage), and every resumeFullEvery.
type resume struct {
	sharded bool
	floors  [outboxdb.Buckets]int64 // unsharded: floors[0]
	// the watch snapshot W: xmax as text, nil when there is none (nothing below the floors), and
	// the transactions in progress at it.
	xmax *string
	xip  []string
	// the blocked aggregates of the last fetch (sorted)
	blocked []string
	// when the relay last read from the oldest unsent row
	fullAt time.Time
	// what the fetch's position row read (withPosition): its snapshot S and the id sequence's value
	snap string
	seq  int64
}

var noWatch = strconv.FormatUint(math.MaxUint64, 10)

// reset makes the next fetch read every bucket from its oldest unsent row.
func (s *resume) reset() {
	clear(s.floors[:])
	s.xmax, s.xip = nil, nil
}

// beforeFetch decides, for a fetch about to run at now with the blocked aggregates blocked
// (sorted), whether it must read from the oldest unsent row.
func (s *resume) beforeFetch(now time.Time, blocked []string) {
	lost := false
	for _, id := range s.blocked {
		if _, ok := slices.BinarySearch(blocked, id); !ok {
			lost = true
			break
		}
	}
	s.blocked = append(s.blocked[:0], blocked...)
	if lost || now.Sub(s.fullAt) >= resumeFullEvery {
		s.reset()
	}
	if s.xmax == nil && !slices.ContainsFunc(s.floors[:], func(f int64) bool { return f != 0 }) {
		s.fullAt = now
	}
}

// args returns the resume arguments of the fetch (row_queries.go, newQueries): unsharded the floor,
// the watch's xip and xmax; sharded the buckets in fetch order, every bucket's floor (indexed by
// bucket+1), the watch, and the highest floor.
func (s *resume) args(buckets []int16) []any {
	xip, xmax := s.xip, s.xmax
	if xip == nil {
		xip = []string{}
	}
	if xmax == nil {
		// No watch: the highest transaction id, which no row has (rather than NULL, which
		// PostgreSQL folds into a plan that sorts nothing).
		xmax = &noWatch
	}
	if !s.sharded {
		return []any{s.floors[0], xip, xmax}
	}
	var top int64
	for _, b := range buckets {
		top = max(top, s.floors[b])
	}
	return []any{buckets, s.floors[:], xip, xmax, top}
}

// lowest is the lowest floor of the buckets in order.
func (s *resume) lowest(order []int16) int64 {
	if !s.sharded {
		return s.floors[0]
	}
	low := int64(-1)
	for _, b := range order {
		if low < 0 || s.floors[b] < low {
			low = s.floors[b]
		}
	}
	return max(low, 0)
}

// bucketOf is the row's bucket as the fetch reported it (0 unsharded).
func (s *resume) bucketOf(r *row) int16 {
	if !s.sharded {
		return 0
	}
	return r.bucket
}

// afterFetch moves the position past the rows of b, fetched with a batch size of n from the
// buckets in order, and puts the rows read below the floors in id order. It reports false when
// those rows alone filled the batch: b must not be published, and the next fetch reads from the
// oldest unsent row.
func (s *resume) afterFetch(b *batch, order []int16, n int) bool {
	rows := b.rows
	below := 0
	for below < len(rows) && rows[below].id <= s.floors[s.bucketOf(&rows[below])] {
		below++
	}
	if below == n {
		s.reset()
		return false
	}
	// Rows of several transactions come transaction by transaction; an aggregate's in id order.
	slices.SortFunc(rows[:below], func(a, b row) int { return compareInt64(a.id, b.id) })
	if !s.sharded {
		order = []int16{0}
	}
	last := make(map[int16]int64, len(order))
	for i := below; i < len(rows); i++ {
		last[s.bucketOf(&rows[i])] = rows[i].id
	}
	cut := int16(-1) // the bucket where the batch filled up
	if len(rows) == n {
		cut = s.bucketOf(&rows[len(rows)-1])
	}
	for _, bk := range order {
		if bk == cut {
			s.floors[bk] = max(s.floors[bk], last[bk])
			break
		}
		s.floors[bk] = max(s.floors[bk], s.seq, last[bk])
	}
	xmax, xip, err := parseSnapshot(s.snap)
	if err != nil {
		s.reset() // without a watch no floor may stand
		return true
	}
	s.xmax, s.xip = &xmax, xip
	return true
}

func compareInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
