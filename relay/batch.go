package relay

import "github.com/segmentio/kafka-go"

// batch is one fetch: its rows, an arena holding their bytes, and what publishing them needs.
// Batches are reused, so the steady state allocates little per row.
type batch struct {
	arena []byte
	rows  []row

	msgs     []kafka.Message
	msgRows  []int // msgs[k] publishes rows[msgRows[k]]
	sizes    []int // messageSize of msgs[k]
	hdrs     []kafka.Header
	inflight []int64 // ids of the rows handed to the publisher
	errs     []error // outcome of msgs[k]
	// pre[k], where set, is msgs[k]'s outcome before it is sent (the schema registry's outage):
	// it is not sent. Empty when no message has one.
	pre     []error
	tmpMsgs []kafka.Message
	tmpIdx  []int
	tmpErrs []error

	done chan struct{}
	// pos (snapshot tracking) is where the batch leaves its cursor. It travels with the batch,
	// not in the tracker: a batch carried over a lost connection (Relay.carry) is recorded by
	// the next tenure's tracker.
	pos       snapPos
	settled   bool
	retried   bool   // its outcome is written again after a failed round trip
	tainted   bool   // a write call returned early: kafka-go may still read the arena
	outageErr error  // the last "broker unreachable" error seen
	lsn       string // with --wait-for-standbys: the WAL insert position after the fetch
	// txn (exactly-once delivery) is what the batch's transaction carries, and its outcome.
	txn *txnBatch
}

func (b *batch) hasOutcome() bool {
	for i := range b.rows {
		switch b.rows[i].state {
		case rowSent, rowFailed, rowDeadSent:
			return true
		}
	}
	return false
}

// setPreErr records err as message k's outcome before it is sent (see pre).
func (b *batch) setPreErr(k int, err error) {
	if len(b.pre) <= k {
		b.pre = append(b.pre, make([]error, k+1-len(b.pre))...)
	}
	b.pre[k] = err
}

// preErr is message k's outcome before it is sent (nil: send it).
func (b *batch) preErr(k int) error {
	if k < len(b.pre) {
		return b.pre[k]
	}
	return nil
}

// leftPending reports whether prepare left a row of b unpublished and unrecorded: skipped behind
// an earlier event of its aggregate, to be fetched again.
func (b *batch) leftPending() bool {
	for i := range b.rows {
		switch b.rows[i].state {
		case rowSkipped, rowFetched:
			return true
		}
	}
	return false
}

// getBatch returns an empty batch, reusing a released one when it can.
func (r *Relay) getBatch() *batch {
	var b *batch
	if n := len(r.free); n > 0 {
		b = r.free[n-1]
		r.free = r.free[:n-1]
	} else {
		b = &batch{
			arena: make([]byte, 0, 64<<10),
			rows:  make([]row, 0, r.cfg.BatchSize),
		}
	}
	b.arena = b.arena[:0]
	clear(b.rows)
	b.rows = b.rows[:0]
	b.msgs = b.msgs[:0]
	b.msgRows = b.msgRows[:0]
	b.sizes = b.sizes[:0]
	b.hdrs = b.hdrs[:0]
	b.inflight = b.inflight[:0]
	b.errs = b.errs[:0]
	b.pre = b.pre[:0]
	b.done = make(chan struct{})
	b.txn = nil
	b.settled = false
	b.retried = false
	b.pos = snapPos{}
	b.tainted = false
	b.outageErr = nil
	return b
}

// putBatch releases b for reuse.
func (r *Relay) putBatch(b *batch) {
	if b == nil || b.tainted || len(r.free) >= 4 {
		return
	}
	// Drop references into the arena so a shrunken batch does not pin old arrays.
	clear(b.msgs)
	clear(b.hdrs)
	clear(b.tmpMsgs)
	clear(b.errs)
	clear(b.tmpErrs)
	r.free = append(r.free, b)
}
