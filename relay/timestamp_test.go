package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// TestRecordTimestamp: by default a record carries its event's created_at, as the database has
// it (to the millisecond, Kafka's resolution), also for a backlog published an hour late; with
// --record-timestamp produce it carries the time the relay produced it. Read by an independent
// consumer from a topic that keeps the producer's time (CreateTime, Kafka's default).
func TestRecordTimestamp(t *testing.T) {
	for _, ts := range []RecordTimestamp{contract.TimestampCreated, contract.TimestampProduce} {
		t.Run(string(ts), func(t *testing.T) {
			url, pool, k, topic := newTopicDB(t, "relay.timestamp", 3)
			ctx := context.Background()
			// Events appended an hour ago (a backlog), and now.
			if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
SELECT 'order', 'o-' || g, 'Placed', '{}', now() - CASE WHEN g <= 10 THEN interval '1 hour' ELSE interval '0' END
FROM generate_series(1, 20) AS g`); err != nil {
				t.Fatal(err)
			}
			created := createdAtByEvent(t, pool)
			start := time.Now().Add(-time.Second) // the machine's clock against the broker's records
			cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
			cfg.RecordTimestamp = ts
			startRelay(t, cfg, "relay")
			c := newCollector(t, k, topic)
			c.waitDistinct(t, len(created), time.Minute)
			for _, rec := range c.recs {
				at, ok := created[rec.Headers[HeaderEventID]]
				if !ok {
					t.Fatalf("a record of no event: %v", rec.Headers)
				}
				var ok2 bool
				switch ts {
				case contract.TimestampCreated:
					ok2 = rec.Timestamp.Equal(at.Truncate(time.Millisecond))
				default:
					ok2 = !rec.Timestamp.Before(start) && rec.Timestamp.Before(time.Now().Add(time.Second))
				}
				if !ok2 {
					t.Errorf("%s: record time %s for an event created at %s", ts, rec.Timestamp.UTC(), at.UTC())
				}
			}
			t.Logf("%d records carry the %s time", len(c.recs), ts)
		})
	}
}

// createdAtByEvent reads the created_at of every event of the test table, by event id.
func createdAtByEvent(t *testing.T, pool *pgxpool.Pool) map[string]time.Time {
	t.Helper()
	created := map[string]time.Time{}
	rows, err := pool.Query(context.Background(), `SELECT event_id::text, created_at FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		created[id] = at
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	return created
}
