package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/outbox-operator/outbox-operator/internal/redact"
	"github.com/outbox-operator/outbox-operator/relay"
)

// runCmd is `relay run`, the default command: it publishes until ctx ends (SIGTERM, SIGINT),
// then exits 0 once the batch in flight is recorded.
func runCmd(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	fs := flag.NewFlagSet("relay run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText+"\nFlags of relay run (a flag wins over its environment variable):\n")
		fs.PrintDefaults()
	}
	cfg, err := relay.ParseConfigFlags(fs, args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "relay: invalid configuration:\n  %s\n", strings.ReplaceAll(err.Error(), "\n", "\n  "))
		return 2
	}
	relay.SizeProcs(getenv)
	log := newLogger(cfg.LogFormat, stderr).With("version", relayVersion())
	r, err := relay.New(cfg, relay.WithLogger(log))
	if err != nil {
		log.Error("cannot start the relay", "err", redact.New(cfg.DatabaseURL, cfg.Kafka.SASLPassword).Error(err))
		return 1
	}
	if err := r.Run(ctx); err != nil {
		log.Error("relay failed", "err", runRedactor(cfg).Error(err))
		return 1
	}
	return 0
}

// runRedactor hides what the relay hides in its own logs: the database URL, the password it
// carries and the SASL password.
func runRedactor(cfg relay.Config) *redact.Redactor {
	password := ""
	if cc, err := relay.ConnConfig(cfg.DatabaseURL, ""); err == nil {
		password = cc.Password
	}
	return redact.New(cfg.DatabaseURL, password, cfg.Kafka.SASLPassword)
}
