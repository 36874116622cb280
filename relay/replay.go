// Replays: publishing retained events again (outboxdb/replay.go, migration 00014_replays.sql).
//
// The aux goroutine asks every ReplayCheckInterval, with one index probe, whether a replay waits
// that no relay runs; only then does a replay goroutine start. It opens a connection of its own and tries the
// table's replay lock (outboxdb.ReplayLock): one relay at a time runs the table's replays, the
// oldest first, whatever its shard, layout or tracking mode, and whether it publishes or stands
// by. The lock is a session lock: a relay that dies gives it up with its connection, and the
// next relay to look resumes the replay it was running.
//
// A replay reads its range in id order, the order the relay publishes each aggregate's events
// in, the events that were published (outboxdb's replayEligible: not pending, parked or
// dead-lettered), and publishes each with the relay's headers (its own event_id) and
// HeaderReplay, to its topic or the replay's. It publishes a batch in chunks of one produce
// request per partition, each after the previous one's outcome; a failed message is retried
// with the messages of the chunk that failed with it, before anything later, so each
// aggregate's copies arrive in order (a consumer with an inbox sees them in order after dropping
// duplicates). After each batch it commits last_id (the batch's last position) and the count:
// a relay that stops cleanly (SIGTERM) finishes and commits its batch; one that dies publishes
// the batch it had not committed again after the restart, nothing more.
//
// Replays do not touch the rows, the bucket locks, the cursor or the lock connection: the
// normal stream goes on meanwhile, and on the topic the copies interleave with the new events
// of the same aggregates. They are copies of events already delivered; a consumer dedupes them
// by event_id.

package relay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
)

// DefaultReplayCheckInterval is how often a relay asks whether a replay waits, when no
// notification (outboxdb.ReplayNotification, sent by outboxdb.RequestReplay) told it: a safety
// net, so that an idle relay costs its database almost nothing.
const DefaultReplayCheckInterval = time.Minute

// replayJob is a claimed replay: its row's id, position, end, filter and pace.
type replayJob struct {
	id       int64
	last, to int64
	agg      *string
	topic    *string
	rate     int32
	replayed int64
	idText   []byte // the HeaderReplay value
}

// replayBatch is the batch size of a replay: the relay's, or a tenth of a second's worth of
// events under a rate, so that the pace is even.
func replayBatch(batchSize int, rate int32) int {
	if rate <= 0 {
		return batchSize
	}
	return max(1, min(batchSize, int(rate)/10))
}

// checkReplays runs on the aux connection: when a replay waits and none runs in this relay, it
// starts the replay goroutine. It returns when to check again.
func (r *Relay) checkReplays(ctx, pubCtx context.Context, conn *pgx.Conn) time.Time {
	next := time.Now().Add(r.cfg.ReplayCheckInterval)
	if r.replaying.Load() {
		return next
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	var open bool
	if err := conn.QueryRow(qctx, r.replaySQL.Open, r.lockKey).Scan(&open); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: migrations before 00014
			return time.Now().Add(time.Minute)
		}
		if ctx.Err() == nil {
			r.log.Debug("looking for replays failed", "err", r.red.Error(err))
		}
		return next
	}
	if !open {
		return next
	}
	r.replaying.Store(true)
	r.replays.Add(1)
	go func() {
		defer r.replays.Done()
		defer r.replaying.Store(false)
		if err := r.runReplays(ctx, pubCtx); err != nil && ctx.Err() == nil {
			r.log.Warn("running replays failed; trying again", "err", r.red.Error(err),
				"retry_in", r.cfg.ReplayCheckInterval.String())
		}
	}()
	return next
}

// runReplays runs the table's open replays one after the other, if it gets the replay lock.
func (r *Relay) runReplays(ctx, pubCtx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, r.replayCfg)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	tuneSession(ctx, conn)
	var locked bool
	if err := conn.QueryRow(ctx, r.replaySQL.Lock, r.lockKey).Scan(&locked); err != nil {
		return err
	}
	if !locked {
		return nil // another relay runs them
	}
	for ctx.Err() == nil {
		job, ok, err := r.claimReplay(ctx, conn)
		if err != nil || !ok {
			return err
		}
		if err := r.runReplay(ctx, pubCtx, conn, job); err != nil {
			return err
		}
	}
	return nil
}

func (r *Relay) claimReplay(ctx context.Context, conn *pgx.Conn) (*replayJob, bool, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	var j replayJob
	err := conn.QueryRow(qctx, r.replaySQL.Claim, r.replayRunner).Scan(&j.id, &j.last, &j.to, &j.agg, &j.topic, &j.rate, &j.replayed)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	j.idText = []byte(strconv.FormatInt(j.id, 10))
	return &j, true, nil
}

// errReplayEvent fails a replay: an event of its range cannot be published again as it is.
type errReplayEvent struct{ msg string }

func (e errReplayEvent) Error() string { return e.msg }

// runReplay runs one claimed replay until it is done, failed or cancelled, or ctx ends (then it
// commits the batch in flight and returns nil: the replay stays running, for the next relay).
func (r *Relay) runReplay(ctx, pubCtx context.Context, conn *pgx.Conn, j *replayJob) error {
	log := r.log.With("replay", j.id)
	if j.replayed == 0 {
		log.Info("replay starting", "after_position", j.last, "to_position", j.to, "rate", j.rate)
	} else {
		log.Info("replay resuming", "after_position", j.last, "to_position", j.to, "replayed", j.replayed, "rate", j.rate)
	}
	size := replayBatch(r.cfg.BatchSize, j.rate)
	b := &batch{arena: make([]byte, 0, 64<<10), rows: make([]row, 0, size)}
	var (
		keys  = headerKeys{} // r.keys belongs to the loop goroutine
		start = time.Now()
		sent  int64 // since start, for the pace
	)
	outages := 0 // the schema registry's, in a row
	for ctx.Err() == nil {
		if err := r.fetchReplay(ctx, conn, j, size, b); err != nil {
			return err
		}
		if len(b.rows) == 0 {
			if err := r.endReplay(conn, j, r.replaySQL.Finish, j.id); err != nil {
				return err
			}
			log.Info("replay done", "replayed", j.replayed)
			return nil
		}
		if err := r.replayMessages(j, b, keys); err != nil {
			if registryUnavailable(err) {
				// Not the events': the same rows are fetched again after the backoff.
				outages++
				d := r.cfg.OutageBackoff.Delay(outages)
				log.Warn("replay: schema registry unavailable; retrying", "err", r.red.Error(err), "retry_in", d.Round(time.Millisecond).String())
				sleepCtx(ctx, d)
				continue
			}
			log.Warn("replay failed", "err", err.Error())
			return r.endReplay(conn, j, r.replaySQL.Fail, j.id, err.Error())
		}
		if j.rate > 0 { // the pace: n events may go out n/rate seconds after the start
			due := start.Add(time.Duration(float64(sent) / float64(j.rate) * float64(time.Second)))
			if !sleepCtx(ctx, time.Until(due)) && ctx.Err() != nil {
				return nil
			}
		}
		if err := r.publishReplay(ctx, pubCtx, b); err != nil {
			var ev errReplayEvent
			if errors.As(err, &ev) {
				log.Warn("replay failed", "err", err.Error())
				return r.endReplay(conn, j, r.replaySQL.Fail, j.id, err.Error())
			}
			return err // the relay is stopping: the batch is published again by the next run
		}
		outages = 0
		n := int64(len(b.rows))
		sent += n
		last := b.rows[len(b.rows)-1].id
		qctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
		ct, err := conn.Exec(qctx, r.replaySQL.Progress, j.id, last, n)
		cancel()
		if err != nil {
			return err
		}
		r.metrics.replayed.Add(float64(n))
		j.last, j.replayed = last, j.replayed+n
		if ct.RowsAffected() == 0 {
			log.Info("replay cancelled", "replayed", j.replayed)
			return nil
		}
	}
	return nil
}

func (r *Relay) endReplay(conn *pgx.Conn, j *replayJob, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	_, err := conn.Exec(ctx, sql, args...)
	return err
}

// fetchReplay reads the next events of j into b.
func (r *Relay) fetchReplay(ctx context.Context, conn *pgx.Conn, j *replayJob, size int, b *batch) error {
	b.arena, b.rows = b.arena[:0], b.rows[:0]
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	rows, err := conn.Query(qctx, r.replaySQL.Fetch, j.last, j.to, j.agg, size)
	if err != nil {
		return err
	}
	defer rows.Close()
	var fds []pgconn.FieldDescription
	for rows.Next() {
		if fds == nil {
			fds = rows.FieldDescriptions()
		}
		if err := b.scanRow(rows.RawValues(), fds); err != nil {
			return err
		}
	}
	return rows.Err()
}

// replayMessages builds b's messages: the relay's headers and HeaderReplay, to the replay's
// topic or the event's.
func (r *Relay) replayMessages(j *replayJob, b *batch, keys headerKeys) error {
	b.msgs, b.sizes, b.hdrs = b.msgs[:0], b.sizes[:0], b.hdrs[:0]
	for i := range b.rows {
		row := &b.rows[i]
		hstart := len(b.hdrs)
		var err error
		if b.hdrs, err = appendEventHeaders(b.hdrs, row, keys); err != nil {
			return errReplayEvent{fmt.Sprintf("event %s (position %d): %v", row.eventID, row.id, err)}
		}
		if col := emptyColumn(row); col != "" {
			return errReplayEvent{fmt.Sprintf("event %s (position %d): empty %s", row.eventID, row.id, col)}
		}
		noTopic := r.route(row, b.hdrs[hstart:], keys)
		if j.topic != nil {
			row.topic = *j.topic
		} else if noTopic != "" {
			return errReplayEvent{fmt.Sprintf("event %s (position %d): %s; replay it with a topic", row.eventID, row.id, noTopic)}
		}
		value, noValue := r.value(row)
		if noValue != "" {
			return errReplayEvent{fmt.Sprintf("event %s (position %d): %s", row.eventID, row.id, noValue)}
		}
		if r.schemas != nil {
			var noSchema string
			if value, noSchema, err = r.frameValue(b, row, value); err != nil {
				return err // the registry's outage: the replay is retried
			}
			if noSchema != "" {
				return errReplayEvent{fmt.Sprintf("event %s (position %d): %s", row.eventID, row.id, noSchema)}
			}
		}
		value = r.cloudEvent(b, row, value, hstart, keys)
		b.hdrs = append(b.hdrs, kafka.Header{Key: HeaderReplay, Value: j.idText})
		hdrs := b.hdrs[hstart:len(b.hdrs):len(b.hdrs)]
		size := messageSize(row.key, value, hdrs)
		if size > r.pub.callBytes() {
			return errReplayEvent{fmt.Sprintf("event %s (position %d): message of about %d bytes exceeds the %d bytes a produce request may carry", row.eventID, row.id, size, r.pub.callBytes())}
		}
		b.msgs = append(b.msgs, kafka.Message{Topic: row.topic, Key: row.key, Value: value, Headers: hdrs})
		b.sizes = append(b.sizes, size)
	}
	return nil
}

// maxReplayAttempts bounds the attempts of a message a broker refuses (not for want of a
// reachable broker: that is retried until the relay stops).
const maxReplayAttempts = 8

// publishReplay publishes b's messages in chunks of one produce request per partition, each
// after the previous one is acknowledged whole; the failed messages of a chunk are retried,
// with backoff, before anything later. It writes under pubCtx (a stopping relay finishes the
// chunk in flight) and stops retrying when ctx ends. It returns an errReplayEvent when a broker
// keeps refusing a message, an error when the relay stops first.
func (r *Relay) publishReplay(ctx, pubCtx context.Context, b *batch) error {
	n := len(b.msgs)
	for start := 0; start < n; {
		end := chunkEnd(b.sizes, start, r.pub.callBytes())
		msgs := append(b.tmpMsgs[:0], b.msgs[start:end]...)
		for attempt := 1; len(msgs) > 0; attempt++ {
			errs := append(b.tmpErrs[:0], make([]error, len(msgs))...)
			if !r.pub.write(pubCtx, msgs, errs) {
				b.tainted = true
			}
			failed := msgs[:0]
			var last error
			for k := range msgs {
				if errs[k] != nil {
					failed = append(failed, msgs[k])
					last = errs[k]
				}
			}
			msgs = failed
			if len(msgs) == 0 {
				break
			}
			if ctx.Err() != nil || pubCtx.Err() != nil {
				return errors.New("the relay is stopping")
			}
			if r.classify(last) != failUnreachable && attempt >= maxReplayAttempts {
				return errReplayEvent{fmt.Sprintf("kafka refused %d message(s) %d times, the last to topic %s: %v", len(msgs), attempt, msgs[len(msgs)-1].Topic, r.red.Error(last))}
			}
			d := r.cfg.OutageBackoff.Delay(attempt)
			r.log.Warn("replay: publishing failed; retrying", "err", r.red.Error(last), "messages", len(msgs), "retry_in", d.Round(time.Millisecond).String())
			if !sleepCtx(ctx, d) {
				return errors.New("the relay is stopping")
			}
		}
		b.tmpMsgs = msgs[:0]
		start = end
	}
	return nil
}

// replayRunner names the process running a replay in <table>_replays.runner.
func replayRunner(shard int) string {
	host, _ := os.Hostname()
	return host + " shard " + strconv.Itoa(shard) + " pid " + strconv.Itoa(os.Getpid())
}
