package outbox

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Append and AppendBatch work in every one of pgx's query execution modes, and store the same
// payload and headers in each. An application picks the mode in its pool's configuration, not
// for the writer: QueryExecModeExec and QueryExecModeSimpleProtocol are what pgx documents for
// connection poolers and proxies that cannot keep prepared statements (PgBouncer in transaction
// pooling before 1.21, whose Debian 12 package is 1.18), and in them pgx encodes a parameter by
// its Go type, with no Describe to learn that the statement wants jsonb.
func TestEveryQueryExecMode(t *testing.T) {
	url, _ := newDB(t, "outbox")
	w := newWriter(t, "outbox")
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	payload := json.RawMessage(`{"order_id": "o-1", "note": "caf\u00e9 \"quoted\" \\ back", "total": 12.50, "n": [1, 2]}`)
	ev := func(mode pgx.QueryExecMode, i int) Event {
		return Event{AggregateType: "order", AggregateID: fmt.Sprintf("%s-%d", mode, i), EventType: "OrderCreated",
			Payload: payload, Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "note": "é"}}
	}
	want := map[string][2]string{} // aggregate id -> payload::text, headers::text
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := ctxT(t)
			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := w.Append(ctx, tx, ev(mode, 0)); err != nil {
					return err
				}
				_, err := w.AppendBatch(ctx, tx, []Event{ev(mode, 1), ev(mode, 2)})
				return err
			})
			if err != nil {
				t.Fatalf("pgx %s: %v", mode, err)
			}
			rows, err := pool.Query(ctx, `SELECT aggregate_id, payload::text, headers::text FROM outbox WHERE aggregate_id LIKE $1 || '-%' ORDER BY id`, mode.String())
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([3]string, error) {
				var v [3]string
				err := r.Scan(&v[0], &v[1], &v[2])
				return v, err
			})
			if err != nil || len(got) != 3 {
				t.Fatalf("rows %v, %v", got, err)
			}
			for _, g := range got {
				want[g[0]] = [2]string{g[1], g[2]}
			}
		})
	}
	// Every mode that ran stored what the default mode stored.
	ref, ok := want[fmt.Sprintf("%s-0", pgx.QueryExecModeCacheStatement)]
	if !ok {
		t.Fatal("the default mode wrote nothing")
	}
	for agg, v := range want {
		if v != ref {
			t.Errorf("%s: payload %s headers %s; the default mode stored %s %s", agg, v[0], v[1], ref[0], ref[1])
		}
	}
}
