package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-operator/outbox-operator/inbox"
)

// A kafka-go consumer applies each event once, however often the relay delivers it. DATABASE_URL
// points at a database whose schema the operator (or `relay migrate`) applied.
func Example_consume() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// Demo table; a real service has its own.
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS shipments;
		CREATE TABLE shipments (order_id text PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	in, err := inbox.New("public.inbox")
	if err != nil {
		log.Fatal(err)
	}

	// handle is what a consumer loop calls for every message it fetches; it commits the Kafka
	// offset only when handle returns nil.
	handle := func(m kafka.Message) error {
		id, err := inbox.EventIDFromHeaders(m.Headers)
		if err != nil {
			return err // not from an outbox relay: dead-letter it rather than apply it unguarded
		}
		processed, err := in.Process(ctx, pool, inbox.Message{EventID: id, Topic: m.Topic},
			func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO shipments (order_id) VALUES ($1)", string(m.Key))
				return err
			})
		fmt.Printf("%s offset %d: processed=%v err=%v\n", m.Key, m.Offset, processed, err)
		return err
	}

	msg := kafka.Message{Topic: "orders.events", Key: []byte("order-1"), Value: []byte(`{"order_id":"order-1"}`),
		Headers: []kafka.Header{
			{Key: "event_id", Value: []byte("0191f0a4-7e5c-7cc1-9a3e-6b9d2f1c0a11")},
			{Key: "event_type", Value: []byte("OrderCreated")},
		}}
	_ = handle(msg)
	msg.Offset = 7 // the relay published it again after a crash between ack and mark
	_ = handle(msg)
	err = handle(kafka.Message{Topic: "orders.events", Key: []byte("order-2"), Offset: 8})
	fmt.Println("no event_id:", errors.Is(err, inbox.ErrMissingEventID))

	var shipments int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM shipments").Scan(&shipments); err != nil {
		log.Fatal(err)
	}
	fmt.Println("shipments:", shipments)

	// Output:
	// order-1 offset 0: processed=true err=<nil>
	// order-1 offset 7: processed=false err=<nil>
	// no event_id: true
	// shipments: 1
}
