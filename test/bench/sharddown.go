package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// Keys of the shard-down scenario's drains.
const (
	keyShardsUp   = "relay-8-all-up"
	keyShardsDown = "relay-8-one-down"
)

// Shards in the shard-down scenario, and the one that is stopped.
const (
	downShards = 8
	downShard  = 0
)

// targetShardDownRatio: the other shards' drain rate with one shard down and its backlog
// pending, against the run where every shard is up (issue #12: within 10%).
const targetShardDownRatio = 0.9

// scenarioShardDown: a stopped shard must not slow the others. Eight shards of one table; the
// stopped shard's buckets hold cfg.stuck pending events older than the others' backlog (what a
// shard left down while the others keep up leaves behind), and the other seven shards drain a
// backlog of their own. The same backlog is drained with every shard up and the stopped shard's
// events already sent. The other shards' rate must be within 10% of the all-up run's.
func (e *env) scenarioShardDown(ctx context.Context, res *Results) {
	others := e.cfg.backlog * (downShards - 1) / downShards
	up := &DrainResult{Key: keyShardsUp, Name: fmt.Sprintf("%d shards, all up: the other %d drain %s", downShards, downShards-1, fmtInt(float64(others))),
		Method: fmt.Sprintf("%d relay processes (--shard-count %d) from their start to the commit of the last mark of the backlog of shards 1-%d; "+
			"shard %d's %s older events already marked sent; median of %d rounds, alternating with one down", downShards, downShards, downShards-1,
			downShard, count(e.cfg.stuck), e.cfg.downRounds)}
	down := &DrainResult{Key: keyShardsDown, Name: fmt.Sprintf("%d shards, one down with %s pending: the other %d drain %s", downShards, count(e.cfg.stuck), downShards-1, fmtInt(float64(others))),
		Method: fmt.Sprintf("as all up, but shard %d has no relay and its %s events, older than the others' backlog, stay pending", downShard, count(e.cfg.stuck))}
	res.Drains = append(res.Drains, up, down)
	fail := func(err error) {
		for _, d := range []*DrainResult{up, down} {
			if !d.Measured && d.Err == "" {
				d.fail(err)
			}
		}
	}

	const tmpl = "bench_sharddown_template"
	defer e.dropDatabase(context.Background(), tmpl)
	url, err := e.createDatabase(ctx, tmpl, 1)
	var r idRange
	if err == nil {
		progress("shard down: %d pending events in shard %d's buckets", e.cfg.stuck, downShard)
		_, err = fillShard(ctx, url, e.table, e.cfg.stuck, e.cfg.aggregates, true)
	}
	if err == nil {
		progress("shard down: %d pending events in the other shards' buckets", others)
		r, err = fillShard(ctx, url, e.table, others, e.cfg.aggregates, false)
	}
	if err != nil {
		fail(err)
		return
	}

	// The all-up runs start from a copy of the template with the stopped shard's events sent.
	const tmplUp = "bench_sharddown_template_up"
	defer e.dropDatabase(context.Background(), tmplUp)
	progress("shard down: marking shard %d's events sent for the all-up runs", downShard)
	urlUp, err := e.cloneDatabase(ctx, tmpl, tmplUp)
	if err == nil {
		err = markSentBefore(ctx, urlUp, e.table, r.lo)
	}
	for _, u := range []string{url, urlUp} {
		if err == nil {
			err = vacuumAnalyze(ctx, u, e.table)
		}
	}
	if err != nil {
		fail(err)
		return
	}
	// Rounds alternate, one down first, so that neither kind has the machine's quieter moments
	// or its warmer caches to itself; each kind's rate is the median of its rounds.
	rates := map[*DrainResult][]float64{}
	for round := range e.cfg.downRounds {
		for _, d := range []*DrainResult{down, up} {
			if ctx.Err() != nil {
				fail(ctx.Err())
				return
			}
			from := tmpl
			if d == up {
				from = tmplUp
			}
			db := "bench_" + sanitizeKey(d.Key)
			progress("%s: round %d/%d", d.Name, round+1, e.cfg.downRounds)
			url, err := e.cloneDatabase(ctx, from, db)
			var topic string
			if err == nil {
				topic, err = e.newTopic(ctx, d.Key)
			}
			if err != nil {
				d.fail(err)
				e.dropDatabase(context.Background(), db)
				return
			}
			one := &DrainResult{Key: d.Key, Name: d.Name}
			e.drainShards(ctx, one, url, topic, r, d == down)
			e.dropDatabase(context.Background(), db)
			e.deleteTopic(context.Background(), topic)
			if !one.Measured {
				d.Measured = false
				d.fail(errors.New(one.Err))
				return
			}
			rates[d] = append(rates[d], one.Rate)
			if m := median(rates[d]); m == one.Rate || d.CPU == nil {
				// The round whose rate is the median (the first, until there is one) gives the
				// CPU split and the memory.
				d.Events, d.Seconds, d.CPU, d.PeakRSS = one.Events, one.Seconds, one.CPU, one.PeakRSS
			}
			d.Rounds, d.Rate, d.Measured = rates[d], median(rates[d]), true
		}
	}
	if up.Measured && down.Measured {
		res.note("shard down: the other shards drained at %.2fx their rate with every shard up (medians of %d rounds: %s vs %s events/s; target >= %.1fx)",
			down.Rate/up.Rate, e.cfg.downRounds, fmtInt(down.Rate), fmtInt(up.Rate), targetShardDownRatio)
	}
}

// drainShards runs the relays of downShards shards, but for shard downShard when stopped, over
// the backlog in r, from their start to the commit of the last mark of r; with stopped, the
// stopped shard's events must still be pending after it.
func (e *env) drainShards(ctx context.Context, res *DrainResult, dbURL, topic string, r idRange, stopped bool) {
	skip := -1
	if stopped {
		skip = downShard
	}
	e.drainRelaysBut(ctx, res, dbURL, topic, r, downShards, false, skip)
	if !stopped || !res.Measured {
		return
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		res.fail(err)
		return
	}
	defer conn.Close(context.Background())
	var left int64
	if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE sent_at IS NULL AND id < $1`, e.table.Ident()), r.lo).Scan(&left); err != nil {
		res.fail(err)
		return
	}
	if left != e.cfg.stuck {
		res.Measured = false
		res.fail(fmt.Errorf("the stopped shard's events: %d pending after the drain, want %d", left, e.cfg.stuck))
	}
}

// fillShard inserts n pending events in chunks, each committed: with stopped, events of the
// aggregates in shard downShard's buckets only; without, of the other shards' only. It returns
// the range of their ids.
func fillShard(ctx context.Context, dbURL string, t outboxdb.Table, n int64, aggregates int, stopped bool) (idRange, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return idRange{}, err
	}
	defer conn.Close(ctx)
	// $4: the stopped shard's events or the others'; $5: how many.
	q := fmt.Sprintf(`%sINSERT INTO %s (%s) SELECT %s FROM %s
WHERE (%s %% %d = %d) = $4 LIMIT $5`,
		eventPool, t.Ident(), eventColumns, eventSelect, eventFrom, outboxdb.BucketOf(`'order-' || (g % $3)`), downShards, downShard)
	seq := t.Derived("id_seq")
	var r idRange
	if err := conn.QueryRow(ctx, `SELECT nextval($1::regclass)`, seq).Scan(&r.lo); err != nil {
		return r, err
	}
	const chunk = 250_000
	g := int64(0)
	start := time.Now()
	for done := int64(0); done < n; {
		m := min(chunk, n-done)
		// About 1/8 of the aggregates are in the stopped shard: enough g for m rows.
		span := m*downShards*2 + 1000
		if !stopped {
			span = m*2 + 1000
		}
		tag, err := conn.Exec(ctx, q, g, g+span-1, aggregates, stopped, m)
		if err != nil {
			return r, fmt.Errorf("insert: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return r, errors.New("insert: no aggregate falls in the wanted buckets")
		}
		g += span
		done += tag.RowsAffected()
		progress("shard down: %d/%d rows (%.0f rows/s)", done, n, float64(done)/time.Since(start).Seconds())
	}
	err = conn.QueryRow(ctx, `SELECT currval($1::regclass)`, seq).Scan(&r.hi)
	return r, err
}

// markSentBefore marks every row below id sent (the stopped shard's events, in the all-up run).
func markSentBefore(ctx context.Context, dbURL string, t outboxdb.Table, id int64) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, fmt.Sprintf(`UPDATE %s SET sent_at = now() WHERE id < $1 AND sent_at IS NULL`, t.Ident()), id)
	return err
}
