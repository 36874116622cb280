// Poison events: why an event cannot be published as it is (poisonReason), and what the
// poison policy (--poison-policy) does with one: dead-lettered, its aggregate blocked, or retried.

package relay

import (
	"fmt"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// poisonReason says why row cannot be published as it is ("" when it can): skipped to the
// dead-letter topic by hand, an empty column (empty, from emptyColumn), no topic, too large
// (payload, or the message for a produce request), malformed headers, or failed --max-attempts
// times.
func (r *Relay) poisonReason(row *row, empty, noTopic, noValue, noSchema string, size int, hdrErr error) (reason, detail string) {
	switch {
	case row.attempts == outboxdb.DeadLetterRequested:
		reason, detail = reasonSkipped, "skipped to the dead-letter topic by hand (kubectl outbox skip; who, when and why in "+r.cfg.Table.Name+"_skips)"
		if r.cfg.DeadLetterTopic == "" {
			detail = "skipped to the dead-letter topic by hand, but this relay has no --dead-letter-topic: it waits for one"
		}
	case empty != "":
		reason, detail = reasonInvalid, "poison: empty "+empty+" (a plain INSERT: the writer libraries and the SQL appends refuse it, the table's CHECKs too under spec.writers.checks: Table)"
	case noTopic != "":
		reason, detail = reasonNoTopic, "poison: "+noTopic
	case noValue != "":
		reason, detail = reasonNoValue, "poison: "+noValue
	case noSchema != "":
		reason, detail = reasonSchema, noSchema
	case len(row.payload) > r.cfg.MaxPayloadBytes:
		reason, detail = reasonOversized, fmt.Sprintf("poison: payload of %d bytes exceeds --max-payload-bytes %d", len(row.payload), r.cfg.MaxPayloadBytes)
	case size > r.pub.callBytes():
		reason, detail = reasonOversized, fmt.Sprintf("poison: message of about %d bytes (payload and headers) exceeds the %d bytes a produce request may carry", size, r.pub.callBytes())
	case hdrErr != nil:
		reason, detail = reasonBadHeaders, "poison: "+hdrErr.Error()
	case int(row.attempts) >= r.cfg.MaxAttempts:
		reason, detail = reasonMaxAttempts, fmt.Sprintf("poison: failed %d times (--max-attempts %d)", row.attempts, r.cfg.MaxAttempts)
	}
	return reason, detail
}

// emptyColumn names the first of row's aggregate_type, aggregate_id and event_type that is empty
// (the table's CHECKs refuse it, unless dropped), "" when none is.
func emptyColumn(row *row) string {
	for i, v := range [3][]byte{row.aggType, row.aggID, row.eventType} {
		if len(v) == 0 {
			return [3]string{"aggregate_type", "aggregate_id", "event_type"}[i]
		}
	}
	return ""
}

// handlePoison deals with the poison row i of b by the poison policy: dead-lettered (its message,
// to the dead-letter topic, is added to b), blocked (recorded as failed, its aggregate held back),
// or, having failed --max-attempts times under block, retried. It reports whether the row is dealt
// with; false: publish it as it is. hstart is where the row's headers begin in b.hdrs.
func (r *Relay) handlePoison(b *batch, i int, row *row, reason, detail string, known bool, topic string, size, hstart int) bool {
	r.metrics.poison.WithLabelValues(reason, string(r.cfg.PoisonPolicy)).Inc()
	switch {
	case r.cfg.PoisonPolicy == PoisonDeadLetter || reason == reasonSkipped && r.cfg.DeadLetterTopic != "":
		r.log.Warn("poison event: dead-lettering it", "reason", reason, "detail", detail, "id", row.id,
			"event_id", string(row.eventID), "aggregate_type", string(row.aggType), "aggregate_id", string(row.aggID),
			"dead_letter_topic", r.cfg.DeadLetterTopic)
		row.errText = outboxdb.DeadLetteredPrefix + r.cfg.DeadLetterTopic + ": " + detail
		b.hdrs = append(b.hdrs, kafka.Header{Key: HeaderError, Value: []byte(detail)})
		if known {
			b.hdrs = append(b.hdrs, kafka.Header{Key: HeaderOriginalTopic, Value: []byte(topic)})
		}
		value := row.payload
		if size > r.pub.callBytes() {
			// Too large for any produce request: the dead letter carries the headers and the
			// error; the payload stays in the outbox row.
			value = nil
		}
		row.topic = r.cfg.DeadLetterTopic
		r.addMessage(b, i, row, value, b.hdrs[hstart:len(b.hdrs):len(b.hdrs)])
		// Later events of the aggregate wait until the dead letter is acknowledged.
		r.skip[string(row.aggID)] = struct{}{}
		return true
	case reason != reasonMaxAttempts:
		r.publishErrorsInc(1)
		b.hdrs = b.hdrs[:hstart]
		row.state = rowFailed
		row.inc = 1
		if reason == reasonSkipped {
			row.inc = 0 // the request stands until a dead-letter topic comes
		}
		row.errText = detail
		r.block(row.aggID, r.cfg.RetryBackoff.Longest(), int(row.attempts)+1)
		r.skip[string(row.aggID)] = struct{}{}
		r.log.Warn("poison event: blocking its aggregate", "reason", reason, "detail", detail, "id", row.id,
			"event_id", string(row.eventID), "aggregate_type", string(row.aggType), "aggregate_id", string(row.aggID),
			"attempts", row.attempts+1)
		return true
	default:
		// Under block, an event that failed max-attempts times is retried (at the longest
		// backoff, see settle).
		r.log.Warn("poison event: retrying it", "reason", reason, "detail", detail, "id", row.id,
			"event_id", string(row.eventID), "aggregate_type", string(row.aggType), "aggregate_id", string(row.aggID))
		return false
	}
}
