package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver outboxdb.Apply needs
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// env is the set of real components one benchmark run uses: a PostgreSQL server, an Apache
// Kafka broker, the relay binary and a scratch directory.
type env struct {
	cfg      config
	pg       *pgtest.Server
	durable  *pgtest.Server // fsync and synchronous_commit on: the write-path scenarios
	kafka    *kafkatest.Cluster
	kcl      *kgo.Client
	admin    *kadm.Client
	table    outboxdb.Table
	relayBin string // empty when cmd/relay could not be built
	relayErr error  // why relayBin is empty
	tmp      string
	kafkaPid int
	// snap is set while a drain runs under snapshot tracking: waitDrained and marked follow the
	// cursors instead of sent_at.
	snap *snapWatch
}

// startPostgres starts a dedicated server and turns on track_commit_timestamp, so that the end
// of a drain is the commit time of the transaction that marked the last row (exact, whoever
// marked it), not the moment a poll noticed.
//
// With statements, pg_stat_statements is loaded too (the -statements diagnostic).
func startPostgres(ctx context.Context, statements bool) (*pgtest.Server, error) {
	if statements {
		return startServerWith(ctx, "track_commit_timestamp = on", "shared_preload_libraries = 'pg_stat_statements'")
	}
	return startServerWith(ctx, "track_commit_timestamp = on")
}

// statementsTop starts counting the statements of the server (pg_stat_statements) when the
// -statements diagnostic is on; the returned func prints the top ones by execution time, what
// names the statements that limit a figure.
func (e *env) statementsTop(ctx context.Context, conn *pgx.Conn, what string) (report func()) {
	if e.cfg.statements <= 0 {
		return func() {}
	}
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		progress("%s: statements: %v", what, err)
		return func() {}
	}
	// Planning too: a statement planned anew at every call spends its time there.
	if _, err := conn.Exec(ctx, `ALTER SYSTEM SET pg_stat_statements.track_planning = on`); err == nil {
		_, _ = conn.Exec(ctx, `SELECT pg_reload_conf()`)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		progress("%s: statements: %v", what, err)
		return func() {}
	}
	return func() {
		rows, err := conn.Query(context.Background(), `SELECT calls, round(total_exec_time)::bigint, plans, round(total_plan_time)::bigint, rows, shared_blks_hit + shared_blks_read,
  left(regexp_replace(query, '\s+', ' ', 'g'), 160) FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT $1`, e.cfg.statements)
		if err != nil {
			progress("%s: statements: %v", what, err)
			return
		}
		defer rows.Close()
		progress("%s: top statements by execution time (every database of the server)", what)
		for rows.Next() {
			var calls, ms, plans, planMs, n, blocks int64
			var q string
			if err := rows.Scan(&calls, &ms, &plans, &planMs, &n, &blocks, &q); err != nil {
				progress("%s: statements: %v", what, err)
				return
			}
			progress("  %6d ms %6d calls %6d ms planning %6d plans %8d rows %8d buffers  %s", ms, calls, planMs, plans, n, blocks, q)
		}
	}
}

// startServerWith starts a test server with settings (ALTER SYSTEM SET ..., then a restart) on
// top of the test server's own.
func startServerWith(ctx context.Context, settings ...string) (*pgtest.Server, error) {
	srv, err := pgtest.Start()
	if err != nil {
		return nil, fmt.Errorf("start PostgreSQL: %w", err)
	}
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err == nil {
		for _, s := range settings {
			if _, err = conn.Exec(ctx, "ALTER SYSTEM SET "+s); err != nil {
				err = fmt.Errorf("%s: %w", s, err)
				break
			}
		}
		conn.Close(ctx)
	}
	if err == nil {
		err = srv.Restart()
	}
	if err != nil {
		srv.Close()
		return nil, fmt.Errorf("configure PostgreSQL: %w", err)
	}
	return srv, nil
}

// adminConn connects to the maintenance database.
func (e *env) adminConn(ctx context.Context) (*pgx.Conn, error) {
	return pgx.Connect(ctx, e.pg.URL("postgres"))
}

// createDatabase creates an empty database with the outbox schema and daily partitions from
// daysBack days ago to tomorrow (UTC) on the test server.
func (e *env) createDatabase(ctx context.Context, name string, daysBack int) (string, error) {
	return createDatabaseOn(ctx, e.pg, e.table, name, daysBack)
}

// createDatabaseOn is createDatabase on server srv.
func createDatabaseOn(ctx context.Context, srv *pgtest.Server, t outboxdb.Table, name string, daysBack int) (string, error) {
	admin, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return "", fmt.Errorf("drop database %s: %w", name, err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	dbURL := srv.URL(name)
	if err := pgtest.OutboxSchema(ctx, dbURL, t, daysBack); err != nil {
		return "", err
	}
	if err := asNewTable(ctx, dbURL, t); err != nil {
		return "", err
	}
	return dbURL, nil
}

// asNewTable leaves t, just made, as the operator leaves a new table for an OutboxRelay with
// default settings: relays that poll, no insert trigger (a scenario that measures notifications
// creates it), and no CHECKs (outboxdb.NewTableChecks; the write path measures them too).
func asNewTable(ctx context.Context, url string, t outboxdb.Table) error {
	if err := setNotifyAt(ctx, url, t, contract.DefaultNotify); err != nil {
		return err
	}
	return setChecksAt(ctx, url, t, outboxdb.NewTableChecks)
}

// cloneDatabase copies a prepared database file by file, which is much faster than generating
// its rows again. Nobody may be connected to the template.
func (e *env) cloneDatabase(ctx context.Context, template, name string) (string, error) {
	admin, err := e.adminConn(ctx)
	if err != nil {
		return "", err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return "", fmt.Errorf("drop database %s: %w", name, err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s STRATEGY FILE_COPY",
		pgx.Identifier{name}.Sanitize(), pgx.Identifier{template}.Sanitize())); err != nil {
		return "", fmt.Errorf("clone database %s into %s: %w", template, name, err)
	}
	return e.pg.URL(name), nil
}

func (e *env) dropDatabase(ctx context.Context, name string) {
	admin, err := e.adminConn(ctx)
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// newTopic creates a fresh topic for one scenario.
func (e *env) newTopic(ctx context.Context, prefix string) (string, error) {
	return e.newTopicWith(ctx, prefix, nil)
}

// newTopicWith is newTopic with topic configs.
func (e *env) newTopicWith(ctx context.Context, prefix string, configs map[string]*string) (string, error) {
	topic := kafkatest.UniqueTopic("bench." + prefix)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := e.admin.CreateTopic(ctx, e.cfg.partitions, 1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return "", fmt.Errorf("create topic %s: %w", topic, err)
	}
	// Wait until the broker serves every partition, so that a publisher's first write does not
	// meet UNKNOWN_TOPIC_OR_PARTITION.
	if err := kafkatest.WaitForLeaders(ctx, e.admin, topic, e.cfg.partitions); err != nil {
		return "", fmt.Errorf("topic %s: %w", topic, err)
	}
	return topic, nil
}

// newAppendTimeTopic is newTopic with records stamped by the broker when it appends them
// (message.timestamp.type=LogAppendTime): the same clock for every publisher, and the point that
// splits a latency into the publisher's part and the consumer's.
func (e *env) newAppendTimeTopic(ctx context.Context, prefix string) (string, error) {
	appendTime := "LogAppendTime"
	return e.newTopicWith(ctx, prefix, map[string]*string{"message.timestamp.type": &appendTime})
}

// topicBytes returns the size of topic's log on the broker's disk, as the broker describes its
// log directories.
func (e *env) topicBytes(ctx context.Context, topic string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dirs, err := e.admin.DescribeAllLogDirs(ctx, nil) // every topic: Each below keeps this one
	if err != nil {
		return 0, err
	}
	var size int64
	dirs.Each(func(d kadm.DescribedLogDir) {
		for _, p := range d.Topics[topic] {
			size += p.Size
		}
	})
	return size, nil
}

// deleteTopic frees the broker's disk after a scenario.
func (e *env) deleteTopic(ctx context.Context, topic string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, _ = e.admin.DeleteTopics(ctx, topic)
}

// buildRelay builds cmd/relay into the scratch directory, as `make build` does.
func buildRelay(ctx context.Context, dir string) (string, error) {
	if _, err := os.Stat("cmd/relay/main.go"); err != nil {
		return "", fmt.Errorf("cmd/relay does not exist yet")
	}
	bin := filepath.Join(dir, "relay")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "./cmd/relay")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/relay: %w: %s", err, tail(string(out), 2000))
	}
	return bin, nil
}

// findKafkaPid finds the broker JVM started for this run: a kafka.Kafka process whose
// server.properties listens on our port. Zero when not found (CPU is then not attributed).
func findKafkaPid(brokers []string) int {
	if len(brokers) == 0 {
		return 0
	}
	want := "PLAINTEXT://" + brokers[0] + ","
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.Contains(string(b), "kafka.Kafka") {
			continue
		}
		for _, a := range args {
			if !strings.HasSuffix(a, "server.properties") {
				continue
			}
			props, err := os.ReadFile(a)
			if err != nil || !strings.Contains(string(props), want) {
				continue
			}
			var pid int
			if _, err := fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid); err == nil {
				return pid
			}
		}
	}
	return 0
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// pidSet runs query, whose rows are backend pids (int4), and returns them as a set.
func pidSet(ctx context.Context, conn *pgx.Conn, query string, args ...any) (map[int]bool, error) {
	rows, err := conn.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	pids := map[int]bool{}
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		pids[int(pid)] = true
	}
	return pids, rows.Err()
}

// relayBackends returns the pids of the PostgreSQL backends that serve relays (by their
// application name), so that their CPU can be told from the writers'.
func (e *env) relayBackends(ctx context.Context) (map[int]bool, error) {
	return relayBackendsOn(ctx, e.pg)
}

// relayBackendsOn is relayBackends on server srv.
func relayBackendsOn(ctx context.Context, srv *pgtest.Server) (map[int]bool, error) {
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	pids, err := pidSet(ctx, conn, `SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'outbox-relay %'`)
	if err != nil {
		return nil, fmt.Errorf("list the relays' backends: %w", err)
	}
	if len(pids) < 2 {
		return nil, fmt.Errorf("%d PostgreSQL backends with an application name of outbox-relay, want 2 (lock and listen connections)", len(pids))
	}
	return pids, nil
}
