package pgtest_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

func TestServerIsRealPostgreSQL(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var version string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(version, "PostgreSQL ") {
		t.Fatalf("unexpected version string %q", version)
	}
	t.Logf("server: %s", version)
}

func TestDatabasesAreIsolated(t *testing.T) {
	ctx := context.Background()
	a, b := pgtest.NewDatabase(t), pgtest.NewDatabase(t)
	if a == b {
		t.Fatalf("two databases share the URL %s", a)
	}
	ca, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(ctx)
	if _, err := ca.Exec(ctx, "CREATE TABLE only_in_a (x int)"); err != nil {
		t.Fatal(err)
	}
	cb, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(ctx)
	var n int
	if err := cb.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("table created in database a is visible in database b")
	}
}

func TestRestartKeepsData(t *testing.T) {
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ctx := context.Background()
	url := srv.NewDatabase(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept AS SELECT 42 AS answer"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var answer int
	if err := conn.QueryRow(ctx, "SELECT answer FROM kept").Scan(&answer); err != nil || answer != 42 {
		t.Fatalf("after restart: answer=%d err=%v", answer, err)
	}
}

// A server must not outlive a test binary that is killed (a test timeout, SIGKILL).
func TestServerDiesWithKilledTestBinary(t *testing.T) {
	if os.Getenv("PGTEST_CHILD") == "1" {
		srv, err := pgtest.Start()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("port %d dir %s\n", srv.Port, filepath.Dir(srv.DataDir))
		time.Sleep(time.Minute) // killed by the parent long before
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerDiesWithKilledTestBinary$")
	cmd.Env = append(os.Environ(), "PGTEST_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		port int
		dir  string
	)
	if _, err := fmt.Fscanf(bufio.NewReader(out), "port %d dir %s\n", &port, &dir); err != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("child did not report its server: %v", err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if c, err := net.Dial("tcp", addr); err != nil {
		t.Fatalf("child's server is not listening: %v", err)
	} else {
		c.Close()
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			// Gone. The killed child could not remove its server's directory: do it here, once
			// the postmaster has exited (it removes postmaster.pid last).
			if strings.HasPrefix(filepath.Base(dir), "outbox-pgtest-") {
				for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
					if _, err := os.Stat(filepath.Join(dir, "data", "postmaster.pid")); os.IsNotExist(err) {
						break
					}
				}
				_ = os.RemoveAll(dir)
			}
			return
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("server on %s still listening 30s after its test binary was killed", addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
