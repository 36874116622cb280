package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/migrations"
	"github.com/outbox-operator/outbox-operator/outbox"
)

// AppendResult is scenario 4: what outbox.Append costs the application's transaction.
type AppendResult struct {
	N          int     `json:"n"`          // transactions per variant
	InsertUS   float64 `json:"insertUs"`   // BEGIN; INSERT business row; COMMIT
	AppendUS   float64 `json:"appendUs"`   // BEGIN; outbox.Append; COMMIT
	BothUS     float64 `json:"bothUs"`     // BEGIN; INSERT business row; outbox.Append; COMMIT
	Ratio      float64 `json:"ratio"`      // AppendUS / InsertUS
	OverheadUS float64 `json:"overheadUs"` // BothUS - InsertUS: the cost of adding one event
	Err        string  `json:"error,omitempty"`
	Measured   bool    `json:"measured"`
}

// scenarioAppend: scenario 4. One connection runs three transaction shapes, interleaved in
// blocks so that drift on the shared machine hits all of them alike; no relay runs.
// It runs on the test server (fsync off: the CPU cost) and on the durable one (what a production
// commit sees).
func (e *env) scenarioAppend(ctx context.Context, res *Results) {
	res.Append = &AppendResult{N: e.cfg.appendN}
	res.DurableAppend = &AppendResult{N: e.cfg.appendN}
	for _, ar := range []*AppendResult{res.Append, res.DurableAppend} {
		durable := ar == res.DurableAppend
		if err := e.runAppend(ctx, ar, durable); err != nil {
			ar.Err = err.Error()
			progress("append (durable %v): FAILED: %v", durable, err)
		}
	}
}

func (e *env) runAppend(ctx context.Context, ar *AppendResult, durable bool) error {
	const db = "bench_append"
	var (
		url string
		err error
	)
	if durable {
		url, err = e.durableDatabase(ctx, db)
	} else {
		defer e.dropDatabase(context.Background(), db)
		url, err = e.createDatabase(ctx, db, 1)
	}
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	// No relay waits (what a relay leaves behind when it wakes): inserts do not notify.
	if _, err := conn.Exec(ctx, migrations.WakeStatements(e.table).Woke); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, ordersTable); err != nil {
		return fmt.Errorf("create business table: %w", err)
	}
	w, err := outbox.New(e.table.String())
	if err != nil {
		return err
	}
	insertOrder := func(tx pgx.Tx, i int) error {
		var id int64
		return tx.QueryRow(ctx, `INSERT INTO orders (customer_id, amount, status) VALUES ($1, $2, 'placed') RETURNING id`,
			fmt.Sprintf("customer-%d", i%7919), float64(i%100000)/100).Scan(&id)
	}
	appendEvent := func(tx pgx.Tx, i int) error {
		_, err := w.Append(ctx, tx, orderEvent(i))
		return err
	}
	variants := []struct {
		name  string
		body  func(tx pgx.Tx, i int) error
		total time.Duration
	}{
		{name: "insert", body: insertOrder},
		{name: "append", body: appendEvent},
		{name: "both", body: func(tx pgx.Tx, i int) error {
			if err := insertOrder(tx, i); err != nil {
				return err
			}
			return appendEvent(tx, i)
		}},
	}
	run := func(v int, n, seq int) (time.Duration, error) {
		start := time.Now()
		for i := range n {
			if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return variants[v].body(tx, seq+i) }); err != nil {
				return 0, fmt.Errorf("%s: %w", variants[v].name, err)
			}
		}
		return time.Since(start), nil
	}
	for v := range variants { // warm up plans, caches and the connection's statement cache
		if _, err := run(v, 200, 0); err != nil {
			return err
		}
	}
	const block = 500
	seq := 1000
	progress("append: %d transactions per shape", ar.N)
	for done := 0; done < ar.N; done += block {
		n := min(block, ar.N-done)
		for v := range variants {
			d, err := run(v, n, seq)
			if err != nil {
				return err
			}
			variants[v].total += d
			seq += n
		}
	}
	per := func(v int) float64 { return float64(variants[v].total.Microseconds()) / float64(ar.N) }
	ar.InsertUS, ar.AppendUS, ar.BothUS = per(0), per(1), per(2)
	ar.Ratio = ar.AppendUS / ar.InsertUS
	ar.OverheadUS = ar.BothUS - ar.InsertUS
	ar.Measured = true
	progress("append (durable %v): INSERT tx %.0f µs, Append tx %.0f µs (%.2fx), INSERT+Append tx %.0f µs (+%.0f µs per event)",
		durable, ar.InsertUS, ar.AppendUS, ar.Ratio, ar.BothUS, ar.OverheadUS)
	return nil
}
