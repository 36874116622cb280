package controllers

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/migrations"
	"github.com/outbox-operator/outbox-operator/relay"
)

// follower is a real relay run in the test process the way a relay pod runs it: following the
// table's shard layout (--shard-count=0). envtest runs no pods, so these stand in for them and
// hold the locks the operator checks in PostgreSQL.
type follower struct {
	*relay.Relay
	cancel context.CancelFunc
	done   chan struct{}
}

// startFollowers runs relays for shard indexes 0..n-1 of public.outbox until the test ends.
func startFollowers(t *testing.T, url string, brokers []string, n int) []*follower {
	t.Helper()
	out := make([]*follower, n)
	for k := range n {
		cfg := relay.DefaultConfig()
		cfg.DatabaseURL = url
		cfg.Table = migrations.MustParseTable("public.outbox")
		cfg.ShardCount, cfg.ShardIndex = 0, k
		cfg.Kafka.Brokers = brokers
		cfg.DefaultTopic = "test.events"
		cfg.HTTPAddr = ""
		cfg.PollInterval = time.Second
		cfg.StatsInterval = time.Second
		r, err := relay.New(cfg, relay.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		f := &follower{Relay: r, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(f.done)
			_ = r.Run(ctx)
		}()
		t.Cleanup(f.stop)
		out[k] = f
	}
	return out
}

func (f *follower) stop() {
	f.cancel()
	<-f.done
}

// readyFollowers returns "k:ready" for each follower, for messages.
func readyFollowers(fs []*follower) string {
	s := ""
	for k, f := range fs {
		s += fmt.Sprintf("%d:%v ", k, f.Ready())
	}
	return s
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
