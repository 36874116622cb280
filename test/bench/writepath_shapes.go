// The application's transactions in the write-path scenario (writepath.go) and the append
// scenario (append.go): its business tables, the order and event of each transaction, the
// transaction shapes measured, and the load that runs one.

package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outbox"
)

// createBusinessTables creates the application's table (orders) and, for the plain shape, the
// table a Debezium user would write instead of the outbox: the event's columns and a primary key,
// nothing else (no partitions, checks, other indexes or trigger). Its key is a bigint identity,
// the cheapest there is: the uuid key of Debezium's documented example costs each insert a random
// place in its index (in a pgbench check, 32 durable writers: about 5% fewer transactions).
func (e *env) createBusinessTables(ctx context.Context, conn execer) error {
	_, err := conn.Exec(ctx, ordersTable+`; CREATE TABLE plain_events (
	id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	event_id       uuid        NOT NULL,
	aggregate_type text        NOT NULL,
	aggregate_id   text        NOT NULL,
	event_type     text        NOT NULL,
	payload        jsonb       NOT NULL,
	headers        jsonb       NOT NULL,
	created_at     timestamptz NOT NULL DEFAULT now())`)
	if err != nil {
		return fmt.Errorf("create business tables: %w", err)
	}
	return nil
}

// ordersTable is the application's business table of the append and write-path scenarios.
const ordersTable = `CREATE TABLE orders (
	id          bigserial PRIMARY KEY,
	customer_id text        NOT NULL,
	amount      numeric(12,2) NOT NULL,
	status      text        NOT NULL,
	created_at  timestamptz NOT NULL DEFAULT now())`

// orderEvent is the event the application appends with its i-th order.
func orderEvent(i int) outbox.Event {
	payload, _ := json.Marshal(map[string]any{
		"order_id": fmt.Sprintf("order-%d", i), "customer_id": fmt.Sprintf("customer-%d", i%7919),
		"amount": float64(i%100000) / 100, "currency": "EUR",
		"lines": []map[string]any{{"sku": fmt.Sprintf("SKU-%d", i%997), "qty": 1 + i%5, "price": 19.99}},
	})
	return outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("order-%d", i), EventType: "OrderPlaced",
		Payload: payload, Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
}

// appShape is one transaction shape of the application: its body, given a transaction and a
// sequence number.
type appShape func(ctx context.Context, tx pgx.Tx, i int) error

// Shapes of the write-path scenario, in the order appShapes returns them.
const (
	shapePlain = iota
	shapeAppend
	shapeNoLock
)

// appShapes returns the plain, append and nolock shapes.
func (e *env) appShapes() ([]appShape, error) {
	locked, err := outbox.New(e.table.String())
	if err != nil {
		return nil, err
	}
	unlocked, err := outbox.New(e.table.String(), outbox.WithoutAggregateLock())
	if err != nil {
		return nil, err
	}
	with := func(w *outbox.Writer) appShape {
		return func(ctx context.Context, tx pgx.Tx, i int) error {
			if err := insertOrder(ctx, tx, i); err != nil {
				return err
			}
			_, err := w.Append(ctx, tx, orderEvent(i))
			return err
		}
	}
	return []appShape{shapePlain: insertEventShape("plain_events"), shapeAppend: with(locked), shapeNoLock: with(unlocked)}, nil
}

// insertOrder inserts the application's i-th order, the business row of every shape.
func insertOrder(ctx context.Context, tx pgx.Tx, i int) error {
	_, err := tx.Exec(ctx, `INSERT INTO orders (customer_id, amount, status) VALUES ($1, $2, 'placed')`,
		fmt.Sprintf("customer-%d", i%7919), float64(i%100000)/100)
	return err
}

// insertEventShape is the shape that inserts the order and, with a plain INSERT into table, its
// event: the plain table's shape, and the outbox's without Append (insertShapes).
func insertEventShape(table string) appShape {
	q := `INSERT INTO ` + table + ` (event_id, aggregate_type, aggregate_id, event_type, payload, headers) VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb)`
	return func(ctx context.Context, tx pgx.Tx, i int) error {
		if err := insertOrder(ctx, tx, i); err != nil {
			return err
		}
		ev := orderEvent(i)
		h, _ := json.Marshal(ev.Headers)
		_, err := tx.Exec(ctx, q, randomUUID(), ev.AggregateType, ev.AggregateID, ev.EventType, string(ev.Payload), string(h))
		return err
	}
}

// randomUUID returns a version 4 UUID made by the client, as outbox.Append makes an event's id:
// the plain shapes insert the same row the same way (PostgreSQL's gen_random_uuid() costs a
// durable writer's transaction a few percent of its throughput under 32 writers).
func randomUUID() pgtype.UUID {
	u := pgtype.UUID{Valid: true}
	_, _ = rand.Read(u.Bytes[:])
	u.Bytes[6] = u.Bytes[6]&0x0f | 0x40
	u.Bytes[8] = u.Bytes[8]&0x3f | 0x80
	return u
}

// loadResult is what one timed round of a shape measured.
type loadResult struct {
	commits int64
	lat     []time.Duration
}

// runLoad runs shape on n connections of pool for d and returns the commits and each
// transaction's latency (BEGIN to COMMIT returned).
func runLoad(ctx context.Context, pool *pgxpool.Pool, n int, d time.Duration, shape appShape, seq *atomic.Int64) (loadResult, error) {
	var (
		mu  sync.Mutex
		res loadResult
		wg  sync.WaitGroup
	)
	errs := make(chan error, n)
	end := time.Now().Add(d)
	for range n {
		wg.Go(func() {
			var lat []time.Duration
			for time.Now().Before(end) {
				i := int(seq.Add(1))
				start := time.Now()
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return shape(ctx, tx, i) }); err != nil {
					errs <- err
					return
				}
				lat = append(lat, time.Since(start))
			}
			mu.Lock()
			res.commits += int64(len(lat))
			res.lat = append(res.lat, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return res, err
	}
	return res, nil
}
