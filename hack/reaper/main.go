// Command reaper runs a command as a child subreaper (PR_SET_CHILD_SUBREAPER), so that every
// process orphaned below it (containerd's shims daemonize themselves) is reparented to it and
// reaped here, instead of by PID 1, which on the test VMs does not reliably reap them.
// hack/cluster.sh runs its supervisor under it.
//
//	reaper [-setsid] [-grace 15s] -- CMD [ARG...]
//
// SIGTERM, SIGINT and SIGHUP are forwarded to CMD. When CMD has exited, the remaining adopted
// processes get SIGTERM, and SIGKILL after the grace period; reaper exits with CMD's status once
// it has no child left.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const prSetChildSubreaper = 36

func main() {
	grace := flag.Duration("grace", 15*time.Second, "how long adopted processes may take to exit after CMD exited")
	setsid := flag.Bool("setsid", false, "start a new session first (detach from the caller's terminal and process group)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: reaper [-setsid] [-grace 15s] -- CMD [ARG...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if *setsid {
		_, _ = syscall.Setsid() // fails only if already a process group leader, which is detached enough
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		fatalf("prctl(PR_SET_CHILD_SUBREAPER): %v", errno)
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)

	proc, err := os.StartProcess(lookPath(flag.Arg(0)), flag.Args(), &os.ProcAttr{
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
	})
	if err != nil {
		fatalf("start %s: %v", flag.Arg(0), err)
	}
	mainPid := proc.Pid
	exitCode := -1
	var deadline time.Time // set once CMD has exited
	killed := false
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		// Reap everything that has exited: CMD itself and any adopted orphan.
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.ECHILD {
				if exitCode < 0 {
					exitCode = 1
				}
				os.Exit(exitCode)
			}
			if pid <= 0 || err != nil {
				break
			}
			if pid == mainPid {
				switch {
				case ws.Exited():
					exitCode = ws.ExitStatus()
				case ws.Signaled():
					exitCode = 128 + int(ws.Signal())
				default:
					exitCode = 1
				}
				deadline = time.Now().Add(*grace)
				signalChildren(syscall.SIGTERM)
			}
		}
		if exitCode >= 0 && !killed && time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "reaper: adopted processes still running %s after the command exited, killing them\n", *grace)
			signalChildren(syscall.SIGKILL)
			killed = true
		}
		select {
		case s := <-sigs:
			if s != syscall.SIGCHLD && exitCode < 0 {
				_ = proc.Signal(s)
			}
		case <-tick.C:
		}
	}
}

// signalChildren sends sig to every live child of this process other than the command.
func signalChildren(sig syscall.Signal) {
	self := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may contain spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == self {
			_ = syscall.Kill(pid, sig)
		}
	}
}

func lookPath(name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	for _, dir := range strings.Split(os.Getenv("PATH"), ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + name
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	fatalf("%s: not found in PATH", name)
	return ""
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "reaper: "+format+"\n", args...)
	os.Exit(1)
}
