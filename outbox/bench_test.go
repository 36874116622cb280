package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The benchmarks compare Append with a plain INSERT of the same columns in the same transaction
// shape (BEGIN, insert, COMMIT on one connection), so that the ratio is the cost of validation
// and of the aggregate lock. Run:
//
//	go test ./outbox -run '^$' -bench . -benchtime 3s

var benchPayload = json.RawMessage(`{"order_id":"order-000042","customer_id":"c-9917","currency":"EUR","total":129.90,` +
	`"items":[{"sku":"BOOK-1","qty":1,"price":29.90},{"sku":"LAMP-7","qty":2,"price":50.00}],"note":"leave at the door"}`)

var benchHeaders = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}

func benchEvent(i int) Event {
	return Event{AggregateType: "order", AggregateID: fmt.Sprintf("order-%d", i%1000), EventType: "OrderCreated",
		Payload: benchPayload, Headers: benchHeaders}
}

func benchConn(b *testing.B) (*pgx.Conn, *Writer) {
	url, _ := newDB(b, "outbox")
	return connect(b, url), newWriter(b, "outbox")
}

// inTx runs f in its own transaction.
func inTx(b *testing.B, ctx context.Context, conn *pgx.Conn, f func(tx pgx.Tx) error) {
	if err := pgx.BeginFunc(ctx, conn, f); err != nil {
		b.Fatal(err)
	}
}

// plainInsert is the baseline: the same columns and RETURNING as Append, without validation
// and without the aggregate lock.
const plainInsert = `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
	VALUES ($1, $2, $3, $4, $5) RETURNING id, event_id::text, created_at`

const plainInsertBatch = `INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[])
	RETURNING id, event_id::text, created_at`

var benchHeadersJSON, _ = json.Marshal(benchHeaders)

func plainTx(b *testing.B, ctx context.Context, conn *pgx.Conn, ev Event) {
	inTx(b, ctx, conn, func(tx pgx.Tx) error {
		var a Appended
		return tx.QueryRow(ctx, plainInsert, ev.AggregateType, ev.AggregateID, ev.EventType, []byte(ev.Payload), benchHeadersJSON).
			Scan(&a.ID, &a.EventID, &a.CreatedAt)
	})
}

func appendTx(b *testing.B, ctx context.Context, conn *pgx.Conn, w *Writer, ev Event) {
	inTx(b, ctx, conn, func(tx pgx.Tx) error {
		_, err := w.Append(ctx, tx, ev)
		return err
	})
}

func plainBatchTx(b *testing.B, ctx context.Context, conn *pgx.Conn, evs []Event) {
	n := len(evs)
	types, ids, evTypes, payloads, hdrs := make([]string, n), make([]string, n), make([]string, n), make([][]byte, n), make([][]byte, n)
	for i, ev := range evs {
		types[i], ids[i], evTypes[i], payloads[i], hdrs[i] = ev.AggregateType, ev.AggregateID, ev.EventType, ev.Payload, benchHeadersJSON
	}
	inTx(b, ctx, conn, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, plainInsertBatch, types, ids, evTypes, payloads, hdrs)
		if err != nil {
			return err
		}
		out := make([]Appended, 0, n)
		for rows.Next() {
			var a Appended
			if err := rows.Scan(&a.ID, &a.EventID, &a.CreatedAt); err != nil {
				return err
			}
			out = append(out, a)
		}
		return rows.Err()
	})
}

func appendBatchTx(b *testing.B, ctx context.Context, conn *pgx.Conn, w *Writer, evs []Event) {
	inTx(b, ctx, conn, func(tx pgx.Tx) error {
		_, err := w.AppendBatch(ctx, tx, evs)
		return err
	})
}

func BenchmarkInsertPlain(b *testing.B) {
	conn, _ := benchConn(b)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		plainTx(b, ctx, conn, benchEvent(i))
	}
}

func BenchmarkAppend(b *testing.B) {
	conn, w := benchConn(b)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		appendTx(b, ctx, conn, w, benchEvent(i))
	}
}

// batchEvents returns the n-th batch of 100 events over aggs distinct aggregates.
func batchEvents(evs []Event, n, aggs int) []Event {
	for i := range evs {
		evs[i] = benchEvent(n*100 + i%aggs)
	}
	return evs
}

// Batches of 100 events over 100 or 1 distinct aggregates; ns/event is the per-event cost.
func BenchmarkInsertPlainBatch(b *testing.B) {
	for _, aggs := range []int{100, 1} {
		b.Run(fmt.Sprintf("events=100/aggregates=%d", aggs), func(b *testing.B) {
			conn, _ := benchConn(b)
			ctx := context.Background()
			evs := make([]Event, 100)
			for n := 0; b.Loop(); n++ {
				plainBatchTx(b, ctx, conn, batchEvents(evs, n, aggs))
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/event")
		})
	}
}

func BenchmarkAppendBatch(b *testing.B) {
	for _, aggs := range []int{100, 1} {
		b.Run(fmt.Sprintf("events=100/aggregates=%d", aggs), func(b *testing.B) {
			conn, w := benchConn(b)
			ctx := context.Background()
			evs := make([]Event, 100)
			for n := 0; b.Loop(); n++ {
				appendBatchTx(b, ctx, conn, w, batchEvents(evs, n, aggs))
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/event")
		})
	}
}

// The Overhead benchmarks alternate a plain and an Append transaction on one connection and
// report both, and their ratio, so that load from elsewhere on the machine weighs on both alike.
func BenchmarkAppendOverhead(b *testing.B) {
	conn, w := benchConn(b)
	ctx := context.Background()
	var plain, appended time.Duration
	for i := 0; b.Loop(); i++ {
		ev := benchEvent(i)
		start := time.Now()
		plainTx(b, ctx, conn, ev)
		mid := time.Now()
		appendTx(b, ctx, conn, w, ev)
		plain += mid.Sub(start)
		appended += time.Since(mid)
	}
	b.ReportMetric(float64(plain.Nanoseconds())/float64(b.N), "plain-ns/event")
	b.ReportMetric(float64(appended.Nanoseconds())/float64(b.N), "append-ns/event")
	b.ReportMetric(float64(appended)/float64(plain), "ratio")
}

func BenchmarkAppendBatchOverhead(b *testing.B) {
	for _, aggs := range []int{100, 1} {
		b.Run(fmt.Sprintf("events=100/aggregates=%d", aggs), func(b *testing.B) {
			conn, w := benchConn(b)
			ctx := context.Background()
			evs := make([]Event, 100)
			var plain, appended time.Duration
			for n := 0; b.Loop(); n++ {
				batchEvents(evs, n, aggs)
				start := time.Now()
				plainBatchTx(b, ctx, conn, evs)
				mid := time.Now()
				appendBatchTx(b, ctx, conn, w, evs)
				plain += mid.Sub(start)
				appended += time.Since(mid)
			}
			b.ReportMetric(float64(plain.Nanoseconds())/float64(b.N*100), "plain-ns/event")
			b.ReportMetric(float64(appended.Nanoseconds())/float64(b.N*100), "append-ns/event")
			b.ReportMetric(float64(appended)/float64(plain), "ratio")
		})
	}
}

// Validation alone, without PostgreSQL: a typical payload and one of 500 kB.
func BenchmarkValidate(b *testing.B) {
	w := newWriter(b, "outbox")
	large := json.RawMessage(`{"blob":"` + strings.Repeat("0123456789", 50_000) + `","n":[` + strings.Repeat("1.5e3,", 10_000) + `0]}`)
	for name, p := range map[string]json.RawMessage{"payload=318B": benchPayload, "payload=560kB": large} {
		b.Run(name, func(b *testing.B) {
			ev := benchEvent(1)
			ev.Payload = p
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				if _, err := w.validate(&ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
