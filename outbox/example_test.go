package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outbox"
)

var errOutOfStock = errors.New("out of stock")

// orderService is a typical request handler: it creates an order and appends OrderCreated in the
// same transaction, so the event exists if and only if the order does.
type orderService struct {
	pool   *pgxpool.Pool
	events *outbox.Writer
}

func (s *orderService) createOrder(ctx context.Context, orderID, sku string, qty int) (outbox.Appended, error) {
	var event outbox.Appended
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, sku, qty) VALUES ($1, $2, $3)", orderID, sku, qty); err != nil {
			return err
		}
		payload, err := json.Marshal(map[string]any{"order_id": orderID, "sku": sku, "qty": qty})
		if err != nil {
			return err
		}
		if event, err = s.events.Append(ctx, tx, outbox.Event{
			AggregateType: "order",
			AggregateID:   orderID,
			EventType:     "OrderCreated",
			Payload:       payload,
			Headers:       map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		}); err != nil {
			return err
		}
		// A business rule checked after the event was appended: failing it rolls back the
		// order and the event together.
		var stock int
		if err := tx.QueryRow(ctx, "UPDATE stock SET qty = qty - $2 WHERE sku = $1 RETURNING qty", sku, qty).Scan(&stock); err != nil {
			return err
		}
		if stock < 0 {
			return errOutOfStock
		}
		return nil
	})
	return event, err
}

// Create an order and its OrderCreated event in one transaction. The outbox schema was applied
// beforehand (by the operator, or `relay migrate`); DATABASE_URL points at the database.
func Example_createOrder() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// Demo tables; a real service has its own.
	if _, err := pool.Exec(ctx, `
		DROP TABLE IF EXISTS orders, stock;
		CREATE TABLE orders (id text PRIMARY KEY, sku text NOT NULL, qty int NOT NULL);
		CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL);
		INSERT INTO stock VALUES ('book', 3)`); err != nil {
		log.Fatal(err)
	}

	events, err := outbox.New("public.outbox")
	if err != nil {
		log.Fatal(err)
	}
	svc := &orderService{pool: pool, events: events}

	created, err := svc.createOrder(ctx, "order-1", "book", 2)
	fmt.Printf("order-1: %v\n", err)
	_, err = svc.createOrder(ctx, "order-2", "book", 5)
	fmt.Printf("order-2: %v\n", err)

	// What the relay will publish: the committed order's event, and nothing of the rolled-back one.
	var aggType, aggID, eventType, qty string
	var traced bool
	if err := pool.QueryRow(ctx, `SELECT aggregate_type, aggregate_id, event_type, payload->>'qty', headers ? 'traceparent'
		FROM outbox WHERE event_id = $1 AND sent_at IS NULL`, created.EventID).Scan(&aggType, &aggID, &eventType, &qty, &traced); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("pending: %s/%s %s qty=%s traceparent=%v\n", aggType, aggID, eventType, qty, traced)
	var orders, rejected int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox WHERE aggregate_id = 'order-2')`).
		Scan(&orders, &rejected); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("orders: %d, events of order-2: %d\n", orders, rejected)

	// Output:
	// order-1: <nil>
	// order-2: out of stock
	// pending: order/order-1 OrderCreated qty=2 traceparent=true
	// orders: 1, events of order-2: 0
}

// Appending several events at once: one statement, ids in the order given.
func ExampleWriter_AppendBatch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	events, err := outbox.New("outbox")
	if err != nil {
		log.Fatal(err)
	}
	var appended []outbox.Appended
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		appended, err = events.AppendBatch(ctx, tx, []outbox.Event{
			{AggregateType: "cart", AggregateID: "cart-7", EventType: "ItemAdded", Payload: json.RawMessage(`{"sku":"pen"}`)},
			{AggregateType: "cart", AggregateID: "cart-7", EventType: "CheckedOut", Payload: json.RawMessage(`{}`)},
			{AggregateType: "user", AggregateID: "user-3", EventType: "", Payload: json.RawMessage(`{}`)},
		})
		return err
	})
	var invalid *outbox.InvalidEventError
	if errors.As(err, &invalid) {
		fmt.Printf("event %d rejected: %v; nothing appended: %v\n", invalid.Index, errors.Is(err, outbox.ErrEmptyEventType), appended == nil)
	}

	// Output:
	// event 2 rejected: true; nothing appended: true
}
