// What is published and what a publication did: the batch made into messages (topics, poison,
// held-back aggregates), its publication, and its outcome settled into row states.

package relay

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// blockedIDs returns the aggregates whose backoff has not ended, and forgets the entries that
// ended long ago.
func (r *Relay) blockedIDs(now time.Time) []string {
	if len(r.blocked) == 0 {
		r.metrics.blocked.Set(0)
		return nil
	}
	ids := make([]string, 0, len(r.blocked))
	for id, e := range r.blocked {
		switch {
		case e.until.After(now):
			ids = append(ids, id)
		case now.Sub(e.until) > r.cfg.RetryBackoff.Max:
			delete(r.blocked, id)
		}
	}
	sort.Strings(ids)
	r.metrics.blocked.Set(float64(len(ids)))
	return ids
}

// block holds back the aggregate's later events for d.
func (r *Relay) block(aggID []byte, d time.Duration, failures int) {
	r.blocked[string(aggID)] = blockEntry{until: time.Now().Add(d), failures: failures}
}

// route sets where row goes and its key, from hdrs, its headers as appendEventHeaders built them
// (nil where they are malformed): the topic its --topic-header member names, or else the one the
// topic map gives its --topic-by column, or else the default topic; the key its --key-header
// member holds, or else its aggregate id (keys interns the topics named by headers). noTopic,
// "" when a topic was found, says why none was.
func (r *Relay) route(row *row, hdrs []kafka.Header, keys headerKeys) (noTopic string) {
	row.key = row.aggID
	if r.cfg.KeyHeader != "" {
		if v, ok := headerValue(hdrs, r.cfg.KeyHeader); ok {
			row.key = v
		}
	}
	if r.cfg.TopicHeader != "" {
		if v, ok := headerValue(hdrs, r.cfg.TopicHeader); ok {
			if err := checkTopic("header "+r.cfg.TopicHeader, string(v)); err != nil {
				row.topic = ""
				return err.Error()
			}
			row.topic = keys.intern(v)
			return ""
		}
	}
	by, what := row.aggType, "aggregate type"
	if r.cfg.TopicBy == contract.TopicByEventType {
		by, what = row.eventType, "event type"
	}
	if t, ok := r.cfg.TopicMap[string(by)]; ok {
		row.topic = t
		return ""
	}
	if r.cfg.DefaultTopic != "" {
		row.topic = r.cfg.DefaultTopic
		return ""
	}
	row.topic = ""
	how := ""
	if r.cfg.TopicHeader != "" {
		how = fmt.Sprintf("no header %q, ", r.cfg.TopicHeader)
	}
	return fmt.Sprintf("no topic for %s %q (%snot in --topic-map, and no --default-topic)", what, by, how)
}

// value returns the record's value for row: its payload (bytes or JSON), or nil (a tombstone)
// for an event without one where --null-payload tombstone, an empty bytes payload included.
// noValue, "" when the row has a value to publish, says why it has none.
func (r *Relay) value(row *row) (v []byte, noValue string) {
	tombstones := r.cfg.NullPayload == contract.NullPayloadTombstone
	switch {
	case row.noValue && !tombstones:
		return nil, "the event has no value (payload and payload_bytes are NULL) and --null-payload is poison"
	case row.noValue, tombstones && len(row.payload) == 0:
		return nil, ""
	}
	return row.payload, ""
}

// headerValue returns the value of the header named name among hdrs past the four standard
// ones (a row's own headers).
func headerValue(hdrs []kafka.Header, name string) ([]byte, bool) {
	for i := min(4, len(hdrs)); i < len(hdrs); i++ {
		if hdrs[i].Key == name {
			return hdrs[i].Value, true
		}
	}
	return nil, false
}

// prepare decides, row by row in id order, what to publish: it skips the events of aggregates
// that are blocked or failed in the batch before (and the later events of an aggregate one of
// whose events is skipped, poison or dead-lettered in this batch), deals with poison events,
// and builds the messages. parked holds the events parked per aggregate (snapshot tracking; nil
// for none): an aggregate's later events wait behind them.
func (r *Relay) prepare(b *batch, now time.Time, lastFailed map[string]struct{}, parked map[string]int) {
	clear(r.skip)
	b.msgs = b.msgs[:0]
	b.pre = b.pre[:0]
	b.msgRows = b.msgRows[:0]
	b.sizes = b.sizes[:0]
	b.hdrs = b.hdrs[:0]
	b.inflight = b.inflight[:0]
	for i := range b.rows {
		row := &b.rows[i]
		if _, ok := r.skip[string(row.aggID)]; ok {
			row.state = rowSkipped
			continue
		}
		if n := parked[string(row.aggID)]; n > 0 {
			// The aggregate has parked events; this one waits behind them.
			row.state = rowSkipped
			r.skip[string(row.aggID)] = struct{}{}
			continue
		}
		_, failed := lastFailed[string(row.aggID)]
		entry, retrying := r.blocked[string(row.aggID)]
		if failed || retrying && entry.until.After(now) {
			row.state = rowSkipped
			r.skip[string(row.aggID)] = struct{}{}
			continue
		}
		if retrying {
			// An aggregate whose event failed is retried with that event alone, so that a failure
			// is charged to the event that causes it, not to its successors sharing its request.
			r.skip[string(row.aggID)] = struct{}{}
		}
		hstart := len(b.hdrs)
		var hdrErr error
		b.hdrs, hdrErr = appendEventHeaders(b.hdrs, row, r.keys)
		if hdrErr != nil {
			b.hdrs = b.hdrs[:hstart+4] // the standard headers only
		}
		noTopic := r.route(row, b.hdrs[hstart:], r.keys)
		topic, known := row.topic, noTopic == ""
		value, noValue := r.value(row)
		empty := emptyColumn(row)
		var noSchema string
		var unavailable error
		if r.schemas != nil && empty == "" && noTopic == "" && noValue == "" && hdrErr == nil {
			value, noSchema, unavailable = r.frameValue(b, row, value)
		}
		size := messageSize(row.key, value, b.hdrs[hstart:])
		reason, detail := r.poisonReason(row, empty, noTopic, noValue, noSchema, size, hdrErr)
		row.poison = reason
		if reason != "" && r.handlePoison(b, i, row, reason, detail, known, topic, size, hstart) {
			continue
		}
		if unavailable != nil {
			// The registry could not be asked: the message fails without being sent, as it
			// would for want of a broker, and holds back its aggregate's later events.
			r.addMessage(b, i, row, row.payload, b.hdrs[hstart:len(b.hdrs):len(b.hdrs)])
			b.setPreErr(len(b.msgs)-1, unavailable)
			r.skip[string(row.aggID)] = struct{}{}
			continue
		}
		value = r.cloudEvent(b, row, value, hstart, r.keys)
		if r.cfg.CloudEvents != contract.CloudEventsNone {
			// The envelope grows the message (a bytes payload by a third, as data_base64): one
			// that no longer fits a produce request is poison now, not a broker's refusal later.
			if size := messageSize(row.key, value, b.hdrs[hstart:]); size > r.pub.callBytes() {
				row.poison = reasonOversized
				detail := fmt.Sprintf("poison: the CloudEvent of about %d bytes (payload, envelope and headers) exceeds the %d bytes a produce request may carry", size, r.pub.callBytes())
				if r.handlePoison(b, i, row, reasonOversized, detail, known, topic, size, hstart) {
					continue
				}
			}
		}
		r.addMessage(b, i, row, value, b.hdrs[hstart:len(b.hdrs):len(b.hdrs)])
	}
}

// frameValue frames value, row's, in the Schema Registry wire format (schema_registry.go): it
// returns the framed value, or why the event is poison, or the registry's outage.
func (r *Relay) frameValue(b *batch, row *row, value []byte) (framed []byte, noSchema string, unavailable error) {
	if value == nil {
		return nil, "", nil // a tombstone stays null
	}
	switch json := r.cfg.Schemas.Format == contract.SchemaJSON; {
	case json && row.isBytes:
		return nil, "poison: the event has payload_bytes, and --schema-format json frames the jsonb payload", nil
	case !json && !row.isBytes:
		return nil, "poison: the event has a JSON payload, and --schema-format " + string(r.cfg.Schemas.Format) + " frames payload_bytes (the encoded message)", nil
	}
	framed, b.arena, noSchema, unavailable = r.schemas.frame(context.Background(), row.topic, string(row.eventType), value, b.arena)
	return framed, noSchema, unavailable
}

func (r *Relay) addMessage(b *batch, i int, row *row, value []byte, hdrs []kafka.Header) {
	row.state = rowInFlight
	m := kafka.Message{Topic: row.topic, Key: row.key, Value: value, Headers: hdrs}
	if r.cfg.RecordTimestamp != contract.TimestampProduce {
		m.Time = row.createdAt // the publisher stamps the others with the produce time
	}
	b.msgs = append(b.msgs, m)
	b.msgRows = append(b.msgRows, i)
	b.sizes = append(b.sizes, messageSize(row.key, value, hdrs))
	b.inflight = append(b.inflight, row.id)
}

// publish writes b's messages in chunks that fit one produce request per partition. A chunk
// is written only after the previous one's outcome is known, without the events of aggregates
// that failed in it. It runs on its own goroutine and closes b.done.
func (r *Relay) publish(ctx context.Context, b *batch) {
	if b.txn != nil {
		r.publishTxn(ctx, b)
		return
	}
	defer close(b.done)
	n := len(b.msgs)
	b.errs = append(b.errs[:0], make([]error, n)...)
	var failed map[string]struct{}
	for start := 0; start < n; {
		end := chunkEnd(b.sizes, start, r.pub.callBytes())
		msgs, errs := b.msgs[start:end], b.errs[start:end]
		// The aggregate of message k of the chunk (its key may be another: --key-header).
		agg := func(k int) string { return string(b.rows[b.msgRows[start+k]].aggID) }
		sent := time.Now()
		if failed != nil || len(b.pre) > start {
			b.tmpMsgs, b.tmpIdx = b.tmpMsgs[:0], b.tmpIdx[:0]
			for k := range msgs {
				if err := b.preErr(start + k); err != nil {
					errs[k] = err
					continue
				}
				if _, ok := failed[agg(k)]; ok {
					errs[k] = errSkipped
					continue
				}
				b.tmpMsgs = append(b.tmpMsgs, msgs[k])
				b.tmpIdx = append(b.tmpIdx, k)
			}
			b.tmpErrs = append(b.tmpErrs[:0], make([]error, len(b.tmpMsgs))...)
			if !r.pub.write(ctx, b.tmpMsgs, b.tmpErrs) {
				b.tainted = true
			}
			for j, k := range b.tmpIdx {
				errs[k] = b.tmpErrs[j]
				msgs[k].Partition = b.tmpMsgs[j].Partition
			}
		} else if !r.pub.write(ctx, msgs, errs) {
			b.tainted = true
		}
		r.trace.spans(msgs, errs, b.rows, b.msgRows[start:end], sent)
		for k := range msgs {
			if errs[k] != nil && !errors.Is(errs[k], errSkipped) {
				if failed == nil {
					failed = map[string]struct{}{}
				}
				failed[agg(k)] = struct{}{}
			}
		}
		start = end
	}
}

// settle turns the outcome of b's publication into row states, blocks the aggregates that
// failed and returns them. outage reports that every message failed for want of a reachable
// broker; then no aggregate is blocked and no attempt is counted: the relay backs off as a whole.
func (r *Relay) settle(b *batch) (failed map[string]struct{}, outage bool) {
	if b.settled {
		return nil, false
	}
	b.settled = true
	attempted, unreachable := 0, 0
	sent, sentUnreachable := 0, 0 // the messages sent to Kafka (not failed before: the registry's)
	var kafkaErr error
	for k := range b.msgs {
		err := b.errs[k]
		if errors.Is(err, errSkipped) {
			continue
		}
		attempted++
		// A message failed before it was sent failed for the registry's outage (the relay's,
		// as the brokers'); one sent is classified by the publisher alone.
		down := b.preErr(k) != nil
		if !down {
			sent++
			if r.pub.classify(err).clusters() {
				sentUnreachable++
				kafkaErr = err
				down = true
			}
		}
		if down {
			unreachable++
			b.outageErr = err
		}
	}
	outage = attempted > 0 && unreachable == attempted
	if !outage {
		r.outages = 0
	}
	if sent > 0 {
		r.kafkaReached(sent == sentUnreachable, kafkaErr)
	}
	var (
		published, errorsN int
		firstErr           string
		firstRow           *row
		firstDelay         time.Duration
	)
	for k := range b.msgs {
		row := &b.rows[b.msgRows[k]]
		err := b.errs[k]
		switch {
		case errors.Is(err, errSkipped):
			row.state = rowSkipped
		case err == nil && r.deadLetter(row):
			row.state = rowDeadSent
			row.inc = 1
			delete(r.blocked, string(row.aggID))
		case err == nil:
			row.state = rowSent
			published++
			delete(r.blocked, string(row.aggID))
		default:
			if _, seen := failed[string(row.aggID)]; seen {
				// A later event of an aggregate whose earlier event failed in the same request:
				// the failure is charged to the earlier one; this one waits, untouched.
				row.state = rowSkipped
				continue
			}
			errorsN++
			msg, d := r.failRow(row, err, outage)
			if failed == nil {
				failed = map[string]struct{}{}
			}
			failed[string(row.aggID)] = struct{}{}
			if !outage && firstErr == "" {
				firstErr, firstRow, firstDelay = msg, row, d
			}
		}
	}
	if firstRow != nil {
		r.log.Warn("publish failed; holding back the later events of the failed aggregates", "events", errorsN,
			"err", firstErr, "first_id", firstRow.id, "first_event_id", string(firstRow.eventID),
			"first_aggregate_id", string(firstRow.aggID), "attempts", int(firstRow.attempts)+int(firstRow.inc),
			"retry_in", firstDelay.Round(time.Millisecond).String())
	}
	// Rows skipped mid-flight belong to failed aggregates already; make sure of it.
	for k := range b.msgs {
		if errors.Is(b.errs[k], errSkipped) {
			if failed == nil {
				failed = map[string]struct{}{}
			}
			failed[string(b.rows[b.msgRows[k]].aggID)] = struct{}{}
		}
	}
	r.metrics.published.Add(float64(published))
	r.publishErrorsInc(errorsN)
	return failed, outage
}

// failRow records that row's publication failed with err: its state and error text and, unless
// every broker was unreachable (outage: not the event's fault, and no aggregate is held back),
// whether the attempt counts against the event (not for the cluster's errors or its refusal of the
// relay) and the backoff that holds its aggregate's later events back. It returns the message and
// that backoff.
func (r *Relay) failRow(row *row, err error, outage bool) (msg string, d time.Duration) {
	row.state = rowFailed
	row.err = err
	msg = r.red.Error(err)
	if row.topic == r.cfg.DeadLetterTopic && row.poison != "" {
		msg = "dead-letter publish to " + row.topic + " failed: " + msg
	} else {
		msg = "publish to " + row.topic + " failed: " + msg
	}
	row.errText = truncate(msg, 2000)
	if outage {
		row.inc = 0
		return msg, 0
	}
	e := r.blocked[string(row.aggID)]
	n := e.failures + 1
	if r.classify(err).clusters() { // the cluster's (or the registry's), or its refusal of the relay
		row.inc = 0
	} else {
		row.inc = 1
		n = max(n, int(row.attempts)+1)
	}
	if row.poison == reasonSkipped {
		row.inc = 0 // attempts holds the request to dead-letter it: it stands
	}
	d = r.cfg.RetryBackoff.Delay(n)
	if int(row.attempts)+int(row.inc) >= r.cfg.MaxAttempts {
		d = r.cfg.RetryBackoff.Longest()
	}
	r.block(row.aggID, d, n)
	r.log.Debug("publish failed; holding back the aggregate's later events", "err", msg, "id", row.id,
		"event_id", string(row.eventID), "aggregate_id", string(row.aggID), "attempts", int(row.attempts)+int(row.inc),
		"retry_in", d.Round(time.Millisecond).String())
	return msg, d
}

// classify says what a message's error means (publisher.classify): the schema registry's
// outage is the relay's, as the brokers' is.
func (r *Relay) classify(err error) failure {
	if registryUnavailable(err) || txnLost(err) {
		return failUnreachable
	}
	return r.pub.classify(err)
}

func (r *Relay) publishErrorsInc(n int) {
	if n > 0 {
		r.metrics.publishErrors.Add(float64(n))
	}
}

// deadLetter reports whether row's message goes to the dead-letter topic as a dead letter (once
// acknowledged, recorded in <table>_dead_lettered).
func (r *Relay) deadLetter(row *row) bool {
	return row.topic == r.cfg.DeadLetterTopic && row.poison != "" &&
		(r.cfg.PoisonPolicy == PoisonDeadLetter || row.poison == reasonSkipped)
}
