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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := relay.Main(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
