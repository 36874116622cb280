package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// AppendResult is scenario 4: what outbox.Append costs the application's transaction.
type AppendResult struct {
	N          int     `json:"n"`          // transactions per variant
	InsertUS   float64 `json:"insertUs"`   // BEGIN; INSERT business row; COMMIT
	AppendUS   float64 `json:"appendUs"`   // BEGIN; outbox.Append; COMMIT
	BothUS     float64 `json:"bothUs"`     // BEGIN; INSERT business row; outbox.Append; COMMIT
	RowUS      float64 `json:"rowUs"`      // BEGIN; INSERT the same event row into the outbox; COMMIT
	Ratio      float64 `json:"ratio"`      // AppendUS / InsertUS
	RowRatio   float64 `json:"rowRatio"`   // RowUS / InsertUS: what the event's row costs by itself
	OverheadUS float64 `json:"overheadUs"` // BothUS - InsertUS: the cost of adding one event
	// Medians of the same transactions, µs: a commit's flush time varies with the disk, and the
	// mean carries its tail.
	InsertP50 float64 `json:"insertP50Us"`
	AppendP50 float64 `json:"appendP50Us"`
	RowP50    float64 `json:"rowP50Us"`
	// WAL bytes per transaction of each shape (a separate pass of each alone).
	InsertWAL float64 `json:"insertWalBytes"`
	AppendWAL float64 `json:"appendWalBytes"`
	RowWAL    float64 `json:"rowWalBytes"`
	Err       string  `json:"error,omitempty"`
	Measured  bool    `json:"measured"`
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
	if _, err := conn.Exec(ctx, outboxdb.WakeStatements(e.table).Woke); err != nil {
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
	// The event's row inserted as a hand-written worker would, without Append's validation and
	// aggregate lock: what the row itself costs (its indexes, checks, partition, trigger).
	insertRow := func(tx pgx.Tx, i int) error {
		ev := orderEvent(i)
		h, _ := json.Marshal(ev.Headers)
		_, err := tx.Exec(ctx, `INSERT INTO `+e.table.Ident()+` (event_id, aggregate_type, aggregate_id, event_type, payload, headers)
VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb)`,
			randomUUID(), ev.AggregateType, ev.AggregateID, ev.EventType, string(ev.Payload), string(h))
		return err
	}
	variants := []struct {
		name  string
		body  func(tx pgx.Tx, i int) error
		total time.Duration
		lat   []time.Duration
		wal   float64
	}{
		{name: "insert", body: insertOrder},
		{name: "append", body: appendEvent},
		{name: "both", body: func(tx pgx.Tx, i int) error {
			if err := insertOrder(tx, i); err != nil {
				return err
			}
			return appendEvent(tx, i)
		}},
		{name: "row", body: insertRow},
	}
	one := func(v, i int) (time.Duration, error) {
		start := time.Now()
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return variants[v].body(tx, i) }); err != nil {
			return 0, fmt.Errorf("%s: %w", variants[v].name, err)
		}
		return time.Since(start), nil
	}
	lsn := func() (int64, error) {
		var b int64
		err := conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::int8`).Scan(&b)
		return b, err
	}
	seq := 0
	// Warm up plans, caches and the connection's statement cache, and measure each shape's WAL
	// alone.
	const walN = 1000
	for v := range variants {
		before, err := lsn()
		if err != nil {
			return err
		}
		for range walN {
			seq++
			if _, err := one(v, seq); err != nil {
				return err
			}
		}
		after, err := lsn()
		if err != nil {
			return err
		}
		variants[v].wal = float64(after-before) / walN
	}
	// Interleaved transaction by transaction, the order rotating, so that a change in the
	// disk's flush time hits every shape alike.
	progress("append: %d transactions per shape", ar.N)
	for i := range ar.N {
		for k := range variants {
			v := (k + i) % len(variants)
			seq++
			d, err := one(v, seq)
			if err != nil {
				return err
			}
			variants[v].total += d
			variants[v].lat = append(variants[v].lat, d)
		}
	}
	per := func(v int) float64 { return float64(variants[v].total.Nanoseconds()) / 1e3 / float64(ar.N) }
	p50 := func(v int) float64 {
		slices.Sort(variants[v].lat)
		return float64(percentile(variants[v].lat, 50).Nanoseconds()) / 1e3
	}
	ar.InsertUS, ar.AppendUS, ar.BothUS, ar.RowUS = per(0), per(1), per(2), per(3)
	ar.InsertP50, ar.AppendP50, ar.RowP50 = p50(0), p50(1), p50(3)
	ar.InsertWAL, ar.AppendWAL, ar.RowWAL = variants[0].wal, variants[1].wal, variants[3].wal
	ar.Ratio = ar.AppendUS / ar.InsertUS
	ar.RowRatio = ar.RowUS / ar.InsertUS
	ar.OverheadUS = ar.BothUS - ar.InsertUS
	ar.Measured = true
	progress("append (durable %v): INSERT tx %.0f µs, Append tx %.0f µs (%.2fx; medians %.0f vs %.0f µs, %.2fx), the event's row inserted by hand %.0f µs (%.2fx), INSERT+Append tx %.0f µs (+%.0f µs per event); WAL per tx %.0f / %.0f / %.0f bytes",
		durable, ar.InsertUS, ar.AppendUS, ar.Ratio, ar.AppendP50, ar.InsertP50, ar.AppendP50/ar.InsertP50, ar.RowUS, ar.RowRatio,
		ar.BothUS, ar.OverheadUS, ar.InsertWAL, ar.AppendWAL, ar.RowWAL)
	return nil
}
