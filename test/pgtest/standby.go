package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions describe a physical standby made by NewStandby.
type StandbyOptions struct {
	// Name is the standby's application_name and the name of its replication slot on the
	// primary; a primary's synchronous_standby_names (SetSynchronous) names it.
	Name string
	// Port is the standby's port; 0 takes a free one. A primary rebuilt as a standby of its old
	// standby takes its old port, so that the clients' multi-host URL stays the same.
	Port int
}

// NewStandby makes a streaming physical standby of s: a base backup (pg_basebackup where s's
// binaries have it, else PostgreSQL's low-level backup API and a copy of the data directory),
// a replication slot on s so that s keeps the WAL the standby has not received, standby.signal
// and primary_conninfo. It returns once the standby accepts (read-only) connections and streams.
// The standby is asynchronous until s.SetSynchronous names it. Close it like any Server.
func (s *Server) NewStandby(ctx context.Context, o StandbyOptions) (*Server, error) {
	if o.Name == "" {
		return nil, fmt.Errorf("pgtest: a standby needs a name")
	}
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return nil, fmt.Errorf("pgtest: standby %s: connect to the primary: %w", o.Name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)
WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, o.Name); err != nil {
		return nil, fmt.Errorf("pgtest: standby %s: replication slot: %w", o.Name, err)
	}
	root, err := os.MkdirTemp("", "outbox-pgtest-standby-")
	if err != nil {
		return nil, err
	}
	sb := &Server{BinDir: s.BinDir, DataDir: filepath.Join(root, "data"), root: root, user: s.user, Port: o.Port}
	runAs, err := serverUser()
	if err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	fail := func(err error) (*Server, error) {
		os.RemoveAll(root)
		return nil, fmt.Errorf("pgtest: standby %s: %w", o.Name, err)
	}
	if _, statErr := os.Stat(filepath.Join(s.BinDir, "pg_basebackup")); statErr == nil {
		if runAs != nil {
			if err := os.Chown(root, int(runAs.Uid), int(runAs.Gid)); err != nil {
				return fail(err)
			}
		}
		cmd := exec.CommandContext(ctx, filepath.Join(s.BinDir, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port),
			"-U", s.user, "-D", sb.DataDir, "-X", "stream", "-S", o.Name, "-c", "fast", "--no-sync")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: runAs}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fail(fmt.Errorf("pg_basebackup: %w: %s", err, out))
		}
	} else if err := s.lowLevelBackup(ctx, conn, sb.DataDir, o.Name); err != nil {
		return fail(err)
	} else if runAs != nil {
		if err := chownTree(root, int(runAs.Uid), int(runAs.Gid)); err != nil {
			return fail(err)
		}
	}
	// The standby's own settings come last in postgresql.auto.conf, after those of the primary
	// it copied: it follows s, and once promoted it waits for no synchronous standby until it is
	// told to (SetSynchronous), as a failover manager leaves a new primary.
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=%s application_name=%s", s.Port, s.user, o.Name)
	extra := fmt.Sprintf("\nprimary_conninfo = %s\nprimary_slot_name = %s\nsynchronous_standby_names = ''\nhot_standby = on\n",
		confQuote(conninfo), confQuote(o.Name))
	if err := appendFile(filepath.Join(sb.DataDir, "postgresql.auto.conf"), extra); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(sb.DataDir, "standby.signal"), nil, 0o600); err != nil {
		return fail(err)
	}
	if runAs != nil {
		if err := chownTree(sb.DataDir, int(runAs.Uid), int(runAs.Gid)); err != nil {
			return fail(err)
		}
	}
	if sb.Port != 0 {
		err = sb.launch(runAs)
		if err == nil {
			sb.running = true
		}
	} else {
		err = sb.startOnFreePort(runAs)
	}
	if err != nil {
		return fail(err)
	}
	if err := s.WaitStreaming(ctx, o.Name); err != nil {
		sb.Close()
		return nil, err
	}
	sb.Version = s.Version
	return sb, nil
}

// lowLevelBackup copies s's data directory into dir between pg_backup_start and pg_backup_stop
// (pg_start_backup and pg_stop_backup before PostgreSQL 15), for binaries without pg_basebackup.
func (s *Server) lowLevelBackup(ctx context.Context, conn *pgx.Conn, dir, label string) error {
	var num int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&num); err != nil {
		return err
	}
	start, stop := `SELECT pg_backup_start($1, true)`, `SELECT labelfile FROM pg_backup_stop(true)`
	if num < 150000 {
		start, stop = `SELECT pg_start_backup($1, true, false)`, `SELECT labelfile FROM pg_stop_backup(false, true)`
	}
	if _, err := conn.Exec(ctx, start, label); err != nil {
		return fmt.Errorf("start the backup: %w", err)
	}
	copyErr := copyDataDir(s.DataDir, dir)
	var labelFile string
	if err := conn.QueryRow(ctx, stop).Scan(&labelFile); err != nil {
		return fmt.Errorf("stop the backup: %w", err)
	}
	if copyErr != nil {
		return fmt.Errorf("copy the data directory: %w", copyErr)
	}
	return os.WriteFile(filepath.Join(dir, "backup_label"), []byte(labelFile), 0o600)
}

// copyDataDir copies a running server's data directory as a base backup does: without the
// WAL (the standby streams it), the postmaster's files and the directories a server starts
// empty.
func copyDataDir(src, dst string) error {
	skipContents := map[string]bool{"pg_wal": true, "pg_replslot": true, "pg_stat_tmp": true, "pg_dynshmem": true,
		"pg_notify": true, "pg_serial": true, "pg_snapshots": true, "pg_subtrans": true}
	skipFiles := map[string]bool{"postmaster.pid": true, "postmaster.opts": true, "backup_label": true, "tablespace_map": true}
	return filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			if os.IsNotExist(err) { // a file removed during the copy (a dropped relation's)
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if info.IsDir() {
			if err := os.MkdirAll(target, 0o700); err != nil {
				return err
			}
			if skipContents[rel] {
				if rel == "pg_wal" {
					return os.MkdirAll(filepath.Join(target, "archive_status"), 0o700)
				}
				return filepath.SkipDir
			}
			return nil
		}
		if skipFiles[rel] || !info.Mode().IsRegular() {
			return nil
		}
		in, err := os.Open(path)
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

// WaitStreaming waits until the standby named name streams from s.
func (s *Server) WaitStreaming(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var state string
		conn, err := pgx.Connect(ctx, s.URL("postgres"))
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT coalesce(max(state), '') FROM pg_stat_replication WHERE application_name = $1`, name).Scan(&state)
			conn.Close(context.Background())
		}
		if err == nil && state == "streaming" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: standby %s does not stream from :%d (state %q): %w", name, s.Port, state, errors.Join(err, ctx.Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// SetSynchronous makes the commits on s wait for the standbys named (synchronous_standby_names
// FIRST 1 of them) to flush them, and the server's default synchronous_commit on: a COMMIT that
// returned is on a standby. No names makes replication asynchronous again.
func (s *Server) SetSynchronous(ctx context.Context, names ...string) error {
	list := ""
	if len(names) > 0 {
		list = "FIRST 1 (" + strings.Join(names, ", ") + ")"
	}
	return s.Configure(ctx, map[string]string{"synchronous_standby_names": list, "synchronous_commit": "on"})
}

// Configure sets server parameters with ALTER SYSTEM and reloads the configuration.
func (s *Server) Configure(ctx context.Context, settings map[string]string) error {
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for k, v := range settings {
		if _, err := conn.Exec(ctx, "ALTER SYSTEM SET "+pgx.Identifier{k}.Sanitize()+" = "+confQuote(v)); err != nil {
			return fmt.Errorf("pgtest: ALTER SYSTEM SET %s: %w", k, err)
		}
	}
	_, err = conn.Exec(ctx, `SELECT pg_reload_conf()`)
	return err
}

// Promote ends a standby's recovery (pg_promote) and waits until it accepts writes.
func (s *Server) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: promote: %w", err)
	}
	defer conn.Close(context.Background())
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok); err != nil {
		return fmt.Errorf("pgtest: promote :%d: %w", s.Port, err)
	}
	if !ok {
		return fmt.Errorf("pgtest: promote :%d: not promoted within 60 s", s.Port)
	}
	return nil
}

// Kill kills the server's processes at once (SIGKILL to its process group), as a machine that
// loses power would: nothing is flushed or shut down. The data stays, as at Stop. It returns
// once the server's port can be bound again: the postmaster has exited, but a child it had just
// forked (before the child closed its copy of the listening socket) may still be on its way out,
// and a server started on the port meanwhile fails with "Address already in use" (TestFailover
// restarting the old primary as a standby on its port, once in a CI run).
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running || s.cmd == nil {
		return nil
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
	s.cmd, s.running = nil, false
	return waitPortFree(s.Port, 30*time.Second)
}

// waitPortFree waits, at most timeout, until a listener can be bound on 127.0.0.1:port.
func waitPortFree(port int, timeout time.Duration) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(timeout); ; time.Sleep(5 * time.Millisecond) {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			return l.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: port %d still in use %s after the server was killed: %w", port, timeout, err)
		}
	}
}

// MultiHostURL is a libpq URL for database db listing every server, for clients that must
// follow the primary through a failover: target_session_attrs=read-write connects to the
// first server that accepts writes.
func MultiHostURL(db string, servers ...*Server) string {
	hosts := make([]string, len(servers))
	for i, s := range servers {
		hosts[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
	}
	u := url.URL{Scheme: "postgres", User: url.User(servers[0].user), Host: strings.Join(hosts, ","), Path: "/" + db,
		RawQuery: "sslmode=disable&target_session_attrs=read-write&connect_timeout=5"}
	return u.String()
}

func confQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func chownTree(root string, uid, gid int) error {
	return filepath.Walk(root, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

// StartWithStandby starts a primary of its own and a streaming standby of it named "pg_b", both
// closed when the test ends. Synchronous, the primary's commits wait for the standby's flush
// (SetSynchronous); else the primary's default synchronous_commit is on, for local flushes only.
func StartWithStandby(ctx context.Context, t testing.TB, synchronous bool) (primary, standby *Server) {
	t.Helper()
	primary, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(primary.Close)
	standby, err = primary.NewStandby(ctx, StandbyOptions{Name: "pg_b"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.Close)
	if synchronous {
		err = primary.SetSynchronous(ctx, "pg_b")
	} else {
		err = primary.Configure(ctx, map[string]string{"synchronous_commit": "on"})
	}
	if err != nil {
		t.Fatal(err)
	}
	return primary, standby
}
