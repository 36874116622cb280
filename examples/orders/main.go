// Command orders is the demo's sample application: it creates orders and appends an OrderCreated
// event for each in the same transaction, the way a real service uses the outbox.
//
//	DATABASE_URL=postgres://... go run ./examples/orders -n 1000 -customers 50
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outbox"
)

func main() {
	n := flag.Int("n", 1000, "orders to create")
	customers := flag.Int("customers", 50, "distinct customers (aggregates of the customer events)")
	table := flag.String("table", "public.outbox", "outbox table")
	flag.Parse()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		log.Fatal("orders: set DATABASE_URL")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatalf("orders: %v", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id text PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		log.Fatalf("orders: %v", err)
	}
	events, err := outbox.New(*table)
	if err != nil {
		log.Fatalf("orders: %v", err)
	}
	start := time.Now()
	run := time.Now().UnixNano()
	for i := range *n {
		id := fmt.Sprintf("order-%d-%d", run, i)
		customer := fmt.Sprintf("customer-%d", rand.IntN(*customers))
		total := 100 + rand.Int64N(99900)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO orders (id, customer, total_cents) VALUES ($1, $2, $3)", id, customer, total); err != nil {
				return err
			}
			created, _ := json.Marshal(map[string]any{"order_id": id, "customer": customer, "total_cents": total})
			placed, _ := json.Marshal(map[string]any{"customer": customer, "order_id": id})
			_, err := events.AppendBatch(ctx, tx, []outbox.Event{
				{AggregateType: "order", AggregateID: id, EventType: "OrderCreated", Payload: created,
					Headers: map[string]string{"traceparent": fmt.Sprintf("00-%016x%016x-%016x-01", rand.Uint64(), rand.Uint64(), rand.Uint64())}},
				{AggregateType: "customer", AggregateID: customer, EventType: "OrderPlaced", Payload: placed},
			})
			return err
		})
		if err != nil {
			log.Fatalf("orders: order %d: %v", i, err)
		}
	}
	fmt.Printf("created %d orders (%d events) in %s\n", *n, 2**n, time.Since(start).Round(time.Millisecond))
}
