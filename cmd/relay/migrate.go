package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// migrateCmd is `relay migrate`: it applies the embedded migrations to the table (outboxdb.Apply);
// a new table gets the wake-ups of relays run with the same defaults, and no CHECKs
// (outboxdb.NewTableChecks) unless --checks=table.
func migrateCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	notify := contract.DefaultNotify
	checks := checksTrigger.off
	if outboxdb.NewTableChecks {
		checks = checksTrigger.on
	}
	db, t, log, red, code := dbCommand("migrate", args, getenv, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&notify, "notify", contract.DefaultNotify,
			"for a new table: keep the insert trigger that wakes relays run with --notify (later: relay wakeups set)")
		fs.StringVar(&checks, "checks", checks,
			"for a new table: where a bad event is refused, "+checksTrigger.on+" (its four CHECKs, at every insert) or "+checksTrigger.off+
				" (the relays park a bad plain INSERT as poison; outbox.Append and the SQL appends refuse it either way; later: relay checks set)")
	})
	if code >= 0 {
		return code
	}
	if checks != checksTrigger.on && checks != checksTrigger.off {
		db.Close()
		fmt.Fprintf(stderr, "relay migrate: --checks %q: want %q or %q\n", checks, checksTrigger.on, checksTrigger.off)
		return 2
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	before, err := outboxdb.CurrentVersion(ctx, db, t)
	if err != nil {
		log.Error("migrate failed", "err", red.Error(err))
		return 1
	}
	v, err := outboxdb.Apply(ctx, db, t)
	if err != nil {
		log.Error("migrate failed", "err", red.Error(err))
		return 1
	}
	if before == 0 {
		// A new table gets the wake-ups of relays run with the same defaults (an existing one
		// keeps what was chosen for it): by default they poll, and inserts need no trigger.
		if _, err := outboxdb.SetNotify(ctx, db, t, notify, 10*time.Second); err != nil {
			log.Error("setting the new table's wake-ups failed", "err", red.Error(err))
			return 1
		}
		if _, err := outboxdb.SetChecks(ctx, db, t, checks == checksTrigger.on, 10*time.Second); err != nil {
			log.Error("setting the new table's checks failed", "err", red.Error(err))
			return 1
		}
		log.Info("new table", "wakeups", wakeupsName(notify), "checks", checks)
	}
	log.Info("schema up to date", "version", v)
	fmt.Fprintf(stdout, "%s: schema version %d\n", t, v)
	return 0
}
