package relay

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// testBuildVersion is the version the test binary is built with.
const testBuildVersion = "v0.0.0-proc-test"

// relayBinary builds cmd/relay once per test binary and returns its path.
func relayBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "outbox-relay-bin-")
		if buildErr != nil {
			return
		}
		start := time.Now()
		// Built as the image is: the version comes in through main.version.
		cmd := exec.Command("go", "build", "-ldflags", "-X main.version="+testBuildVersion, "-o", filepath.Join(binDir, "relay"),
			"github.com/outbox-operator/outbox-operator/cmd/relay")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/relay: %w\n%s", err, out)
			return
		}
		t.Logf("built cmd/relay in %s", time.Since(start).Round(time.Millisecond))
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "relay")
}

func removeBinary() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// runMain runs a subcommand of the relay binary (cmd/relay) to its end, with env as its whole
// environment, and returns its exit code and output.
func runMain(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.Command(relayBinary(t), args...)
	cmd.Env = []string{}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("relay %v: %v", args, err)
		}
		return exit.ExitCode(), out.String(), errOut.String()
	}
	return 0, out.String(), errOut.String()
}

// proc is the relay binary running as a subprocess.
type proc struct {
	t       testing.TB
	cmd     *exec.Cmd
	logPath string
	http    string // base URL of /metrics, /healthz, /readyz
	waited  chan struct{}
	state   *os.ProcessState
}

// startProc runs the relay binary with the database URL in its environment and args as flags.
func startProc(t testing.TB, url string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, url, nil, args...)
}

func itoa(i int) string { return strconv.Itoa(i) }

// startProcEnv is startProc with more environment variables.
//
// The HTTP port is one pgtest.FreePort found free a moment before; another process of the test
// run (a server another package starts) may take it in between, and the relay then exits at
// once with "address already in use" (seen in CI). That start is not the test's: it is made
// again on another port, a few times at most.
func startProcEnv(t testing.TB, url string, env map[string]string, args ...string) *proc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		p := launchProc(t, url, env, args...)
		if !p.lostPort() || attempt == 3 {
			t.Cleanup(func() {
				p.kill()
				if t.Failed() {
					t.Logf("relay %d log (tail):\n%s", p.cmd.Process.Pid, p.logTail(3000))
				}
			})
			return p
		}
		t.Logf("relay's --http-addr %s was taken before it started (%s); starting it again on another port", p.http, firstLine(p.log()))
	}
}

// launchProc starts the relay binary with its HTTP endpoints on a port found free.
func launchProc(t testing.TB, url string, env map[string]string, args ...string) *proc {
	t.Helper()
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.CreateTemp(t.TempDir(), "relay-*.log")
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(relayBinary(t), append([]string{"run", "--http-addr", addr, "--log-format", "text"}, args...)...)
	cmd.Env = append(os.Environ(), EnvDatabaseURL+"="+url)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, logPath: logf.Name(), http: "http://" + addr, waited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		p.state = cmd.ProcessState
		logf.Close()
		close(p.waited)
	}()
	return p
}

// lostPort reports whether the relay exited because its HTTP port was taken. It waits until the
// relay serves its endpoints, exits, or 30 s pass (a relay that neither serves nor exits is the
// test's to judge).
func (p *proc) lostPort() bool {
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.waited:
			return strings.Contains(p.log(), "address already in use")
		case <-deadline:
			return false
		case <-tick.C:
			if strings.Contains(p.log(), "serving /metrics") {
				return false
			}
		}
	}
}

func (p *proc) logTail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// kill sends SIGKILL and waits for the process to go.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.waited
}

// terminate sends SIGTERM and returns the exit code.
func (p *proc) terminate(timeout time.Duration) int {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.waited:
		return p.state.ExitCode()
	case <-time.After(timeout):
		p.t.Errorf("relay did not exit within %s of SIGTERM", timeout)
		p.kill()
		return -1
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.waited:
		return true
	default:
		return false
	}
}

// status returns the HTTP status of path, 0 when the server does not answer.
func (p *proc) status(path string) int {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(p.http + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// metric returns the value of the sample whose line starts with name (labels included), -1
// when absent.
func (p *proc) metric(name string) float64 {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(p.http + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// peakRSS returns the process's peak resident set size (VmHWM) in bytes.
func (p *proc) peakRSS() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	return -1
}

// cpuTime returns the CPU time (user and system) the process used so far.
func (p *proc) cpuTime() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	// Fields after the command name (which may hold spaces) start after the last ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return -1
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ is 100 on Linux
}

// The binary built as the image builds it (-X main.version) reports that version: `relay version`
// and the version its log lines carry.
func TestBuildVersion(t *testing.T) {
	bin := relayBinary(t)
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), testBuildVersion) {
		t.Fatalf("relay version: %q, %v; want %s", out, err, testBuildVersion)
	}
}
