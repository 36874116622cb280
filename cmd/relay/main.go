// Command relay publishes the transactional-outbox rows of one shard to Kafka; see
// docs/architecture.md ("The relay loop", "Relay command line") and package relay.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/outbox-operator/outbox-operator/relay"
)

// version is set at build time, as the image build does (-ldflags "-X main.version=...");
// empty: relay.Version keeps its own value.
var version string

func main() {
	if version != "" {
		relay.Version = version
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := relay.Main(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
