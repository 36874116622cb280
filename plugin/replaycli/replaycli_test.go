package replaycli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/plugin/replaycli"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

var table = outboxdb.MustParseTable("outbox")

// newDB returns a table with 10 sent events of type order (aggregates o-0..o-4) and 2 unsent, created
// an hour ago.
func newDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	if err := pgtest.OutboxSchema(ctx, url, table, 1); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, sent_at)
		SELECT 'order', 'o-' || (i % 5), 'E', '{}', now() - interval '1 hour', CASE WHEN i <= 10 THEN now() END
		FROM generate_series(1, 12) i`); err != nil {
		t.Fatal(err)
	}
	return pool
}

func TestRunDryRunRecordsNothing(t *testing.T) {
	pool := newDB(t)
	ctx := context.Background()
	var out bytes.Buffer
	err := replaycli.Run(ctx, pool, table, replaycli.Args{From: "2h", DryRun: true, Rate: 100,
		TopicFor: func(typ string) (string, bool) { return "orders.v1", typ == "order" }}, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"Dry run, nothing recorded", "10 events", "positions 1 to 12", "100 events/s", "order", "orders.v1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if rs, err := outboxdb.ListReplays(ctx, pool, table, false, 0); err != nil || len(rs) != 0 {
		t.Fatalf("after a dry run: %v, %v", rs, err)
	}
}

func TestRunRequestsListsAndCancels(t *testing.T) {
	pool := newDB(t)
	ctx := context.Background()
	var out bytes.Buffer
	if err := replaycli.Run(ctx, pool, table, replaycli.Args{From: "1", To: "6", AggregateID: "o-1", Topic: "orders.replay",
		Reason: "consumer restore", RequestedBy: "alice", Output: "json"}, &out); err != nil {
		t.Fatal(err)
	}
	var res replaycli.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if res.ID == 0 || res.DryRun || res.Events != 2 || res.FromID != 1 || res.ToID != 6 || len(res.Topics) != 1 || res.Topics[0].Topic != "orders.replay" {
		t.Fatalf("result %+v", res)
	}
	out.Reset()
	if err := replaycli.List(ctx, pool, table, true, 0, "", &out); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"pending", "0/2 (0%)", "o-1", "orders.replay", "alice"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("list lacks %q", want)
		}
	}
	out.Reset()
	if err := replaycli.Cancel(ctx, pool, table, res.ID, &out); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := replaycli.List(ctx, pool, table, false, 0, "yaml", &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "state: cancelled") {
		t.Fatalf("yaml list: %s", out.String())
	}
}

func TestRunRefuses(t *testing.T) {
	pool := newDB(t)
	ctx := context.Background()
	for name, tc := range map[string]struct {
		args      replaycli.Args
		want      string
		retention bool
	}{
		"no --from":      {args: replaycli.Args{}, want: "--from is required"},
		"bad --from":     {args: replaycli.Args{From: "last tuesday"}, want: "--from: bound"},
		"bad --to":       {args: replaycli.Args{From: "1", To: "x"}, want: "--to: bound"},
		"past retention": {args: replaycli.Args{From: time.Now().Add(-48 * time.Hour).UTC().Format(time.RFC3339)}, want: "past retention", retention: true},
		"bad output":     {args: replaycli.Args{From: "1", DryRun: true, Output: "xml"}, want: "-o xml"},
		"only unsent":    {args: replaycli.Args{From: "11"}, want: "nothing to replay"},
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			err := replaycli.Run(ctx, pool, table, tc.args, &out)
			if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, outboxdb.ErrPastRetention) != tc.retention {
				t.Fatalf("Run: %v; want an error with %q", err, tc.want)
			}
			t.Log(err)
		})
	}
}
