package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outbox-operator/outbox-operator/internal/redact"
	"github.com/outbox-operator/outbox-operator/outboxdb"
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
	if cfg.Tracking == "" {
		mode, err := resolveTracking(ctx, cfg, log)
		if err != nil {
			return 0 // stopped while the database did not answer
		}
		cfg.Tracking = mode
	}
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

// resolveTracking resolves an unset --tracking from the table, as the operator resolves an unset
// spec.publish.tracking (outboxdb.ResolveTracking): snapshot, or row where a row relay marked
// events sent. It retries, with backoff, while the table cannot be read (the database not up yet,
// the table not migrated yet), and returns ctx's error once ctx ends.
func resolveTracking(ctx context.Context, cfg relay.Config, log *slog.Logger) (relay.Tracking, error) {
	red := runRedactor(cfg)
	cc, err := relay.ConnConfig(cfg.DatabaseURL, "outbox-relay "+cfg.Table.String()+" (tracking)")
	if err != nil {
		return "", err // Validate checked the URL already
	}
	db := stdlib.OpenDB(*cc)
	defer db.Close()
	backoff := relay.Backoff{Min: time.Second, Max: 30 * time.Second}
	for attempt := 1; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		state, err := outboxdb.ReadTrackingState(rctx, db, cfg.Table)
		cancel()
		if err == nil {
			mode, why := outboxdb.ResolveTracking(state)
			log.Info("--tracking is unset: resolved from the table", "table", cfg.Table.String(), "tracking", string(mode), "why", why)
			return mode, nil
		}
		d := backoff.Delay(attempt)
		log.Warn("cannot connect to the database or read the table to resolve --tracking (set it to skip this); retrying",
			"database", relay.DBTarget(cfg.DatabaseURL), "err", red.Error(err), "retry_in", d.String())
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(d):
		}
	}
}
