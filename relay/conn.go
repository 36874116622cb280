// The relay's database connections: their configuration and the settings of their sessions.

package relay

import (
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// ConnConfig parses a database URL as the relay connects with it: its application name (unless
// the URL has one), TCP keepalives on the client side and a connect timeout (see also
// tuneSession). A URL it cannot parse is an error that withholds the details, which could contain
// the password. The relay's connections and the command line's database subcommands use it.
func ConnConfig(url, appName string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, errors.New("cannot parse OUTBOX_DATABASE_URL (details withheld: they could contain the password)")
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = appName
	}
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > 15*time.Second {
		cfg.ConnectTimeout = 15 * time.Second
	}
	d := &net.Dialer{KeepAlive: 10 * time.Second}
	cfg.DialFunc = d.DialContext
	return cfg, nil
}

// DBTarget describes the database for logs: host, port and database name, never the user's
// password.
func DBTarget(url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "(unparseable OUTBOX_DATABASE_URL)"
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))) + "/" + cfg.Database
}

// TuneFetchSession makes a session plan the relay's fetch and the backlog statement as ordered
// walks of the pending index, whatever the statistics say (outboxdb.PlanInIDOrder), and plan
// each of its prepared statements once (planGeneric). The relay applies it to both its
// connections.
func TuneFetchSession(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, outboxdb.PlanInIDOrder); err != nil {
		return err
	}
	_, err := conn.Exec(ctx, planGeneric)
	return err
}

// planGeneric has the session plan each prepared statement once, for any values. Left to
// choose, PostgreSQL judged a custom plan cheaper for the relay's hottest statements and planned
// them anew at every execution, which cost more than executing them: snapshot tracking's
// statement that opens a batch 0.8 ms a call, its fetch of the open transactions' rows 0.5 ms,
// row tracking's mark 0.16 ms (woken by notifications) and its resumed fetch 0.6 ms, measured by
// pg_stat_statements (track_planning) at 500 events/s. At that rate a snapshot relay's backend
// was 0.7 of a core busy, mostly planning. The generic plans read the same indexes (TestFetchPlan,
// TestMarkPlanAfterBurst and TestSnapshotOpenTransactionsByTxid check them; TestRelayStatementsPlannedOnce
// that each is planned once).
const planGeneric = `SELECT set_config('plan_cache_mode', 'force_generic_plan', false)`

// tuneSession asks the server to notice a vanished relay quickly, so that the locks of a dead
// relay are released within about half a minute: TCP keepalives from the server's side and,
// on PostgreSQL 14 and later, client_connection_check_interval (which also ends a wait for a
// lock whose client is gone). Settings the server refuses are left as they are; they are set
// after connecting rather than as startup parameters, which poolers may reject.
//
// The relay's own commits do not wait for the WAL flush (synchronous_commit off, for its
// sessions only: the application's commits keep the server's setting). Everything the relay
// writes records what already happened in Kafka (marks, cursors, attempts, parked events, a
// replay's progress), so a commit lost in a crash is written again: the events since are
// published again (duplicates, dropped by event_id), never lost; and a commit is visible to
// every other session at once, as before, so no ordering or fencing changes. What it saves is a
// WAL flush per round trip, in the relay's latency (the next batch waited for the previous
// batch's flush) and on the server's disk.
func tuneSession(ctx context.Context, conn *pgx.Conn) {
	for _, q := range []string{
		`SELECT set_config('synchronous_commit', 'off', false)`,
		`SELECT set_config('tcp_keepalives_idle', '10', false), set_config('tcp_keepalives_interval', '5', false),
		        set_config('tcp_keepalives_count', '3', false)`,
		`SELECT set_config('client_connection_check_interval', '5s', false)`,
	} {
		_, _ = conn.Exec(ctx, q)
	}
}
