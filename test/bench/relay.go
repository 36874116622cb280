package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// relayProc is one relay subprocess, run exactly as its Deployment would run it: the database
// URL in the environment, everything else as flags.
type relayProc struct {
	name    string
	cmd     *exec.Cmd
	addr    string // host:port of /metrics, /healthz, /readyz
	logPath string
	done    chan struct{}
	waitErr error
	termed  bool // SIGTERM sent (a second one might kill it outright)
}

// relayOptions are the flags a scenario sets; the zero value runs the relay's defaults.
type relayOptions struct {
	shardCount, shardIndex int
	batchSize              int  // 0: the relay's default
	follow                 bool // --shard-count=0: follow the table's shard layout (as the operator runs relays)
	// snapshot: --tracking snapshot; otherwise --tracking row. Always said: unset, relay run
	// resolves the mode from the table, which is snapshot for a table no row relay has marked
	// (every benchmark table), so the row figures measured snapshot tracking from 2026-12-04
	// 20:29 (414bdee) until this was set.
	snapshot bool
	// notify: --notify=true (the scenario creates the table's insert trigger, as the operator
	// does for spec.publish.notify: true); otherwise the relay polls, its default.
	notify bool
	// table: the outbox table to publish (the zero value: the scenarios' public.outbox).
	table outboxdb.Table
	// compression: --compression (empty: the relay's default, none).
	compression string
	// cursorTopic: --delivery exactly-once with this cursor topic (empty: at-least-once).
	cursorTopic string
	// extra are more flags, last.
	extra []string
}

// startRelay starts a relay for topic, publishing aggregate type "order".
func (e *env) startRelay(ctx context.Context, name, dbURL, topic string, o relayOptions) (*relayProc, error) {
	if e.relayBin == "" {
		return nil, fmt.Errorf("no relay binary: %w", e.relayErr)
	}
	switch {
	case o.follow:
		o.shardCount = 0
	case o.shardCount == 0:
		o.shardCount = 1
	}
	// Port 0: the relay binds a port the kernel gives it and logs it (servingAddr). A free port
	// chosen here could be taken by another process before the relay bound it (the idle
	// scenario's 100 relays lost one so).
	addr := "127.0.0.1:0"
	table := e.table
	if o.table.Name != "" {
		table = o.table
	}
	args := []string{"run",
		"--table", table.String(),
		"--shard-count", strconv.Itoa(o.shardCount),
		"--shard-index", strconv.Itoa(o.shardIndex),
		"--brokers", strings.Join(e.kafka.Brokers, ","),
		"--topic-map", "order=" + topic,
		"--http-addr", addr,
	}
	if o.batchSize > 0 {
		args = append(args, "--batch-size", strconv.Itoa(o.batchSize))
	}
	if o.notify {
		args = append(args, "--notify=true")
	}
	if o.snapshot {
		args = append(args, "--tracking", "snapshot")
	} else {
		args = append(args, "--tracking", "row")
	}
	if o.compression != "" {
		args = append(args, "--compression", o.compression)
	}
	if o.cursorTopic != "" {
		args = append(args, "--delivery", "exactly-once", "--cursor-topic", o.cursorTopic)
	}
	args = append(args, o.extra...)
	logPath := filepath.Join(e.tmp, fmt.Sprintf("%s.log", name))
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(e.relayBin, args...)
	cmd.Env = append(relayEnviron(), "OUTBOX_DATABASE_URL="+dbURL)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start relay %s: %w", name, err)
	}
	r := &relayProc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		r.waitErr = cmd.Wait()
		logf.Close()
		close(r.done)
	}()
	if r.addr, err = r.servingAddr(ctx, time.Minute); err != nil {
		_ = r.stop()
		return nil, err
	}
	return r, nil
}

// servingRE finds the address in the relay's log line "serving /metrics, /healthz and /readyz"
// (JSON or text logs).
var servingRE = regexp.MustCompile(`serving /metrics[^\n]*?addr"?[=:]"?(127\.0\.0\.1:[0-9]+)`)

// servingAddr waits for the relay to log the address its HTTP server listens on.
func (r *relayProc) servingAddr(ctx context.Context, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		if b, err := os.ReadFile(r.logPath); err == nil {
			if m := servingRE.FindSubmatch(b); m != nil {
				return string(m[1]), nil
			}
		}
		if r.exited() {
			return "", fmt.Errorf("relay %s exited before it served HTTP (%w):\n%s", r.name, r.waitErr, r.logTail(3000))
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("relay %s did not serve HTTP within %s:\n%s", r.name, timeout, r.logTail(3000))
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// relayEnviron is this process's environment without OUTBOX_* variables, so nothing set in the
// caller's shell changes what the relay is told.
func relayEnviron() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") {
			out = append(out, kv)
		}
	}
	return out
}

func (r *relayProc) pid() int { return r.cmd.Process.Pid }

func (r *relayProc) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// waitReady waits until /readyz answers 200: the relay holds its bucket locks and reached the
// database.
func (r *relayProc) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := http.Client{Timeout: time.Second}
	for {
		if r.exited() {
			return fmt.Errorf("relay %s exited before it was ready (%w):\n%s", r.name, r.waitErr, r.logTail(3000))
		}
		resp, err := client.Get("http://" + r.addr + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("relay %s not ready within %s:\n%s", r.name, timeout, r.logTail(3000))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// metric returns the sum of every sample of a metric family on /metrics (e.g. over topics),
// and whether the family was there.
func (r *relayProc) metric(name string) (float64, bool, error) {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + r.addr + "/metrics")
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return sumMetric(resp.Body, name)
}

// sumMetric sums the samples of one family in the Prometheus text format.
func sumMetric(rd io.Reader, name string) (float64, bool, error) {
	var sum float64
	found := false
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // another family with a longer name
		}
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, false, fmt.Errorf("metric %s: %w", name, err)
		}
		sum += v
		found = true
	}
	return sum, found, sc.Err()
}

// stop sends SIGTERM (the relay finishes its batch in flight and releases its locks) and waits;
// a relay that does not exit in time is killed and reported.
func (r *relayProc) stop() error {
	if r.exited() {
		return r.exitError()
	}
	r.term()
	select {
	case <-r.done:
		return r.exitError()
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
		return fmt.Errorf("relay %s did not exit within 30s of SIGTERM:\n%s", r.name, r.logTail(2000))
	}
}

func (r *relayProc) term() {
	if !r.termed {
		r.termed = true
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
	}
}

func (r *relayProc) exitError() error {
	if r.waitErr == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(r.waitErr, &ee) {
		return fmt.Errorf("relay %s exited with %w:\n%s", r.name, ee, r.logTail(2000))
	}
	return r.waitErr
}

func (r *relayProc) logTail(n int) string {
	b, err := os.ReadFile(r.logPath)
	if err != nil {
		return "(no log)"
	}
	return tail(string(b), n)
}

// relayGroup is the relays of one scenario.
type relayGroup []*relayProc

func (g relayGroup) pids() []int {
	var out []int
	for _, r := range g {
		if !r.exited() {
			out = append(out, r.pid())
		}
	}
	return out
}

// peakRSS is the largest VmHWM among the running relays.
func (g relayGroup) peakRSS() (int64, error) {
	var peak int64
	for _, r := range g {
		v, err := peakRSS(r.pid())
		if err != nil {
			return 0, fmt.Errorf("relay %s: %w", r.name, err)
		}
		peak = max(peak, v)
	}
	return peak, nil
}

func (g relayGroup) checkRunning() error {
	for _, r := range g {
		if r.exited() {
			return fmt.Errorf("relay %s exited (%w):\n%s", r.name, r.waitErr, r.logTail(2000))
		}
	}
	return nil
}

func (g relayGroup) stop() error {
	var errs []error
	for _, r := range g {
		if !r.exited() {
			r.term()
		}
	}
	for _, r := range g {
		errs = append(errs, r.stop())
	}
	return errors.Join(errs...)
}

// status reports what the relays say they published, for progress lines.
func (g relayGroup) status() string {
	var sum float64
	for _, r := range g {
		v, ok, err := r.metric("outbox_published_total")
		if err != nil || !ok {
			return ""
		}
		sum += v
	}
	return fmt.Sprintf(", %s published", fmtInt(sum))
}
