// Command relay publishes the transactional-outbox rows of one shard to Kafka, and manages the
// outbox table (migrate, partitions, layout, cursor, wakeups, grants); see docs/architecture.md
// ("The relay loop", "Relay command line") and package relay, the engine it runs.
//
// A file per subcommand: run.go, migrate.go, partitions.go, layout.go, cursor.go, wakeups.go,
// grants.go; this one dispatches and holds what they share.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/internal/redact"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/relay"
)

// version is set at build time, as the image build does (-ldflags "-X main.version=v1.2.3");
// empty: relayVersion says "dev".
var version string

// relayVersion is the version `relay version` prints and the logs carry.
func relayVersion() string {
	if version == "" {
		return "dev"
	}
	return version
}

const usageText = `relay publishes the outbox rows of one shard to Kafka.

Usage:
  relay [run] [flags]                        publish (the default command)
  relay migrate [--table T] [--notify] [--checks table|relay]
                                             apply the embedded migrations (a new table gets the
                                             relays' default wake-ups: polling, no insert trigger;
                                             and no CHECKs: --checks relay)
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
                                             the layout switches to N shards (N > 1 builds the
                                             bucket index first, CONCURRENTLY, if it is missing)
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
  relay inserts [--table T]                  show whether plain INSERTs take the aggregate's lock
  relay inserts set locked|plain [--table T] [--lock-wait 2s]
                                             locked: a trigger gives plain INSERTs the writer
                                             libraries' per-aggregate order (a cost per insert)
  relay checks [--table T]                   show where bad events are refused
  relay checks set table|relay [--table T] [--lock-wait 2s]
                                             table: the table's CHECKs refuse them at insert;
                                             relay: no CHECKs (a cheaper insert), the relays
                                             park them as poison (added back NOT VALID)
  relay indexes [--table T]                  show the table's pending index (row tracking's) and
                                             bucket index (a layout of several shards')
  relay indexes set snapshot|row [--shards N] [--table T] [--lock-wait 2s]
                                             snapshot: drop the pending index (once the snapshot
                                             cursor has passed its first batch); row: build it,
                                             CONCURRENTLY, a partition at a time (resumable);
                                             --shards 1 drops the bucket index (layout of one
                                             shard only), N > 1 builds it
  relay grants --owner-role R [--relay-role R] [--writer-role R] [--consumer-role R]
               [--reader-role R] [--owner-part] [--table T]
                                             print the SQL that grants each part only the
                                             privileges it needs (docs/privileges.md)
  relay version                              print the version

The database URL is read from OUTBOX_DATABASE_URL only. Run "relay run -h" for the flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := command(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command runs the relay command line with args (without the program name) and returns the
// exit code. ctx ends on SIGTERM/SIGINT; getenv is os.Getenv in the binary.
func command(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
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
	case "inserts":
		return insertsCmd(ctx, args, getenv, stdout, stderr)
	case "checks":
		return checksCmd(ctx, args, getenv, stdout, stderr)
	case "indexes":
		return indexesCmd(ctx, args, getenv, stdout, stderr)
	case "cursor":
		return cursorCmd(ctx, args, getenv, stdout, stderr)
	case "grants":
		return grantsCmd(args, getenv, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, relayVersion())
		return 0
	case "help":
		fmt.Fprint(stdout, usageText)
		return 0
	default:
		fmt.Fprintf(stderr, "relay: unknown command %q\n\n%s", cmd, usageText)
		return 2
	}
}

// newLogger returns the structured logger of --log-format (json or text) writing to w.
func newLogger(format string, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// dbCommand parses the flags of a database subcommand (--table and --log-format plus extra)
// and opens the database. code is -1 when the subcommand goes on, else its exit code. red hides
// the database URL and its password from what the subcommand logs.
func dbCommand(name string, args []string, getenv func(string) string, stderr io.Writer, extra func(*flag.FlagSet)) (
	db *sql.DB, t outboxdb.Table, log *slog.Logger, red *redact.Redactor, code int) {
	c := relay.DefaultConfig()
	fs := flag.NewFlagSet("relay "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if extra != nil {
		extra(fs)
	}
	if err := relay.ParseSettings(fs, &c, args, getenv, contract.FlagTable, contract.FlagLogFormat); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, t, nil, nil, 0
		}
		fmt.Fprintf(stderr, "relay %s: %v\n", name, err)
		return nil, t, nil, nil, 2
	}
	url := getenv(relay.EnvDatabaseURL)
	red = redact.New(url)
	log = newLogger(c.LogFormat, stderr).With("version", relayVersion(), "table", c.Table.String())
	if url == "" {
		fmt.Fprintf(stderr, "relay %s: %s is required\n", name, relay.EnvDatabaseURL)
		return nil, t, nil, nil, 2
	}
	cc, err := relay.ConnConfig(url, "outbox-relay "+name)
	if err != nil {
		fmt.Fprintf(stderr, "relay %s: %s\n", name, red.Error(err))
		return nil, t, nil, nil, 2
	}
	red = redact.New(url, cc.Password)
	log.Info("connecting", "database", relay.DBTarget(url))
	return stdlib.OpenDB(*cc), c.Table, log, red, -1
}
