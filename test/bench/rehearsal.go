package main

import (
	"context"
	"fmt"
	"time"
)

// rehearsalShare: each publisher of the side by side first drains a backlog of this fraction of
// the measured one, unmeasured.
//
// The broker's JVM compiles what each publisher's requests make hot, as they come: a broker
// warmed up by produces and transactions of every shape (warmBroker) still spent 40% of its CPU
// in its C2 compiler thread during the first exactly-once drain (perf, by thread; 280
// compilations in its 9 s), so that drain measured the compiler's warm-up as much as the
// publisher's cost. Each publisher therefore meets a broker that has already served a drain of
// its own, as a broker that has run for a while has. The rehearsal runs after the cold start,
// which it leaves as it was, on the same database and topic: the measured drain counts the
// records after it, and the final check covers both.
const rehearsalShare = 5

// rehearseDrain writes d.Rehearsal events while the publisher is stopped, starts it, waits
// until the topic holds them, and stops it.
func (e *env) rehearseDrain(ctx context.Context, url string, w *topicWatch, start func() (publisher, error), d *DebeziumResult, name string) error {
	if d.Rehearsal <= 0 {
		return nil
	}
	progress("%s: rehearsal (not measured): a backlog of %d events, drained", name, d.Rehearsal)
	base := w.count()
	if err := insertChunks(ctx, url, e, d.Rehearsal, d.Chunk); err != nil {
		return err
	}
	t0 := time.Now()
	pub, err := start()
	if err != nil {
		return err
	}
	if err := w.waitCount(ctx, base+int(d.Rehearsal), name+": rehearsal", pub.alive, time.Minute); err != nil {
		_ = pub.stop()
		return err
	}
	progress("%s: rehearsal drained in %.2fs", name, time.Since(t0).Seconds())
	if err := pub.stop(); err != nil {
		return fmt.Errorf("stopping after the rehearsal: %w", err)
	}
	return nil
}
