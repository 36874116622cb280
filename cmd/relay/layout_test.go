package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/relay"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestLayoutCommand shows and sets the shard layout with relays running: the switch waits for
// them to stand down, and the new layout's relays take every bucket.
func TestLayoutCommand(t *testing.T) {
	url := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pgtest.OutboxSchema(ctx, url, outboxdb.MustParseTable("public.outbox"), 1); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{relay.EnvDatabaseURL: url, "OUTBOX_LOG_FORMAT": "text"}
	if code, out, errOut := runMain(t, env, "layout"); code != 0 || !strings.Contains(out, "public.outbox: no shard layout yet") {
		t.Fatalf("layout of a fresh table: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := runMain(t, env, "layout", "set", "--shards", "0"); code != 2 || !strings.Contains(errOut, "--shards 0 out of range") {
		t.Fatalf("layout set --shards 0: %d %q", code, errOut)
	}
	if code, out, errOut := runMain(t, env, "layout", "set", "--shards", "1"); code != 0 || !strings.Contains(out, "public.outbox: 1 shards (generation 1)") {
		t.Fatalf("first layout: %d %q %q", code, out, errOut)
	}
	// One shard does without the bucket index; a layout of several gets it back first.
	if code, out, errOut := runMain(t, env, "indexes", "set", "row", "--shards", "1"); code != 0 || !strings.Contains(out, "public.outbox: no bucket index") {
		t.Fatalf("indexes set row --shards 1 under one shard: %d %q %q", code, out, errOut)
	}
	bucketIndex := func() (exists, valid bool) {
		t.Helper()
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.QueryRow(`SELECT to_regclass('public.outbox_bucket_idx') IS NOT NULL,
  coalesce((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('public.outbox_bucket_idx')), false)`).Scan(&exists, &valid); err != nil {
			t.Fatal(err)
		}
		return exists, valid
	}
	if exists, _ := bucketIndex(); exists {
		t.Fatal("the catalog still has the bucket index")
	}
	k := kafkatest.NewKfake(t)
	var relays []*relay.Relay
	for i := range 2 {
		relays = append(relays, startFollower(t, url, k.Brokers, i))
	}
	waitFor(t, 30*time.Second, "shard 0 of 1 ready", relays[0].Ready)
	code, out, errOut := runMain(t, env, "layout", "set", "--shards", "2")
	if code != 0 || !strings.Contains(out, "public.outbox: 2 shards (generation 2)") || !strings.Contains(out, "last change: 1 -> 2 shards") ||
		!strings.Contains(out, "publishing paused") || !strings.Contains(out, "relays running: shards [0 1]; buckets held: 256 of 256") {
		t.Fatalf("layout set --shards 2 with relays running: %d %q %q", code, out, errOut)
	}
	t.Logf("%s", out)
	if exists, valid := bucketIndex(); !exists || !valid {
		t.Fatalf("after layout set --shards 2: bucket index exists %v, valid %v", exists, valid)
	}
	waitFor(t, 10*time.Second, "both relays ready", func() bool { return relays[0].Ready() && relays[1].Ready() })
}

// startFollower runs, in this process until the test ends, a relay of public.outbox that follows
// the table's shard layout as shard index, publishing to brokers.
func startFollower(t *testing.T, url string, brokers []string, index int) *relay.Relay {
	t.Helper()
	cfg := relay.DefaultConfig()
	cfg.DatabaseURL, cfg.Kafka.Brokers, cfg.DefaultTopic, cfg.HTTPAddr = url, brokers, "cli.layout", ""
	cfg.ShardCount, cfg.ShardIndex = 0, index
	cfg.Notify, cfg.PollInterval = true, time.Second
	cfg.RetryBackoff = relay.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	cfg.OutageBackoff = relay.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	r, err := relay.New(cfg, relay.WithLogger(testLogger(t, fmt.Sprintf("follower %d: ", index))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("follower %d: %v", index, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("follower %d did not stop within 30s", index)
		}
	})
	return r
}
