// Package registrytest gives tests a real schema registry: Apicurio Registry 3.3.3 (in-memory
// storage, started by hack/registry.sh from the package Maven Central serves), reached through
// its Confluent-compatible API.
//
//	func TestMain(m *testing.M) { os.Exit(registrytest.Run(m)) } // optional: stops it promptly
//
//	func TestSomething(t *testing.T) {
//		url := registrytest.URL(t) // http://127.0.0.1:PORT/apis/ccompat/v7
//	}
//
// One registry runs per test binary, on free ports of 127.0.0.1, started on first use; it dies
// with the test binary (hack/registry.sh's watchdog) even without Run. Tests share it: they use
// subjects of their own. OUTBOX_TEST_REGISTRY_URL points the tests at a registry that is already
// running instead. Running it needs Java 21 or newer (see hack/registry.sh).
package registrytest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// EnvURL names the base URL of a running registry's Confluent-compatible API to use instead of
// starting one.
const EnvURL = "OUTBOX_TEST_REGISTRY_URL"

var (
	once      sync.Once
	sharedURL string
	sharedDir string // state of the registry this process started
	sharedErr error
)

// Run runs the package's tests and stops the registry they started, if any. Use it from TestMain.
func Run(m *testing.M) int {
	code := m.Run()
	if sharedDir != "" {
		_, _ = script("clean", sharedDir)
	}
	return code
}

// URL returns the base URL of the Confluent-compatible API of the test binary's registry
// (without a trailing slash), starting the registry on first use. It fails the test when the
// registry cannot start, with hack/registry.sh's output.
func URL(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		if u := os.Getenv(EnvURL); u != "" {
			sharedURL = strings.TrimSuffix(u, "/")
			return
		}
		sharedURL, sharedDir, sharedErr = start()
	})
	if sharedErr != nil {
		t.Fatalf("registrytest: cannot start the schema registry: %v", sharedErr)
	}
	return sharedURL
}

// start starts a registry on two free ports with its state in a new temporary directory.
func start() (url, dir string, err error) {
	port, err := pgtest.FreePort()
	if err != nil {
		return "", "", err
	}
	mport, err := pgtest.FreePort()
	if err != nil || mport == port {
		mport = port + 1
	}
	dir, err = os.MkdirTemp("", "outbox-registrytest-")
	if err != nil {
		return "", "", err
	}
	// The registry dies with this process (hack/registry.sh's watchdog), even when it is killed
	// before Run stops the registry.
	url, err = script("start", dir,
		"REGISTRY_PORT="+strconv.Itoa(port),
		"REGISTRY_MANAGEMENT_PORT="+strconv.Itoa(mport),
		"REGISTRY_OWNER_PID="+strconv.Itoa(os.Getpid()))
	if err != nil {
		_, _ = script("clean", dir)
		return "", "", err
	}
	return url, dir, nil
}

// script runs hack/registry.sh cmd dir with env (NAME=value) added to its environment and
// returns its standard output.
func script(cmd, dir string, env ...string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	// A cold cache fetches 159 MB first.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack", "registry.sh"), cmd, dir)
	c.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		return "", fmt.Errorf("hack/registry.sh %s %s: %w\n%s%s", cmd, dir, err, out, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// moduleRoot walks up from the working directory to the directory holding go.mod (as kafkatest
// does: envtestutil.ModuleRoot would bring in the Kubernetes packages).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("registrytest: no go.mod above the working directory, cannot find hack/registry.sh")
		}
		dir = parent
	}
}
