package relay

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// Version is the relay's version, set at build time:
// go build -ldflags "-X main.version=v1.2.3" ./cmd/relay (as the image is built), or
// -X github.com/outbox-operator/outbox-operator/relay.Version=v1.2.3.
var Version = "dev"

const usageText = `relay publishes the outbox rows of one shard to Kafka.

Usage:
  relay [run] [flags]                        publish (the default command)
  relay migrate [--table T] [--notify]       apply the embedded migrations (a new table gets the
                                             relays' default wake-ups: polling, no insert trigger)
  relay partitions ensure --days N [--table T]
                                             create the daily partitions from today to N days ahead
  relay partitions prune --retention 168h [--table T]
                                             drop the daily partitions older than the retention
                                             whose rows are all sent; exit status 3 when a drop
                                             was deferred (a transaction used the table: run
                                             prune again later)
  relay layout [--table T]                   show the table's shard layout and who holds its locks
  relay layout set --shards N [--table T] [--timeout 2m]
                                             reshard safely: the relays of the current layout
                                             finish their batch in flight and stand down, then
                                             the layout switches to N shards
  relay cursor [--table T]                   show the snapshot-tracking cursor of the table
  relay cursor reset --to now|oldest --reason TEXT [--table T]
                                             replace the cursor (relays stopped): now skips every
                                             event not yet published, oldest publishes every
                                             retained event again; recorded with the reason
  relay wakeups [--table T]                  show how the table's relays wake up
  relay wakeups set notify|poll [--table T] [--lock-wait 2s]
                                             notify: the insert trigger notifies a waiting
                                             relay; poll: no trigger (writers pay nothing), run
                                             the relays with --notify=false
  relay grants --owner-role R [--relay-role R] [--writer-role R] [--consumer-role R]
               [--reader-role R] [--owner-part] [--table T]
                                             print the SQL that grants each part only the
                                             privileges it needs (docs/privileges.md)
  relay version                              print the version

The database URL is read from OUTBOX_DATABASE_URL only. Run "relay run -h" for the flags.
`

// Main runs the relay command line with args (without the program name) and returns the exit
// code. ctx ends on SIGTERM/SIGINT; getenv is os.Getenv in the binary.
func Main(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "run":
		return runCmd(ctx, args, getenv, stderr)
	case "migrate":
		return migrateCmd(ctx, args, getenv, stdout, stderr)
	case "partitions":
		return partitionsCmd(ctx, args, getenv, stdout, stderr)
	case "layout":
		return layoutCmd(ctx, args, getenv, stdout, stderr)
	case "wakeups":
		return wakeupsCmd(ctx, args, getenv, stdout, stderr)
	case "cursor":
		return cursorCmd(ctx, args, getenv, stdout, stderr)
	case "grants":
		return grantsCmd(args, getenv, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, Version)
		return 0
	case "help":
		fmt.Fprint(stdout, usageText)
		return 0
	default:
		fmt.Fprintf(stderr, "relay: unknown command %q\n\n%s", cmd, usageText)
		return 2
	}
}

// NewLogger returns the structured logger of --log-format (json or text) writing to w.
func NewLogger(format string, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func runCmd(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := ParseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "relay: invalid configuration:\n  %s\n", strings.ReplaceAll(err.Error(), "\n", "\n  "))
		return 2
	}
	log := NewLogger(cfg.LogFormat, stderr).With("version", Version)
	r, err := New(cfg, WithLogger(log))
	if err != nil {
		log.Error("cannot start the relay", "err", newRedactor(cfg.DatabaseURL, cfg.Kafka.SASLPassword).Error(err))
		return 1
	}
	if err := r.Run(ctx); err != nil {
		log.Error("relay failed", "err", r.red.Error(err))
		return 1
	}
	return 0
}

// dbCommand parses the flags of a database subcommand (--table and --log-format plus extra)
// and opens the database.
func dbCommand(name string, args []string, getenv func(string) string, stderr io.Writer, extra func(*flag.FlagSet)) (
	db *sql.DB, t outboxdb.Table, log *slog.Logger, red *redactor, code int) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("relay "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if extra != nil {
		extra(fs)
	}
	all := runSettings(&c)
	var settings []setting
	for _, s := range all {
		if s.Setting == contract.FlagTable || s.Setting == contract.FlagLogFormat {
			settings = append(settings, s)
		}
	}
	if _, err := parseSettings(fs, settings, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, t, nil, nil, 0
		}
		fmt.Fprintf(stderr, "relay %s: %v\n", name, err)
		return nil, t, nil, nil, 2
	}
	url := getenv(EnvDatabaseURL)
	red = newRedactor(url)
	log = NewLogger(c.LogFormat, stderr).With("version", Version, "table", c.Table.String())
	if url == "" {
		fmt.Fprintf(stderr, "relay %s: %s is required\n", name, EnvDatabaseURL)
		return nil, t, nil, nil, 2
	}
	cc, err := connConfig(url, "outbox-relay "+name)
	if err != nil {
		fmt.Fprintf(stderr, "relay %s: %s\n", name, red.Error(err))
		return nil, t, nil, nil, 2
	}
	red = newRedactor(url, cc.Password)
	log.Info("connecting", "database", dbTarget(url))
	return stdlib.OpenDB(*cc), c.Table, log, red, -1
}

// exitDeferred is the exit status of `relay partitions prune` when a drop was deferred: nothing
// failed, but a scheduled job should run it again later.
const exitDeferred = 3

func migrateCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	notify := contract.DefaultNotify
	db, t, log, red, code := dbCommand("migrate", args, getenv, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&notify, "notify", contract.DefaultNotify,
			"for a new table: keep the insert trigger that wakes relays run with --notify (later: relay wakeups set)")
	})
	if code >= 0 {
		return code
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
		log.Info("new table", "wakeups", wakeupsName(notify))
	}
	log.Info("schema up to date", "version", v)
	fmt.Fprintf(stdout, "%s: schema version %d\n", t, v)
	return 0
}

func partitionsCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "ensure" && args[0] != "prune") {
		fmt.Fprintf(stderr, "relay partitions: want \"ensure --days N\" or \"prune --retention 168h\"\n")
		return 2
	}
	sub, args := args[0], args[1:]
	var (
		days      int
		retention time.Duration
	)
	db, t, log, red, code := dbCommand("partitions "+sub, args, getenv, stderr, func(fs *flag.FlagSet) {
		if sub == "ensure" {
			fs.IntVar(&days, "days", outboxdb.DefaultPremakeDays, "create the partitions from today (UTC) to this many days ahead")
		} else {
			fs.DurationVar(&retention, "retention", outboxdb.DefaultRetention, "drop the partitions whose day ended longer ago than this, if all their rows are sent")
		}
	})
	if code >= 0 {
		return code
	}
	defer db.Close()
	if sub == "ensure" && (days < 0 || days > 366) {
		fmt.Fprintf(stderr, "relay partitions ensure: --days %d out of range: want 0 to 366\n", days)
		return 2
	}
	if sub == "prune" && retention <= 0 {
		fmt.Fprintf(stderr, "relay partitions prune: --retention must be positive, got %s\n", retention)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if sub == "ensure" {
		today := time.Now().UTC().Truncate(24 * time.Hour)
		created, err := outboxdb.EnsurePartitions(ctx, db, t, today, today.AddDate(0, 0, days))
		if err != nil {
			log.Error("partitions ensure failed", "err", red.Error(err))
			return 1
		}
		for _, p := range created {
			fmt.Fprintf(stdout, "created %s\n", p)
		}
		log.Info("partitions ensured", "from", today.Format(time.DateOnly), "days_ahead", days, "created", len(created))
		return 0
	}
	pruned, err := outboxdb.PrunePartitions(ctx, db, t, retention)
	for _, p := range pruned.Dropped {
		fmt.Fprintf(stdout, "dropped %s\n", p)
	}
	for _, p := range pruned.Pending {
		log.Warn("partition kept: it still holds unsent events", "partition", p)
	}
	for _, p := range pruned.Busy {
		log.Warn("partition kept for now: a transaction still uses the table (the drop waits at most 250 ms for its lock, so as not to stall inserts); run prune again later", "partition", p)
	}
	failed := err != nil
	if failed {
		log.Error("partitions prune failed", "err", red.Error(err))
	}
	names := slices.Concat(pruned.Dropped, pruned.Pending, pruned.Busy)
	log.Info("partitions pruned", "retention", retention.String(), "candidates", len(names))
	switch {
	case failed:
		return 1
	case len(pruned.Busy) > 0:
		return exitDeferred
	}
	return 0
}

func layoutCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	set := len(args) > 0 && args[0] == "set"
	if set {
		args = args[1:]
	}
	var (
		shards  int
		timeout time.Duration
	)
	db, t, log, red, code := dbCommand("layout", args, getenv, stderr, func(fs *flag.FlagSet) {
		if set {
			fs.IntVar(&shards, "shards", 0, "the shard count to move to, 1 to 256")
			fs.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the relays of the old layout to stand down")
		}
	})
	if code >= 0 {
		return code
	}
	defer db.Close()
	if set && (shards < 1 || shards > outboxdb.Buckets) {
		fmt.Fprintf(stderr, "relay layout set: --shards %d out of range: want 1 to %d\n", shards, outboxdb.Buckets)
		return 2
	}
	if set {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		l, err := outboxdb.Reshard(rctx, db, t, int32(shards), 20*time.Millisecond)
		if err != nil {
			if rctx.Err() != nil {
				// Leave the old layout publishing rather than a request nobody completes.
				cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer ccancel()
				if cur, rerr := outboxdb.ReadLayout(cctx, db, t); rerr == nil && cur != nil {
					_ = outboxdb.RequestLayout(cctx, db, t, cur.ShardCount)
				}
				log.Error("the relays of the old layout did not stand down in time; the request is withdrawn", "timeout", timeout.String())
				return 1
			}
			log.Error("layout set failed", "err", red.Error(err))
			return 1
		}
		log.Info("layout switched", "shards", l.ShardCount, "generation", l.Generation)
		// Wait a little for the relays of the new layout to take every bucket, to report the
		// pause; without relays running, the layout is printed as it is.
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		_, _ = outboxdb.WaitForPause(wctx, outboxdb.RealClock{}, db, t, l.Generation, 50*time.Millisecond)
		wcancel()
	}
	return printLayout(ctx, db, t, stdout, log, red)
}

func cursorCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	reset := len(args) > 0 && args[0] == "reset"
	if reset {
		args = args[1:]
	}
	var to, reason string
	db, t, log, red, code := dbCommand("cursor", args, getenv, stderr, func(fs *flag.FlagSet) {
		if reset {
			fs.StringVar(&to, "to", "", "now (skip every event not yet published) or oldest (publish every retained event again)")
			fs.StringVar(&reason, "reason", "", "why: recorded in <table>_relay_cursor_resets")
		}
	})
	if code >= 0 {
		return code
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if reset {
		if to != outboxdb.ResetToNow && to != outboxdb.ResetToOldest {
			fmt.Fprintf(stderr, "relay cursor reset: --to %q: want %q or %q\n", to, outboxdb.ResetToNow, outboxdb.ResetToOldest)
			return 2
		}
		if strings.TrimSpace(reason) == "" {
			fmt.Fprintf(stderr, "relay cursor reset: --reason is required (it is recorded)\n")
			return 2
		}
		skipped, err := outboxdb.ResetCursor(ctx, db, t, to, reason)
		if err != nil {
			log.Error("cursor reset failed", "err", red.Error(err))
			return 1
		}
		log.Warn("cursor reset", "to", to, "reason", reason, "skipped_events", skipped)
		fmt.Fprintf(stdout, "%s: cursor reset to %s (%d events skipped)\n", t, to, skipped)
	}
	rows, err := outboxdb.ReadCursor(ctx, db, t)
	if err != nil {
		log.Error("reading the cursor failed", "err", red.Error(err))
		return 1
	}
	if len(rows) == 0 {
		fmt.Fprintf(stdout, "%s: tracked by row (no snapshot cursor)\n", t)
		return 0
	}
	fmt.Fprintf(stdout, "%s: tracked by snapshot, %d cursor rows\n", t, len(rows))
	for _, c := range rows {
		snap := c.Snap
		if snap == "" {
			snap = "(before the first batch)"
		}
		fmt.Fprintf(stdout, "  %d buckets: at %s", len(c.Buckets), snap)
		if c.Next != "" {
			fmt.Fprintf(stdout, ", batch to %s done up to id %d", c.Next, c.LastID)
		}
		if !c.SameSystem {
			fmt.Fprint(stdout, " [another database: reset needed]")
		}
		fmt.Fprintf(stdout, ", updated %s\n", c.UpdatedAt.UTC().Format(time.RFC3339))
	}
	return 0
}

// printLayout writes the table's layout, its last change and who holds its locks.
func printLayout(ctx context.Context, db *sql.DB, t outboxdb.Table, stdout io.Writer, log *slog.Logger, red *redactor) int {
	l, err := outboxdb.ReadLayout(ctx, db, t)
	if err != nil {
		log.Error("reading the layout failed", "err", red.Error(err))
		return 1
	}
	if l == nil {
		fmt.Fprintf(stdout, "%s: no shard layout yet (the operator sets it; a relay run with --shard-count=N sets N)\n", t)
		return 0
	}
	fmt.Fprintf(stdout, "%s: %d shards (generation %d)\n", t, l.ShardCount, l.Generation)
	if l.Requested != 0 {
		fmt.Fprintf(stdout, "  change to %d shards requested at %s\n", l.Requested, l.RequestedAt.UTC().Format(time.RFC3339))
	}
	if l.Previous != 0 {
		fmt.Fprintf(stdout, "  last change: %d -> %d shards at %s", l.Previous, l.ShardCount, l.SwitchedAt.UTC().Format(time.RFC3339))
		if pause, ok := l.Pause(); ok {
			fmt.Fprintf(stdout, ", publishing paused %d ms", pause.Milliseconds())
		} else {
			fmt.Fprint(stdout, ", the new layout does not hold every bucket yet")
		}
		fmt.Fprintln(stdout)
	}
	locks, err := outboxdb.ReadRelayLocks(ctx, db, t)
	if err != nil {
		log.Error("reading the relay locks failed", "err", red.Error(err))
		return 1
	}
	present := make([]int, 0, len(locks.Present))
	for k := range locks.Present {
		present = append(present, int(k))
	}
	slices.Sort(present)
	fmt.Fprintf(stdout, "  relays running: shards %v; buckets held: %d of %d\n", present, len(locks.Buckets), outboxdb.Buckets)
	return 0
}
