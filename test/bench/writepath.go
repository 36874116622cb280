package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// WritePathRow is one level of the write-path scenario: a number of concurrent writers, a relay
// state, and the three transaction shapes measured in interleaved rounds.
type WritePathRow struct {
	Writers int `json:"writers"`
	// Relay is the relay state: always (no relay, and every insert notifies: the behaviour
	// before wake-ups on demand, kept by migration 00005 until a relay claims), none (no relay
	// waits), poll (no insert trigger at all: relays that poll, migration 00010), idle (a relay
	// runs, caught up when the load starts), draining (a relay drains a backlog through the
	// level); poll-snapshot, snapshot-idle and snapshot-draining are poll, idle and draining on
	// a table tracked by snapshot (without the pending index: outboxdb/indexes.go), the relay
	// tracking by snapshot. The others are a table tracked by row, with every index.
	Relay string `json:"relay"`
	// Transactions per second and p99 transaction latency (BEGIN to COMMIT returned) of
	//   plain:  INSERT a business row + INSERT the same event into a plain table with a primary
	//           key only (the shape of a Debezium outbox table; bigint identity key)
	//   append: INSERT a business row + outbox.Append
	//   nolock: INSERT a business row + outbox.Append with WithoutAggregateLock
	PlainTPS  float64 `json:"plainTps"`
	AppendTPS float64 `json:"appendTps"`
	// The spread of the Append/plain ratio from round to round (each round's two shapes run one
	// after the other): its lower and upper quartiles. On a shared machine it says how far the
	// ratio above can be read.
	AppendRatioQ1 float64 `json:"appendRatioQ1,omitempty"`
	AppendRatioQ3 float64 `json:"appendRatioQ3,omitempty"`
	// Every round's Append/plain ratio, in the order the rounds ran.
	AppendRatios []float64 `json:"appendRatios,omitempty"`
	// Rounds is the number of rounds of each shape at this level.
	Rounds    int     `json:"rounds,omitempty"`
	NoLockTPS float64 `json:"noLockTps"`
	PlainP99  float64 `json:"plainP99Ms"`
	AppendP99 float64 `json:"appendP99Ms"`
	NoLockP99 float64 `json:"noLockP99Ms"`
	// Notifications an independent LISTEN received per 1,000 append transactions.
	NotifyPer1k float64 `json:"notifyPer1k"`
	// PostgreSQL CPU per transaction, µs, of the plain and append shapes.
	PlainPGUS  float64 `json:"plainPgUs"`
	AppendPGUS float64 `json:"appendPgUs"`
	NoLockPGUS float64 `json:"noLockPgUs,omitempty"`
	// CPU per transaction of the load generator (the application: pgx, and for Append its
	// validation), µs, of the plain and append shapes; it runs on the same two cores.
	PlainAppUS  float64 `json:"plainAppUs"`
	AppendAppUS float64 `json:"appendAppUs"`
	// The inserts-snapshot state measures, beside plain, plain INSERTs into the outbox instead of
	// Append (no aggregate lock: what a writer in any language gets from INSERT INTO outbox) and
	// plain INSERTs into an outbox whose lock trigger is on (spec.writers.plainInserts: Locked,
	// migration 00019), both tables tracked by snapshot.
	InsertTPS        float64 `json:"insertTps,omitempty"`
	LockedInsertTPS  float64 `json:"lockedInsertTps,omitempty"`
	InsertP99        float64 `json:"insertP99Ms,omitempty"`
	LockedInsertP99  float64 `json:"lockedInsertP99Ms,omitempty"`
	InsertPGUS       float64 `json:"insertPgUs,omitempty"`
	LockedInsertPGUS float64 `json:"lockedInsertPgUs,omitempty"`
}

// WritePathResult is the write-path scenario: what appending an event costs the application's
// commits under concurrency, on a durable server.
type WritePathResult struct {
	// Started is when the scenario ran, when it ran apart from the rest of the report.
	Started  string         `json:"started,omitempty"`
	Settings string         `json:"settings"`
	Round    float64        `json:"roundSeconds"`
	Rounds   int            `json:"rounds"`
	Rows     []WritePathRow `json:"rows"`
	Err      string         `json:"error,omitempty"`
}

// Row returns the row for writers and relay state, nil when not measured.
func (r *WritePathResult) Row(writers int, relay string) *WritePathRow {
	if r == nil {
		return nil
	}
	for i := range r.Rows {
		if r.Rows[i].Writers == writers && r.Rows[i].Relay == relay {
			return &r.Rows[i]
		}
	}
	return nil
}

// durableSettings are the server settings of the write-path scenarios: what production runs.
const durableSettings = "fsync=on, synchronous_commit=on, full_page_writes=on"

// startDurablePostgres starts a second server for the scenarios that must reflect production
// commits: fsync, synchronous_commit and full_page_writes on (the test server turns them off).
func startDurablePostgres(ctx context.Context) (*pgtest.Server, error) {
	return startServerWith(ctx, "fsync = on", "synchronous_commit = on", "full_page_writes = on")
}

// durableDatabase creates a fresh database with the outbox schema on the durable server.
func (e *env) durableDatabase(ctx context.Context, name string) (string, error) {
	return createDatabaseOn(ctx, e.durable, e.table, name, 1)
}

// writePathLevels are the measured levels: without the insert trigger (the relays poll, the
// default: migration 00010) on a table tracked by snapshot (the default) and on one tracked by
// row, one writer (the µs of one transaction) and 32 and 64; then with a relay running (caught
// up when the load starts) and with a relay draining a backlog, in each mode; last the opt-in
// insert trigger, as before wake-ups on demand and with no relay waiting.
var writePathLevels = []struct {
	writers int
	relay   string
}{
	{1, "poll-snapshot"}, {32, "poll-snapshot"}, {64, "poll-snapshot"},
	{1, "poll"}, {32, "poll"}, {64, "poll"},
	{32, "snapshot-idle"}, {64, "snapshot-idle"},
	{32, "idle"}, {64, "idle"},
	{32, "snapshot-draining"}, {64, "snapshot-draining"},
	{32, "draining"}, {64, "draining"},
	{1, "always"}, {32, "always"}, {64, "always"},
	{32, "none"}, {64, "none"},
	{32, "inserts-snapshot"}, {64, "inserts-snapshot"},
	{1, checksTableState}, {32, checksTableState}, {64, checksTableState},
}

// checksTableState is poll-snapshot on a table with its four CHECKs (spec.writers.checks: Table,
// migration 00022; every state's table is made as a new one is, without them:
// outboxdb.NewTableChecks).
const checksTableState = "checks-table"

// insertsState is the write-path state that measures plain INSERTs (WritePathRow.InsertTPS).
const insertsState = "inserts-snapshot"

// lockedTable is the second outbox table of insertsState, the one with the lock trigger.
func (e *env) lockedTable() outboxdb.Table {
	return outboxdb.Table{Schema: e.table.Schema, Name: e.table.Name + "_locked"}
}

// insertShapes returns plain, a plain INSERT into the outbox and one into the locked outbox, in
// the slots of shapePlain, shapeAppend and shapeNoLock.
func (e *env) insertShapes(shapes []appShape) []appShape {
	return []appShape{shapePlain: shapes[shapePlain], shapeAppend: insertEventShape(e.table.Ident()), shapeNoLock: insertEventShape(e.lockedTable().Ident())}
}

// setUpLockedTable creates the second outbox table of insertsState, tracked by snapshot (no
// pending index), with its lock trigger on.
func (e *env) setUpLockedTable(ctx context.Context, url string) error {
	t := e.lockedTable()
	if err := pgtest.OutboxSchema(ctx, url, t, 1); err != nil {
		return err
	}
	if err := asNewTable(ctx, url, t); err != nil { // as the first table (createDatabaseOn)
		return err
	}
	if err := oneShardIndexes(ctx, url, t); err != nil {
		return err
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := outboxdb.DropPendingIndex(ctx, db, t, 10*time.Second); err != nil {
		return err
	}
	_, err = outboxdb.SetLockedInserts(ctx, db, t, true, 10*time.Second)
	return err
}

// snapshotState reports whether a write-path state runs on a table tracked by snapshot.
func snapshotState(state string) bool {
	return state == "poll-snapshot" || strings.HasPrefix(state, "snapshot-")
}

// scenarioWritePath: what appending an event costs the application's commits with 1 to 64
// concurrent writers, on the durable server.
func (e *env) scenarioWritePath(ctx context.Context, res *Results) {
	wr := &WritePathResult{Started: time.Now().UTC().Format(time.RFC3339), Settings: durableSettings, Round: e.cfg.writeRound.Seconds(), Rounds: e.cfg.writeRounds}
	res.WritePath = wr
	if err := e.runWritePath(ctx, wr); err != nil {
		wr.Err = err.Error()
		progress("writepath: FAILED: %v", err)
	}
}

func (e *env) runWritePath(ctx context.Context, wr *WritePathResult) error {
	shapes, err := e.appShapes()
	if err != nil {
		return err
	}
	var (
		state   string
		url     string
		pool    *pgxpool.Pool
		relays  relayGroup
		topic   string
		seq     atomic.Int64
		backlog int64
	)
	cleanup := func() {
		if relays != nil {
			_ = relays.stop()
			relays = nil
		}
		if topic != "" {
			e.deleteTopic(context.Background(), topic)
			topic = ""
		}
		if pool != nil {
			pool.Close()
			pool = nil
		}
	}
	defer cleanup()
	for _, lv := range writePathLevels {
		if e.cfg.writeStates != nil && !e.cfg.writeStates[lv.relay] {
			continue
		}
		if lv.relay != state { // a fresh database, and the relay the state asks for
			cleanup()
			state = lv.relay
			if url, err = e.durableDatabase(ctx, "bench_writepath"); err != nil {
				return err
			}
			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				return err
			}
			cfg.MaxConns = 70
			if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
				return err
			}
			if err := e.createBusinessTables(ctx, pool); err != nil {
				return err
			}
			if err := oneShardIndexes(ctx, url, e.table); err != nil {
				return err
			}
			switch state {
			case "always": // notify, and the migration's initial claim: every insert notifies
				if err := e.setNotify(ctx, url, true); err != nil {
					return err
				}
				if _, err := pool.Exec(ctx, `SELECT setval($1::regclass, 9000000000000000)`, e.table.Derived("wake_until")); err != nil {
					return err
				}
			case "none": // notify, and no claim lives (what a relay does when it wakes)
				if err := e.setNotify(ctx, url, true); err != nil {
					return err
				}
				if _, err := pool.Exec(ctx, outboxdb.WakeStatements(e.table).Woke); err != nil {
					return err
				}
			case "poll": // the default: relays poll, the table has no insert trigger
			case "poll-snapshot": // and the table is tracked by snapshot
				if err := e.setSnapshotIndexes(ctx, url, false); err != nil {
					return err
				}
			case checksTableState: // as poll-snapshot, with the CHECKs
				if err := e.setSnapshotIndexes(ctx, url, false); err != nil {
					return err
				}
				if err := setChecksAt(ctx, url, e.table, true); err != nil {
					return err
				}
			case insertsState: // as poll-snapshot, and a second table whose plain inserts lock
				if err := e.setSnapshotIndexes(ctx, url, false); err != nil {
					return err
				}
				if err := e.setUpLockedTable(ctx, url); err != nil {
					return err
				}
			default: // a relay with default settings (it polls)
				if relays, topic, err = e.idleRelay(ctx, url, "writepath-"+state, snapshotState(state)); err != nil {
					return err
				}
				if snapshotState(state) {
					if err := e.setSnapshotIndexes(ctx, url, true); err != nil {
						return err
					}
				}
			}
		}
		draining := strings.HasSuffix(state, "draining")
		if draining {
			// Enough pending events that the relay drains through every round of the level.
			n := e.cfg.writeBacklog
			progress("writepath: %d pending events for the relay to drain", n)
			conn, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			err = insertPending(ctx, conn, e.table, backlog+1, n, e.cfg.aggregates)
			conn.Release()
			if err != nil {
				return err
			}
			backlog += n
		}
		levelShapes := shapes
		if state == insertsState {
			levelShapes = e.insertShapes(shapes)
		}
		rounds := e.cfg.writeRounds
		if lv.writers > 1 && (state == "poll-snapshot" || state == checksTableState) {
			rounds = max(rounds, e.cfg.writeTargetRounds)
		}
		row, err := e.writePathLevel(ctx, url, pool, lv.writers, rounds, levelShapes, &seq)
		if err != nil {
			return fmt.Errorf("%d writers, relay %s: %w", lv.writers, state, err)
		}
		row.Relay = state
		if state == insertsState {
			row.InsertTPS, row.LockedInsertTPS = row.AppendTPS, row.NoLockTPS
			row.InsertP99, row.LockedInsertP99 = row.AppendP99, row.NoLockP99
			row.InsertPGUS, row.LockedInsertPGUS = row.AppendPGUS, row.NoLockPGUS
			row.AppendTPS, row.NoLockTPS, row.AppendP99, row.NoLockP99, row.AppendPGUS, row.NoLockPGUS = 0, 0, 0, 0, 0, 0
			row.AppendAppUS, row.NotifyPer1k = 0, 0
			progress("writepath: %2d writers, plain %6.0f tx/s | INSERT into the outbox %.2fx | with the lock trigger %.2fx | PostgreSQL %.0f / %.0f / %.0f µs/tx",
				row.Writers, row.PlainTPS, row.InsertTPS/row.PlainTPS, row.LockedInsertTPS/row.PlainTPS, row.PlainPGUS, row.InsertPGUS, row.LockedInsertPGUS)
			wr.Rows = append(wr.Rows, row)
			continue
		}
		if draining {
			var left int64
			if err := pool.QueryRow(ctx, `SELECT `+e.table.Derived("pending")+`()`).Scan(&left); err != nil {
				return err
			}
			if left == 0 {
				progress("writepath: note: the backlog was drained before the level ended")
			}
		}
		if relays != nil {
			if err := relays.checkRunning(); err != nil {
				return err
			}
		}
		wr.Rows = append(wr.Rows, row)
		progress("writepath: %2d writers, relay %-8s plain %6.0f tx/s p99 %5.1f ms | Append %6.0f tx/s (%.2fx) p99 %5.1f ms (%.2fx) | no lock %.2fx | %.1f notifications/1k tx | PostgreSQL %.0f vs %.0f µs/tx",
			row.Writers, row.Relay, row.PlainTPS, row.PlainP99, row.AppendTPS, row.AppendTPS/row.PlainTPS,
			row.AppendP99, row.AppendP99/row.PlainP99, row.NoLockTPS/row.PlainTPS, row.NotifyPer1k, row.AppendPGUS, row.PlainPGUS)
	}
	return nil
}

// writePathLevel measures the three shapes with n writers in interleaved rounds (the order
// rotates each round, so drift on the shared machine hits them alike).
func (e *env) writePathLevel(ctx context.Context, url string, pool *pgxpool.Pool, n, rounds int, shapes []appShape, seq *atomic.Int64) (WritePathRow, error) {
	row := WritePathRow{Writers: n, Rounds: rounds}
	// An independent LISTEN counts the notifications the append shapes send.
	lconn, err := pgx.Connect(ctx, url)
	if err != nil {
		return row, err
	}
	defer lconn.Close(context.Background())
	if _, err := lconn.Exec(ctx, "LISTEN "+pgx.Identifier{e.table.Channel()}.Sanitize()); err != nil {
		return row, err
	}
	var notified atomic.Int64
	lctx, stopListen := context.WithCancel(ctx)
	listenDone := make(chan struct{})
	go func() {
		defer close(listenDone)
		for {
			if _, err := lconn.WaitForNotification(lctx); err != nil {
				return
			}
			notified.Add(1)
		}
	}()
	groups := cpuGroups{pgMaster: postmasterPid(e.durable.DataDir)}
	var (
		total [3]loadResult
		wall  [3]time.Duration
		pgCPU [3]float64
		app   [3]time.Duration
		// notifications during the append shapes only
		appendNotes int64
		// each round's Append/plain ratio
		ratios []float64
	)
	if _, err := runLoad(ctx, pool, n, 300*time.Millisecond, shapes[shapeAppend], seq); err != nil { // warm up
		stopListen()
		<-listenDone
		return row, err
	}
	for r := range rounds {
		var roundTPS [3]float64
		for k := range shapes {
			s := (k + r) % len(shapes)
			before, notesBefore := groups.snapshot(), notified.Load()
			appBefore, _, _ := procTimes(os.Getpid())
			start := time.Now()
			lr, err := runLoad(ctx, pool, n, e.cfg.writeRound, shapes[s], seq)
			if err != nil {
				stopListen()
				<-listenDone
				return row, err
			}
			wall[s] += time.Since(start)
			roundTPS[s] = float64(lr.commits) / time.Since(start).Seconds()
			appAfter, _, _ := procTimes(os.Getpid())
			app[s] += appAfter - appBefore
			u := usageSince(before, groups.snapshot())
			pgCPU[s] += u.Postgres
			total[s].commits += lr.commits
			total[s].lat = append(total[s].lat, lr.lat...)
			if s == shapeAppend {
				time.Sleep(20 * time.Millisecond) // let the last notifications arrive
				appendNotes += notified.Load() - notesBefore
			}
		}
		if roundTPS[shapePlain] > 0 {
			ratios = append(ratios, roundTPS[shapeAppend]/roundTPS[shapePlain])
		}
	}
	stopListen()
	<-listenDone
	p99 := func(lat []time.Duration) float64 {
		slices.Sort(lat)
		return ms(percentile(lat, 99))
	}
	tps := func(s int) float64 { return float64(total[s].commits) / wall[s].Seconds() }
	row.PlainTPS, row.AppendTPS, row.NoLockTPS = tps(shapePlain), tps(shapeAppend), tps(shapeNoLock)
	row.AppendRatios = slices.Clone(ratios)
	if len(ratios) >= 4 {
		slices.Sort(ratios)
		row.AppendRatioQ1, row.AppendRatioQ3 = ratios[(len(ratios)-1)/4], ratios[len(ratios)-1-(len(ratios)-1)/4]
	}
	row.PlainP99 = p99(total[shapePlain].lat)
	row.AppendP99, row.NoLockP99 = p99(total[shapeAppend].lat), p99(total[shapeNoLock].lat)
	row.PlainPGUS = pgCPU[shapePlain] * 1e6 / float64(max(total[shapePlain].commits, 1))
	row.AppendPGUS = pgCPU[shapeAppend] * 1e6 / float64(max(total[shapeAppend].commits, 1))
	row.NoLockPGUS = pgCPU[shapeNoLock] * 1e6 / float64(max(total[shapeNoLock].commits, 1))
	row.PlainAppUS = float64(app[shapePlain].Microseconds()) / float64(max(total[shapePlain].commits, 1))
	row.AppendAppUS = float64(app[shapeAppend].Microseconds()) / float64(max(total[shapeAppend].commits, 1))
	row.NotifyPer1k = float64(appendNotes) * 1000 / float64(max(total[shapeAppend].commits, 1))
	return row, nil
}
