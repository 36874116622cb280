// Package pgtest starts a throwaway PostgreSQL server for tests: initdb into a temporary
// directory, a free port on 127.0.0.1, one server per test binary, one fresh database per test.
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
//
//	func TestSomething(t *testing.T) {
//		url := pgtest.NewDatabase(t) // a new, empty database on the package's server
//	}
//
// The server runs as a child of the test binary and dies with it. The server binaries are found in
// $OUTBOX_PG_BINDIR; else, with OUTBOX_PG_VERSION=MAJOR (the version matrix, make test-pg), in the
// cache hack/pg-versions.sh fills ($OUTBOX_CACHE/pg-MAJOR.*/bin) or /usr/lib/postgresql/MAJOR/bin;
// else in `pg_config --bindir` or the newest /usr/lib/postgresql/*/bin. The first server a test
// binary starts writes its version to stderr. A helper that cannot start PostgreSQL fails the test
// with the reason.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a running PostgreSQL cluster owned by the test binary.
type Server struct {
	BinDir     string
	DataDir    string
	Port       int
	Version    string // server_version, e.g. "15.18 (Debian 15.18-0+deb12u1)"
	VersionNum int    // server_version_num, e.g. 150018

	root    string
	user    string
	mu      sync.Mutex
	running bool
	cmd     *exec.Cmd
	exited  chan struct{}
}

var (
	shared    *Server
	sharedErr error
	once      sync.Once
	dbCounter atomic.Int64
)

// Run runs the package's tests and stops the shared server afterwards. Use it from TestMain.
func Run(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		shared.Close()
	}
	return code
}

// startShared starts the package's server on first use and reports whether it runs.
func startShared() error {
	once.Do(func() { shared, sharedErr = Start() })
	return sharedErr
}

// Shared returns the package's server, starting it on first use.
func Shared(t testing.TB) *Server {
	t.Helper()
	if startShared() != nil {
		t.Fatalf("pgtest: cannot start PostgreSQL: %v", sharedErr)
	}
	return shared
}

// NewDatabase creates a fresh database on the shared server and returns its URL.
// The database is dropped when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return Shared(t).NewDatabase(t)
}

// NewDatabase creates a fresh database on s and returns its URL.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbCounter.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url, err := s.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.mu.Lock()
		running := s.running
		s.mu.Unlock()
		if !running {
			return
		}
		conn, err := pgx.Connect(ctx, s.URL("postgres"))
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return url
}

// CreateDatabase creates database name on s, kept until the server is closed, and returns its URL.
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return s.URL(name), nil
}

// URL returns a libpq URL for database db on s.
func (s *Server) URL(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(s.user),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Start initialises and starts a new server. Most tests use Shared or NewDatabase instead.
func Start() (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "outbox-pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{BinDir: bin, DataDir: filepath.Join(root, "data"), root: root, user: "postgres"}
	// initdb refuses to run as root; run the server as the "postgres" system user then.
	runAs, err := serverUser()
	if err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	if runAs != nil {
		if err := os.Chown(root, int(runAs.Uid), int(runAs.Gid)); err != nil {
			os.RemoveAll(root)
			return nil, err
		}
	}
	if err := s.initdb(runAs); err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	conf := strings.Join([]string{
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = ''",
		"fsync = off",
		"synchronous_commit = off",
		"full_page_writes = off",
		"max_connections = 200",
		"shared_buffers = 256MB",
		"max_wal_size = 4GB",
		"log_min_messages = warning",
		"max_locks_per_transaction = 256",
		"max_prepared_transactions = 64", // writers that use two-phase commit (PREPARE TRANSACTION)
	}, "\n") + "\n"
	f, err := os.OpenFile(filepath.Join(s.DataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		f.Close()
	}
	if err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	if err := s.startOnFreePort(runAs); err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		s.Close()
		return nil, err
	}
	defer conn.Close(ctx)
	var num string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('server_version_num')").
		Scan(&s.Version, &num); err != nil {
		s.Close()
		return nil, err
	}
	if s.VersionNum, err = strconv.Atoi(num); err != nil {
		s.Close()
		return nil, fmt.Errorf("server_version_num %q: %w", num, err)
	}
	if v := os.Getenv("OUTBOX_PG_VERSION"); v != "" && os.Getenv("OUTBOX_PG_BINDIR") == "" && strconv.Itoa(s.VersionNum/10000) != v {
		s.Close()
		return nil, fmt.Errorf("OUTBOX_PG_VERSION=%s but the server in %s is PostgreSQL %s", v, s.BinDir, s.Version)
	}
	logVersion.Do(func() {
		fmt.Fprintf(os.Stderr, "pgtest: PostgreSQL %s (server_version_num %d) from %s\n", s.Version, s.VersionNum, s.BinDir)
	})
	return s, nil
}

// logVersion makes the first server a test binary starts say which PostgreSQL the package runs on.
var logVersion sync.Once

// initdb creates the cluster in s.DataDir, in UTF-8 with the C.UTF-8 locale; a server whose
// initdb refuses that locale (a bundle without it) gets the C locale, still UTF-8, instead.
func (s *Server) initdb(runAs *syscall.Credential) error {
	var out []byte
	var err error
	for _, locale := range []string{"--locale=C.UTF-8", "--locale=C"} {
		os.RemoveAll(s.DataDir)
		cmd := exec.Command(filepath.Join(s.BinDir, "initdb"), "-D", s.DataDir, "-U", s.user,
			"--auth=trust", "--encoding=UTF8", locale, "--no-sync")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: runAs}
		if out, err = cmd.CombinedOutput(); err == nil {
			return nil
		}
		if !strings.Contains(strings.ToLower(string(out)), "locale") {
			break
		}
	}
	return fmt.Errorf("initdb (%s): %w: %s", s.BinDir, err, out)
}

func (s *Server) startOnFreePort(runAs *syscall.Credential) error {
	var lastErr error
	for range 5 {
		port, err := FreePort()
		if err != nil {
			return err
		}
		s.Port = port
		if lastErr = s.launch(runAs); lastErr == nil {
			s.mu.Lock()
			s.running = true
			s.mu.Unlock()
			return nil
		}
	}
	return lastErr
}

// launch starts the postmaster as a child of the test binary on s.Port and waits until it accepts
// connections. The child gets SIGQUIT (immediate shutdown) when the test binary dies, even by
// SIGKILL or a test timeout, so no server outlives its tests.
func (s *Server) launch(runAs *syscall.Credential) error {
	logPath := filepath.Join(s.root, "server.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(s.BinDir, "postgres"), "-D", s.DataDir, "-p", strconv.Itoa(s.Port))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: runAs, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, s.URL("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("postgres exited during start: %s", tail(string(log), 2000))
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("postgres did not accept connections within 60s: %w\nserver log:\n%s", err, tail(string(log), 2000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.cmd, s.exited = cmd, exited
	return nil
}

// shutdown signals the postmaster (SIGINT: fast, SIGQUIT: immediate) and waits for it to exit.
func (s *Server) shutdown(sig syscall.Signal) error {
	if s.cmd == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
	return nil
}

// Stop stops the server fast (connections are terminated), keeping its data.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return nil
	}
	if err := s.shutdown(syscall.SIGINT); err != nil {
		return err
	}
	s.running = false
	return nil
}

// Restart stops the server and starts it again on the same port.
func (s *Server) Restart() error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.StartAgain()
}

// StartAgain starts a stopped server on its old port.
func (s *Server) StartAgain() error {
	runAs, err := serverUser()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		return nil
	}
	if err := s.launch(runAs); err != nil {
		return err
	}
	s.running = true
	return nil
}

// Close stops the server and removes its files.
func (s *Server) Close() {
	s.mu.Lock()
	if s.running {
		_ = s.shutdown(syscall.SIGQUIT)
		s.running = false
	}
	s.mu.Unlock()
	os.RemoveAll(s.root)
}

// BinDir finds the PostgreSQL server binaries: $OUTBOX_PG_BINDIR, then the major
// $OUTBOX_PG_VERSION names (VersionBinDir), then the machine's own server.
func BinDir() (string, error) {
	if d := os.Getenv("OUTBOX_PG_BINDIR"); d != "" {
		return checkBinDir(d)
	}
	if v := os.Getenv("OUTBOX_PG_VERSION"); v != "" {
		return VersionBinDir(v)
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d, err := checkBinDir(strings.TrimSpace(string(out))); err == nil {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return majorOf(dirs[i]) > majorOf(dirs[j]) })
	for _, d := range dirs {
		if d, err := checkBinDir(d); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, pg_ctl, postgres) found in $OUTBOX_PG_BINDIR, " +
		"pg_config --bindir or /usr/lib/postgresql/*/bin; run `make setup` (apt-get install postgresql)")
}

// CacheDir is where make setup keeps what it builds or fetches: $OUTBOX_CACHE, by default
// ~/.cache/outbox-operator.
func CacheDir() string {
	if d := os.Getenv("OUTBOX_CACHE"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "outbox-operator")
}

// VersionBinDir returns the bin directory of a PostgreSQL server of major version major (e.g.
// "13"): the newest $OUTBOX_CACHE/pg-MAJOR.*/bin that hack/pg-versions.sh unpacked, else the
// machine's /usr/lib/postgresql/MAJOR/bin.
func VersionBinDir(major string) (string, error) {
	if n, err := strconv.Atoi(major); err != nil || n <= 0 {
		return "", fmt.Errorf("OUTBOX_PG_VERSION=%q: want a PostgreSQL major version such as 13", major)
	}
	cache := CacheDir()
	dirs, _ := filepath.Glob(filepath.Join(cache, "pg-"+major+".*", "bin"))
	sort.Slice(dirs, func(i, j int) bool { return versionLess(dirs[j], dirs[i]) })
	for _, d := range append(dirs, filepath.Join("/usr/lib/postgresql", major, "bin")) {
		if d, err := checkBinDir(d); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("OUTBOX_PG_VERSION=%s: no PostgreSQL %s server (initdb, pg_ctl, postgres) in %s "+
		"or /usr/lib/postgresql/%s/bin; run `make setup` (hack/pg-versions.sh fetch %s)",
		major, major, filepath.Join(cache, "pg-"+major+".*", "bin"), major, major)
}

// versionLess orders .../pg-MAJOR.MINOR.PATCH/bin directories by version.
func versionLess(a, b string) bool {
	va := strings.Split(strings.TrimPrefix(filepath.Base(filepath.Dir(a)), "pg-"), ".")
	vb := strings.Split(strings.TrimPrefix(filepath.Base(filepath.Dir(b)), "pg-"), ".")
	for i := 0; i < len(va) && i < len(vb); i++ {
		x, _ := strconv.Atoi(va[i])
		y, _ := strconv.Atoi(vb[i])
		if x != y {
			return x < y
		}
	}
	return len(va) < len(vb)
}

func checkBinDir(d string) (string, error) {
	for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(d, b)); err != nil {
			return "", err
		}
	}
	return d, nil
}

func majorOf(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// serverUser returns the credential to run the server with: nil when not root,
// the "postgres" user when root (initdb and postgres refuse to run as root).
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs a 'postgres' system user to run the server: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range) where it can: a server stopped and started again
// on it (a broker's outage, a PostgreSQL restart) must not find it taken meanwhile by the local
// port of an outgoing connection, which a port the kernel hands out for ":0" may become
// (TestKafkaOutage once failed so: the broker could not start again, "Address already in use").
// The kernel never picks a port below that range for an outgoing connection.
func FreePort() (int, error) {
	low := 32768 // Linux's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	if lo := max(low-12000, 10000); lo < low {
		for range 50 {
			p := lo + rand.IntN(low-lo)
			if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
				l.Close()
				return p, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
