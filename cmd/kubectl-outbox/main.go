// Command kubectl-outbox is the kubectl plugin of outbox-operator: `kubectl outbox status NAME`,
// `events`, `retry`, `skip` and `published` (docs/operating.md). Put it on your PATH; kubectl
// finds it by its name.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/outbox-operator/outbox-operator/plugin"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	plugin.Version = version
	code := plugin.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
