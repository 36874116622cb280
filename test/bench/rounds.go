package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// The interleaved rounds of the side by side. One window per publisher, each publisher's windows
// run in series one after the other, cannot tell a tenth apart from the machine: the same relay
// code with the same record batches cost the broker from 105 to 160 µs per event between
// windows of one run (2026-12-05), and the goals of issue 28 are ratios of a tenth. So after
// every publisher's own run, each publisher (Debezium; each at-least-once relay, polling and
// notified; the exactly-once relay, polling) gets -peer-rounds more windows at each -round-rates rate, in rounds that
// interleave them (a round runs them in one order, the next in the reverse order), on its own
// database and topic as before; the goals at a rate are judged on the median over all of a
// publisher's windows at that rate, paired by round with Debezium's (report_steady.go).

// roundWindow is one publisher's place in a round: a rig, woken by notifications or not.
type roundWindow struct {
	rig    *peerRig
	notify bool
}

func (w roundWindow) name() string {
	switch {
	case w.rig.p.Key == peerDebezium:
		return w.rig.p.Name
	case w.notify:
		return w.rig.p.Name + ", notified"
	}
	return w.rig.p.Name + ", polling"
}

// roundWindows are the windows of one round, in the order of round i.
func roundWindows(rigs []*peerRig, i int) []roundWindow {
	var out []roundWindow
	for _, r := range rigs {
		switch r.p.Key {
		case peerDebezium:
			out = append(out, roundWindow{rig: r})
		case peerRelayRow, peerRelaySnap:
			out = append(out, roundWindow{rig: r}, roundWindow{rig: r, notify: true})
		case peerRelayEOS: // polling: it wakes up as snapshot tracking does
			out = append(out, roundWindow{rig: r})
		}
	}
	if i%2 == 1 {
		slices.Reverse(out)
	}
	return out
}

// runPeerRounds runs the interleaved rounds over the publishers whose own runs succeeded.
//
// Debezium runs through all the rounds: restarted for each window, its Connect JVM would compile
// its hot paths again in it and its task may replace its first walsender (runPeer's refresh),
// costs that its own run, which follows a drain, does not have. So it starts once, reads the WAL
// written while it was stopped, publishes a probe and then an unrecorded window at the first
// rate, and stays up; its walsender keeps decoding what the relays' windows
// write (filtered out: another database), which competes with the relays for the machine's
// cores and is counted in no window.
func (e *env) runPeerRounds(ctx context.Context, srv *pgtest.Server, d *DebeziumResult, rigs []*peerRig) {
	if e.cfg.peerRounds == 0 || len(e.cfg.roundRates) == 0 || len(roundWindows(rigs, 0)) < 2 {
		return
	}
	d.Rounds, d.RoundRates = e.cfg.peerRounds, e.cfg.roundRates
	var debezium publisher
	for _, r := range rigs {
		if r.p.Key != peerDebezium {
			continue
		}
		pub, err := e.startWarm(ctx, srv, r, e.cfg.roundRates[0])
		if err != nil {
			// No rounds: nothing to pair the relays' windows with. Its own run stands.
			progress("rounds: not run: %s did not start again: %v", r.p.Name, err)
			d.Rounds, d.RoundRates = 0, nil
			return
		}
		debezium = pub
		defer func() { _ = pub.stop() }()
	}
	for i := range e.cfg.peerRounds {
		for _, rate := range e.cfg.roundRates {
			for _, w := range roundWindows(rigs, i) {
				if ctx.Err() != nil {
					return
				}
				progress("round %d of %d at %s events/s: %s", i+1, e.cfg.peerRounds, fmtInt(rate), w.name())
				lr := &LatencyResult{Rate: rate, Writers: 8, Snapshot: w.rig.p.snapshot(), Notify: w.notify}
				if w.rig.p.Key != peerDebezium {
					lr.PollMs = ms(contract.PollInterval)
					if w.notify {
						lr.PollMs = ms(contract.NotifyPollInterval)
					}
				}
				if w.notify {
					w.rig.p.RoundsNotify = append(w.rig.p.RoundsNotify, lr)
				} else {
					w.rig.p.Rounds = append(w.rig.p.Rounds, lr)
				}
				var err error
				if w.rig.p.Key == peerDebezium {
					err = e.measureRunning(ctx, srv, w.rig, debezium, lr)
				} else {
					err = e.roundWindow(ctx, srv, w, lr)
				}
				if err != nil {
					lr.Err = err.Error()
					progress("round %d, %s at %s/s: FAILED: %v", i+1, w.name(), fmtInt(rate), err)
				}
			}
		}
	}
}

// roundWindow starts w's relay, measures one latency window at lr.Rate and stops it.
func (e *env) roundWindow(ctx context.Context, srv *pgtest.Server, w roundWindow, lr *LatencyResult) error {
	rig := w.rig
	// The insert trigger is the table's part of the notified mode (the operator's
	// spec.publish.notify): created for the notified windows, dropped for the polling ones.
	if err := e.setNotify(ctx, rig.url, w.notify); err != nil {
		return err
	}
	opts := rig.opts
	opts.notify = w.notify
	label := rig.p.Key + "-round"
	if w.notify {
		label = rig.p.Key + "-notify-round"
	}
	pub, err := e.startPeerRelay(ctx, rig, label, opts)
	if err != nil {
		return err
	}
	defer func() { _ = pub.stop() }()
	if err := e.measureRunning(ctx, srv, rig, pub, lr); err != nil {
		return err
	}
	return pub.stop()
}

// measureRunning measures one latency window at lr.Rate of the running publisher pub.
func (e *env) measureRunning(ctx context.Context, srv *pgtest.Server, rig *peerRig, pub publisher, lr *LatencyResult) error {
	cg := cpuGroups{pgMaster: postmasterPid(srv.DataDir), kafka: e.kafkaPid, relay: pub.pids}
	var err error
	if cg.pgRelay, err = rig.backends(); err != nil {
		return err
	}
	return e.peerLatency(ctx, srv, lr, rig.p.Key, rig.url, rig.topic, cg, pub)
}

// startWarm starts Debezium for the rounds and returns it warm: caught up with the WAL, a probe
// published, and an unrecorded window at rate run.
func (e *env) startWarm(ctx context.Context, srv *pgtest.Server, rig *peerRig, rate float64) (publisher, error) {
	pub, err := e.startCaughtUp(ctx, srv, rig)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = pub.stop()
		}
	}()
	base, err := e.topicEnd(ctx, rig.topic)
	if err != nil {
		return nil, err
	}
	if err := e.insertProbe(ctx, rig.url); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(time.Minute); ; {
		n, err := e.topicEnd(ctx, rig.topic)
		if err != nil {
			return nil, err
		}
		if n > base {
			break
		}
		if err := pub.alive(); err != nil {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s published no probe a minute after its restart", rig.p.Name)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	progress("%s: streaming again; an unrecorded window at %s events/s to warm it up", rig.p.Name, fmtInt(rate))
	if err := e.measureRunning(ctx, srv, rig, pub, &LatencyResult{Rate: rate, Writers: 8}); err != nil {
		return nil, err
	}
	ok = true
	return pub, nil
}

// startCaughtUp starts Debezium and returns once its walsender has read the WAL written while it
// was stopped (the other publishers' windows, in other databases): decoding it is a catch-up
// that its steady state does not have, and must not fall into its window.
func (e *env) startCaughtUp(ctx context.Context, srv *pgtest.Server, rig *peerRig) (publisher, error) {
	conn, err := pgx.Connect(ctx, srv.URL("postgres"))
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	var target string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&target); err != nil {
		return nil, err
	}
	pub, err := rig.start()
	if err != nil {
		return nil, err
	}
	t0, lastReport := time.Now(), time.Now()
	// A walsender only reads flushed WAL; the flush position may lie inside a record whose end
	// is flushed later, so a long wait is reported and then measured through rather than failed.
	const patience = 3 * time.Minute
	for {
		var caught bool
		var sent *string
		err := conn.QueryRow(ctx, `SELECT r.sent_lsn::text, coalesce(r.sent_lsn >= $2::pg_lsn, false)
			FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`,
			debeziumSlot, target).Scan(&sent, &caught)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			_ = pub.stop()
			return nil, err
		}
		if caught {
			progress("%s: its walsender read the WAL written while it was stopped (to %s) in %s", rig.p.Name, target, time.Since(t0).Round(time.Millisecond))
			return pub, nil
		}
		if err := pub.alive(); err != nil {
			return nil, err
		}
		if time.Since(t0) > patience {
			progress("%s: its walsender has not reached %s after %s (at %v): measuring anyway", rig.p.Name, target, patience, deref(sent))
			return pub, nil
		}
		if time.Since(lastReport) >= 10*time.Second {
			lastReport = time.Now()
			progress("%s: catching up: its walsender at %v of %s", rig.p.Name, deref(sent), target)
		}
		select {
		case <-ctx.Done():
			_ = pub.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "(no walsender yet)"
	}
	return *s
}

// topicEnd is the sum of topic's end offsets: the records appended to it so far.
func (e *env) topicEnd(ctx context.Context, topic string) (int64, error) {
	ends, err := e.topicEnds(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, o := range ends {
		n += o
	}
	return n, nil
}
