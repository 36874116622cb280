package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// The debezium scenario measures the peer users would pick instead of the relay, Debezium's
// PostgreSQL connector with its Outbox Event Router on Kafka Connect (hack/debezium.sh), side by
// side with the relay in each of its tracking modes: the same PostgreSQL server (wal_level=logical,
// durable: fsync and synchronous_commit on), the same broker, the same load, one after the other
// in one run.

// Keys of the publishers the debezium scenario compares.
const (
	peerDebezium  = "debezium"
	peerRelayRow  = "relay-row"
	peerRelaySnap = "relay-snapshot"
	// peerRelayEOS: snapshot tracking with exactly-once delivery (a Kafka transaction per batch,
	// with the shard's cursor record), measured against the same load as the others.
	peerRelayEOS    = "relay-snapshot-eos"
	debeziumSlot    = "outbox_debezium"
	debeziumPub     = "outbox_debezium"
	debeziumScript  = "hack/debezium.sh"
	debeziumChunk   = 10_000 // events per transaction of the backlog
	debeziumVersion = "Debezium 3.6.1.Final (debezium-connector-postgres, Outbox Event Router from debezium-connect-plugins) on Kafka Connect 4.3.1, standalone worker"
)

// logicalSettings are the server settings of the debezium scenario: the durable server's, with
// logical decoding for Debezium (the relay does not need it; it runs on the same server so that
// both pay for the same WAL).
var logicalSettings = []string{"wal_level = logical", "fsync = on", "synchronous_commit = on", "full_page_writes = on", "track_commit_timestamp = on"}

// DebeziumResult is the debezium scenario: one PeerResult per publisher.
type DebeziumResult struct {
	Settings string        `json:"settings"`  // the server's settings
	WorkMem  string        `json:"workMem"`   // logical_decoding_work_mem
	Version  string        `json:"version"`   // what ran as the peer
	Worker   string        `json:"worker"`    // Connect's worker.properties as run (no secrets)
	Conn     string        `json:"connector"` // the connector's properties as run (password redacted)
	JVM      string        `json:"jvm"`       // the worker's JVM flags
	Backlog  int64         `json:"backlog"`
	Chunk    int           `json:"chunk"`
	Rates    []float64     `json:"rates"` // latency rates, events/s
	Peers    []*PeerResult `json:"peers"`
	// Floor is the latency no publisher beats here, at each rate (floor.go).
	Floor []*LatencyResult `json:"floor,omitempty"`
	// Rounds is how many interleaved rounds ran at each of RoundRates (rounds.go).
	Rounds     int       `json:"rounds,omitempty"`
	RoundRates []float64 `json:"roundRates,omitempty"`
	Skipped    string    `json:"skipped,omitempty"` // why nothing was measured
	Err        string    `json:"error,omitempty"`
}

func (d *DebeziumResult) peer(key string) *PeerResult {
	if d == nil {
		return nil
	}
	for _, p := range d.Peers {
		if p.Key == key {
			return p
		}
	}
	return nil
}

// PeerResult is what one publisher did on the common load.
type PeerResult struct {
	Key  string `json:"key"`
	Name string `json:"name"`
	// ColdStartMs: from the process's start to the broker's append of the first event
	// (committed before; ms resolution); ColdArriveMs: to its arrival at the consumer. ReadyMs:
	// from the start to ready (the relay's /readyz; the connector and its task RUNNING).
	ColdStartMs  float64          `json:"coldStartMs"`
	ColdArriveMs float64          `json:"coldArriveMs"`
	ReadyMs      float64          `json:"readyMs"`
	Drain        *PeerDrain       `json:"drain,omitempty"`
	Latency      []*LatencyResult `json:"latency,omitempty"`
	// LatencyAsync is the latency at the first rate with the writers' synchronous_commit off
	// (ALTER DATABASE): WAL reaches the disk, and so the walsender, every wal_writer_delay.
	LatencyAsync *LatencyResult `json:"latencyAsync,omitempty"`
	// LatencyNotify (relays only) is the latency at each rate with the relay woken by
	// notifications (--notify, the table's insert trigger) instead of polling.
	LatencyNotify []*LatencyResult `json:"latencyNotify,omitempty"`
	// Rounds and RoundsNotify are its windows in the interleaved rounds (rounds.go), in order,
	// polling (Debezium: its own) and notified.
	Rounds       []*LatencyResult `json:"rounds,omitempty"`
	RoundsNotify []*LatencyResult `json:"roundsNotify,omitempty"`
	PeakRSS      int64            `json:"peakRSS"` // VmHWM of the publisher process at its end
	Check        *OutputCheck     `json:"check,omitempty"`
	Err          string           `json:"error,omitempty"`
}

// snapshot reports whether p is a relay under snapshot tracking.
func (p *PeerResult) snapshot() bool { return p.Key == peerRelaySnap || p.Key == peerRelayEOS }

func (p *PeerResult) fail(err error) {
	p.Err = errors.Join(errors.New(p.Err), err).Error()
	p.Err = strings.TrimPrefix(p.Err, "\n")
	progress("%s: FAILED: %v", p.Name, err)
}

// PeerDrain is the drain of a backlog written while the publisher was stopped (after its
// replication slot existed), from the publisher's start to the last event received.
type PeerDrain struct {
	Events  int64   `json:"events"`
	Seconds float64 `json:"seconds"` // start to the last event received
	Rate    float64 `json:"rate"`    // Events / Seconds
	// FirstMs: from the start to the first event received; SteadyRate: events per second
	// between the first and the last (start-up excluded).
	FirstMs    float64   `json:"firstMs"`
	SteadyRate float64   `json:"steadyRate"`
	CPU        *CPUUsage `json:"cpu,omitempty"`
}

// publisher is a relay or the Connect worker, as the scenario drives it.
type publisher interface {
	pids() []int
	alive() error
	rss() (int64, error)
	stop() error
}

type relayPub struct{ g relayGroup }

func (r *relayPub) pids() []int         { return r.g.pids() }
func (r *relayPub) alive() error        { return r.g.checkRunning() }
func (r *relayPub) rss() (int64, error) { return r.g.peakRSS() }
func (r *relayPub) stop() error         { return r.g.stop() }

// connectProc is a Connect worker started by hack/debezium.sh.
type connectProc struct {
	dir string
	env []string
	pid int
}

func (c *connectProc) pids() []int {
	if c.pid == 0 {
		return nil
	}
	return []int{c.pid}
}

func (c *connectProc) alive() error {
	if err := syscallKill0(c.pid); err != nil {
		return fmt.Errorf("the Connect worker (pid %d) exited:\n%s", c.pid, fileTail(filepath.Join(c.dir, "connect.log"), 3000))
	}
	return nil
}

func (c *connectProc) rss() (int64, error) { return peakRSS(c.pid) }

func (c *connectProc) stop() error {
	if c.pid == 0 {
		return nil
	}
	c.pid = 0
	out, err := runScript(c.env, "stop", c.dir)
	if err != nil {
		return fmt.Errorf("%s stop: %w: %s", debeziumScript, err, out)
	}
	return nil
}

func syscallKill0(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Signal(syscall.Signal(0))
}

func fileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	return tail(string(b), n)
}

// runScript runs hack/debezium.sh with env and returns its stdout (stderr on failure).
func runScript(env []string, args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{debeziumScript}, args...)...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return tail(errb.String(), 3000), err
	}
	return out.String(), nil
}

// debeziumEnv is the environment hack/debezium.sh gets for the database in dbURL.
func (e *env) debeziumEnv(srv *pgtest.Server, db, topic string, restPort int) []string {
	return append(relayEnviron(),
		"OUTBOX_CACHE="+os.Getenv("OUTBOX_CACHE"),
		"DEBEZIUM_BOOTSTRAP="+strings.Join(e.kafka.Brokers, ","),
		"DEBEZIUM_PG_HOST=127.0.0.1",
		"DEBEZIUM_PG_PORT="+strconv.Itoa(srv.Port),
		"DEBEZIUM_PG_USER="+publisherRole, // its statements told from everyone else's (cost.go)
		"DEBEZIUM_PG_DB="+db,
		"DEBEZIUM_TABLE="+e.table.String(),
		"DEBEZIUM_TOPIC_MAP=order="+topic,
		"DEBEZIUM_SLOT="+debeziumSlot,
		"DEBEZIUM_PUBLICATION="+debeziumPub,
		"DEBEZIUM_REST_PORT="+strconv.Itoa(restPort),
		"DEBEZIUM_OWNER_PID="+strconv.Itoa(os.Getpid()),
	)
}

// startConnect starts the worker with its state in dir and waits until the connector runs.
func startConnect(env []string, dir string) (*connectProc, error) {
	out, err := runScript(env, "start", dir)
	if err != nil {
		return nil, fmt.Errorf("%s start: %w:\n%s", debeziumScript, err, out)
	}
	c := &connectProc{dir: dir, env: env}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "pid="); ok {
			c.pid, _ = strconv.Atoi(v)
		}
	}
	if c.pid == 0 {
		return nil, fmt.Errorf("%s start printed no pid: %q", debeziumScript, out)
	}
	return c, nil
}

// debeziumMissing says why Debezium cannot run here ("" when it can): the bench skips it then.
func debeziumMissing() string {
	for _, tool := range []string{"java", "mvn", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("%s not found (hack/setup.sh installs it)", tool)
		}
	}
	if _, err := os.Stat(debeziumScript); err != nil {
		return debeziumScript + " not found"
	}
	return ""
}

// scenarioDebezium runs the side by side.
func (e *env) scenarioDebezium(ctx context.Context, res *Results) {
	// pg_stat_statements is loaded in every run: it counts each publisher's statements per event
	// (cost.go), the same small overhead for all of them.
	settings := append(slices.Clone(logicalSettings), "shared_preload_libraries = 'pg_stat_statements'")
	d := &DebeziumResult{Version: debeziumVersion, Settings: strings.Join(settings, ", "), Backlog: e.cfg.backlog,
		Chunk: debeziumChunk, Rates: e.cfg.peerRates}
	res.Debezium = d
	d.Peers = []*PeerResult{
		{Key: peerDebezium, Name: "Debezium (Connect worker)"},
		{Key: peerRelayRow, Name: "relay, row tracking"},
		{Key: peerRelaySnap, Name: "relay, snapshot tracking"},
		{Key: peerRelayEOS, Name: "relay, snapshot tracking, exactly-once"},
	}
	if why := debeziumMissing(); why != "" {
		d.Skipped = why
		res.note("debezium: not measured: %s", why)
	} else {
		progress("debezium: fetching Kafka Connect and Debezium (once, into the cache)")
		if out, err := runScript(os.Environ(), "fetch"); err != nil {
			d.Skipped = fmt.Sprintf("%s fetch failed: %v: %s", debeziumScript, err, firstLine(out, 300))
			res.note("debezium: not measured: %s", d.Skipped)
		}
	}
	if err := e.debeziumConfig(d); err != nil && d.Skipped == "" {
		d.Skipped = err.Error()
	}
	progress("debezium: starting PostgreSQL with %s", d.Settings)
	srv, err := startServerWith(ctx, settings...)
	if err != nil {
		d.Err = err.Error()
		progress("debezium: FAILED: %v", err)
		return
	}
	defer srv.Close()
	if err := createPublisherRole(ctx, srv); err != nil {
		d.Err = err.Error()
		progress("debezium: FAILED: %v", err)
		return
	}
	if conn, err := pgx.Connect(ctx, srv.URL("postgres")); err == nil {
		_ = conn.QueryRow(ctx, "SHOW logical_decoding_work_mem").Scan(&d.WorkMem)
		conn.Close(context.Background())
	}
	e.runFloor(ctx, srv, d)
	var rigs []*peerRig // the publishers measured, for the interleaved rounds
	for _, p := range d.Peers {
		if ctx.Err() != nil {
			p.fail(ctx.Err())
			continue
		}
		if e.cfg.peers != nil && !e.cfg.peers[p.Key] {
			p.Err = "not measured: not selected (-peers)"
			continue
		}
		if p.Key == peerDebezium && d.Skipped != "" {
			p.Err = "not measured: " + d.Skipped
			continue
		}
		if p.Key != peerDebezium && e.relayBin == "" {
			p.fail(fmt.Errorf("no relay binary: %w", e.relayErr))
			continue
		}
		rig, err := e.preparePeer(ctx, srv, p)
		if err != nil {
			p.fail(err)
			continue
		}
		defer rig.close()
		e.runPeer(ctx, srv, d, rig)
		if p.Err == "" {
			rigs = append(rigs, rig)
		}
	}
	e.runPeerRounds(ctx, srv, d, rigs)
}

// debeziumConfig records the configuration hack/debezium.sh writes, the password redacted.
func (e *env) debeziumConfig(d *DebeziumResult) error {
	dir, err := os.MkdirTemp(e.tmp, "debezium-config-")
	if err != nil {
		return err
	}
	env := append(os.Environ(), "DEBEZIUM_TOPIC_MAP=order=<the relay's topic>", "DEBEZIUM_PG_DB=<database>",
		"DEBEZIUM_SLOT="+debeziumSlot, "DEBEZIUM_PUBLICATION="+debeziumPub, "DEBEZIUM_TABLE="+e.table.String(),
		"DEBEZIUM_BOOTSTRAP=<broker>", "DEBEZIUM_PG_PORT=<port>", "DEBEZIUM_REST_PORT=<port>")
	if out, err := runScript(env, "config", dir); err != nil {
		return fmt.Errorf("%s config: %w: %s", debeziumScript, err, out)
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		var keep []string
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			switch {
			case strings.HasPrefix(line, "database.password="):
				line = "database.password=<redacted>"
			case strings.HasPrefix(line, "plugin.path="):
				line = "plugin.path=<cache>/plugins"
			case strings.HasPrefix(line, "offset.storage.file.filename="):
				line = "offset.storage.file.filename=<state dir>/offsets.dat"
			}
			if line != "" {
				keep = append(keep, line)
			}
		}
		return strings.Join(keep, "\n")
	}
	d.Worker, d.Conn = read("worker.properties"), read("connector.properties")
	if b, err := os.ReadFile(debeziumScript); err == nil {
		if _, rest, ok := strings.Cut(string(b), "java_opts() {\n\techo \""); ok {
			d.JVM, _, _ = strings.Cut(rest, " -Dlog4j2")
		}
	}
	return nil
}

// createPublication creates the publication Debezium reads (publication.autocreate.mode is
// disabled): inserts only (the relay's marks are updates), through the partitioned root.
func createPublication(ctx context.Context, dbURL, table string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)",
		pgx.Identifier{debeziumPub}.Sanitize(), table))
	return err
}

// dropSlot drops Debezium's slot (a database with a slot cannot be dropped).
func dropSlot(ctx context.Context, srv *pgtest.Server) {
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		return
	}
	defer conn.Close(context.Background())
	_, _ = conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", debeziumSlot)
}

// debeziumBackends returns the pids of Debezium's PostgreSQL backends: its walsender (the slot's
// active pid, which appears once the task streams, a little after the REST API says RUNNING)
// and its other connections.
func debeziumBackends(ctx context.Context, srv *pgtest.Server) (map[int]bool, error) {
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	deadline := time.Now().Add(time.Minute)
	for {
		var active bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL)`,
			debeziumSlot).Scan(&active)
		if err != nil {
			return nil, err
		}
		if active {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("the replication slot has no walsender a minute after the start: Debezium is not streaming")
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return pidSet(ctx, conn, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL
		UNION SELECT pid FROM pg_stat_activity WHERE application_name ILIKE 'debezium%'`, debeziumSlot)
}

// since is the time from t0 in milliseconds.
func since(t0, t time.Time) float64 { return ms(t.Sub(t0)) }
