package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// targetReshardPauseMs is the longest publishing pause a reshard may cause.
const targetReshardPauseMs = 2000.0

// reshardSteps are the layouts the scenario moves through, after a first layout of 1 shard.
var reshardSteps = []int32{4, 2, 1}

const (
	reshardRelays     = 4               // relay processes, shard indexes 0..3, all following the layout
	reshardAggregates = 1000            // distinct aggregate ids of the load
	reshardWriters    = 8               // writer connections
	reshardDwell      = 3 * time.Second // load before the first change, between changes and after the last
)

// ReshardChange is one change of layout and the publishing pause it caused.
type ReshardChange struct {
	From int32 `json:"from"`
	To   int32 `json:"to"`
	// PauseMs is resumed_at - released_at of the layout row: from the first relay of the old
	// layout releasing its buckets to every bucket held by the new layout.
	PauseMs float64 `json:"pauseMs"`
	// TotalMs is requested_at to resumed_at: the request, the old layout finishing its batches
	// in flight, the switch and the new layout taking its buckets.
	TotalMs float64 `json:"totalMs"`
}

// ReshardResult is the reshard scenario: the publishing pause of each change under a steady load.
type ReshardResult struct {
	Snapshot   bool            `json:"snapshot,omitempty"` // the relays track progress by snapshot
	Rate       float64         `json:"rate"`               // target events/s of the load
	Achieved   float64         `json:"achieved"`           // events/s the writers committed
	Aggregates int             `json:"aggregates"`
	Relays     int             `json:"relays"`
	Changes    []ReshardChange `json:"changes"`
	MaxPauseMs float64         `json:"maxPauseMs"`
	Written    int             `json:"written"`  // events committed by the writers
	Received   int             `json:"received"` // distinct events the independent consumer read
	Duplicates int             `json:"duplicates"`
	// OutOfOrder counts events that arrived after a later event of the same aggregate.
	OutOfOrder int    `json:"outOfOrder"`
	Err        string `json:"error,omitempty"`
	Measured   bool   `json:"measured"`
}

// scenarioReshard: 4 relays follow the table's shard layout (--shard-count=0, as the operator
// runs them); under a steady load the layout moves 1 -> 4 -> 2 -> 1 shards with
// outboxdb.Reshard, and each change's publishing pause is read from the layout row. An
// independent consumer checks that every event arrived.
func (e *env) scenarioReshard(ctx context.Context, res *Results) {
	res.Reshard = &ReshardResult{Rate: e.cfg.latencyRate, Aggregates: reshardAggregates, Relays: reshardRelays}
	res.ReshardSnapshot = &ReshardResult{Snapshot: true, Rate: e.cfg.latencyRate, Aggregates: reshardAggregates, Relays: reshardRelays}
	for _, rr := range []*ReshardResult{res.Reshard, res.ReshardSnapshot} {
		if err := e.runReshard(ctx, rr); err != nil {
			rr.Err = err.Error()
			progress("reshard (snapshot tracking %v): FAILED: %v", rr.Snapshot, err)
		}
	}
}

func (e *env) runReshard(ctx context.Context, rr *ReshardResult) error {
	dbName := "bench_reshard"
	if rr.Snapshot {
		dbName = "bench_reshard_snapshot"
	}
	defer e.dropDatabase(context.Background(), dbName)
	url, err := e.createDatabase(ctx, dbName, 1)
	if err != nil {
		return err
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	topic, err := e.newTopic(ctx, "reshard")
	if err != nil {
		return err
	}
	defer e.deleteTopic(context.Background(), topic)

	var g relayGroup
	defer func() { _ = g.stop() }()
	for k := range reshardRelays {
		p, err := e.startRelay(ctx, fmt.Sprintf("reshard-%d", k), url, topic, relayOptions{follow: true, shardIndex: k, snapshot: rr.Snapshot})
		if err != nil {
			return err
		}
		g = append(g, p)
	}
	// Every relay holds its presence lock (up, standing by: the table has no layout yet).
	if err := waitFor(ctx, time.Minute, "all relays present", func() (bool, error) {
		if err := g.checkRunning(); err != nil {
			return false, err
		}
		locks, err := outboxdb.ReadRelayLocks(ctx, db, e.table)
		return len(locks.Present) == reshardRelays, err
	}); err != nil {
		return err
	}
	if ok, err := outboxdb.SwitchLayout(ctx, db, e.table, 1); err != nil {
		return err
	} else if !ok {
		return errors.New("setting the first layout of 1 shard failed: a relay holds a bucket")
	}
	if err := g[0].waitReady(ctx, time.Minute); err != nil {
		return err
	}

	// The consumer: an independent client, reading the topic from its start.
	var (
		mu         sync.Mutex
		seen       = map[int]int{}
		lastSeq    = map[int]int{} // per aggregate, the largest seq received
		badRecs    int
		outOfOrder int
	)
	cl, err := e.newTopicConsumer(topic)
	if err != nil {
		return err
	}
	defer cl.Close()
	cctx, stopConsumer := context.WithCancel(ctx)
	defer stopConsumer()
	consumerDone := make(chan struct{})
	go func() {
		defer close(consumerDone)
		for cctx.Err() == nil {
			fetches := cl.PollFetches(cctx)
			mu.Lock()
			fetches.EachRecord(func(r *kgo.Record) {
				var v struct{ Seq int }
				if err := json.Unmarshal(r.Value, &v); err != nil || v.Seq < 0 {
					badRecs++
					return
				}
				if seen[v.Seq] == 0 {
					agg := v.Seq % reshardAggregates
					if last, ok := lastSeq[agg]; ok && last > v.Seq {
						outOfOrder++
					} else {
						lastSeq[agg] = v.Seq
					}
				}
				seen[v.Seq]++
			})
			mu.Unlock()
		}
	}()

	// The load: writers commit one event per transaction on a fixed schedule until stopped.
	// Writer w commits the seqs w, w+writers, w+2*writers, ...; committed[w] counts them, so the
	// seqs written are exactly those with seq/writers < committed[seq%writers].
	progress("reshard: %d relays following the layout, load of %.0f events/s over %d aggregates", reshardRelays, rr.Rate, reshardAggregates)
	insert := e.seqInsert()
	interval := time.Duration(float64(time.Second) / rr.Rate)
	committed := make([]int, reshardWriters)
	stopLoad := make(chan struct{})
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		writeErr error
	)
	t0 := time.Now().Add(100 * time.Millisecond)
	for w := range reshardWriters {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			close(stopLoad)
			wg.Wait()
			return err
		}
		defer conn.Close(context.Background())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i += reshardWriters {
				if d := time.Until(t0.Add(time.Duration(i) * interval)); d > 0 {
					select {
					case <-stopLoad:
						return
					case <-time.After(d):
					}
				}
				select {
				case <-stopLoad:
					return
				default:
				}
				if ctx.Err() != nil {
					return
				}
				agg := fmt.Sprintf("order-%d", i%reshardAggregates)
				if _, err := conn.Exec(ctx, insert, agg, seqPayload(i, agg)); err != nil {
					errMu.Lock()
					writeErr = errors.Join(writeErr, fmt.Errorf("writer %d: %w", w, err))
					errMu.Unlock()
					return
				}
				committed[w]++ // read only after wg.Wait
			}
		}()
	}
	loadRunning := true
	endLoad := func() {
		if loadRunning {
			loadRunning = false
			close(stopLoad)
			wg.Wait()
		}
	}
	defer endLoad()
	dwell := func() error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(reshardDwell):
		}
		errMu.Lock()
		defer errMu.Unlock()
		if writeErr != nil {
			return writeErr
		}
		return g.checkRunning()
	}

	if err := dwell(); err != nil {
		return err
	}
	from := int32(1)
	for _, to := range reshardSteps {
		c, err := e.reshardOnce(ctx, db, from, to)
		if err != nil {
			return err
		}
		rr.Changes = append(rr.Changes, c)
		rr.MaxPauseMs = max(rr.MaxPauseMs, c.PauseMs)
		progress("reshard: %d -> %d shards: publishing paused %.0f ms (%.0f ms from the request)", from, to, c.PauseMs, c.TotalMs)
		from = to
		if err := dwell(); err != nil {
			return err
		}
	}
	endLoad()
	loadSeconds := time.Since(t0).Seconds()
	if writeErr != nil {
		return writeErr
	}
	for _, n := range committed {
		rr.Written += n
	}
	rr.Achieved = float64(rr.Written) / loadSeconds

	// Nothing pending, then every event at the consumer.
	if err := waitFor(ctx, time.Minute, "the outbox to drain", func() (bool, error) {
		if err := g.checkRunning(); err != nil {
			return false, err
		}
		var pending int
		err := db.QueryRowContext(ctx, "SELECT "+e.table.Derived("pending")+"()").Scan(&pending)
		return pending == 0, err
	}); err != nil {
		return err
	}
	received := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	_ = waitFor(ctx, 30*time.Second, "", func() (bool, error) { return received() >= rr.Written, nil })
	stopConsumer()
	<-consumerDone

	for seq, n := range seen {
		if seq/reshardWriters >= committed[seq%reshardWriters] {
			badRecs++ // an event no writer committed
			continue
		}
		rr.Received++
		rr.Duplicates += n - 1
	}
	rr.OutOfOrder = outOfOrder
	progress("reshard: %d events written (%.0f/s), %d received, %d duplicates, %d out of order; max pause %.0f ms",
		rr.Written, rr.Achieved, rr.Received, rr.Duplicates, rr.OutOfOrder, rr.MaxPauseMs)
	switch {
	case badRecs > 0:
		return fmt.Errorf("%d records on the topic were not events of this run", badRecs)
	case rr.Received != rr.Written:
		return fmt.Errorf("the consumer received %d of the %d events written", rr.Received, rr.Written)
	}
	rr.Measured = true
	return g.stop()
}

// reshardOnce moves the layout from one shard count to another and waits until the new layout
// holds every bucket, then reads the pause from the layout row.
func (e *env) reshardOnce(ctx context.Context, db *sql.DB, from, to int32) (ReshardChange, error) {
	c := ReshardChange{From: from, To: to}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	l, err := outboxdb.Reshard(rctx, db, e.table, to, 20*time.Millisecond)
	if err != nil {
		return c, err
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if l, err = outboxdb.WaitForPause(wctx, outboxdb.RealClock{}, db, e.table, l.Generation, 20*time.Millisecond); err != nil {
		return c, fmt.Errorf("waiting for the layout of %d shards to hold every bucket: %w", to, err)
	}
	if l.ShardCount != to || l.Previous != from {
		return c, fmt.Errorf("layout after the change: %d shards, previous %d; want %d, previous %d", l.ShardCount, l.Previous, to, from)
	}
	pause, _ := l.Pause()
	c.PauseMs = ms(pause)
	c.TotalMs = ms(l.ResumedAt.Sub(l.RequestedAt))
	return c, nil
}

// waitFor polls cond every 20 ms until it holds, fails, or timeout passes (an error naming what,
// when what is not empty).
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			if what == "" {
				return nil
			}
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
