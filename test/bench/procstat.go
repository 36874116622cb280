package main

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat and /proc/stat times; 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// procTimes returns a process's user+system CPU time and its parent pid from /proc/<pid>/stat.
func procTimes(pid int) (cpu time.Duration, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseStat(string(b))
}

// parseStat parses /proc/<pid>/stat; the command name (field 2) may hold spaces and parentheses,
// so fields are counted from the last ')'.
func parseStat(s string) (cpu time.Duration, ppid int, err error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed stat line")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("malformed stat line: %d fields", len(f))
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, err
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("malformed stat times")
	}
	return time.Duration(ut+st) * time.Second / clockTicks, ppid, nil
}

// peakRSS returns VmHWM, the peak resident set size of a running process, in bytes.
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseStatusKB(string(b), "VmHWM")
}

func parseStatusKB(status, key string) (int64, error) {
	for _, line := range strings.Split(status, "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || name != key {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("malformed %s line %q", key, line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		return kb * 1024, err
	}
	return 0, fmt.Errorf("no %s in status", key)
}

// machineBusy returns the CPU time all cores spent busy (not idle, not waiting for I/O) since
// boot, from the first line of /proc/stat.
func machineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("malformed /proc/stat")
	}
	var busy int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 8 { // guest times are already counted in user
			break
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, err
		}
		busy += n
	}
	return time.Duration(busy) * time.Second / clockTicks, nil
}

// cpuGroups names the process groups whose CPU a measurement attributes.
type cpuGroups struct {
	relay    func() []int // relay subprocesses
	pgMaster int          // postmaster; its children are PostgreSQL's backends and workers
	kafka    int          // broker JVM
	// pgRelay holds the pids of the relays' PostgreSQL backends, counted in postgres and, in
	// addition, in postgres-relay.
	pgRelay map[int]bool
}

// cpuSnapshot is the CPU time per pid of each group at one moment.
type cpuSnapshot struct {
	at      time.Time
	machine time.Duration
	groups  map[string]map[int]time.Duration
	// kafkaThreads is the broker JVM's CPU time per thread, by thread id.
	kafkaThreads map[int]threadTime
	kafkaPid     int
}

// threadTime is one thread's name (its comm, truncated by the kernel to 15 bytes) and CPU time.
type threadTime struct {
	name string
	cpu  time.Duration
}

// CPUUsage is the CPU time spent during a measurement, per group, in seconds.
type CPUUsage struct {
	Wall     float64 `json:"wall"`
	Relay    float64 `json:"relay"`
	Postgres float64 `json:"postgres"`
	// PostgresRelay is the part of Postgres spent by the relays' own backends, when known.
	PostgresRelay float64 `json:"postgresRelay,omitempty"`
	Kafka         float64 `json:"kafka"`
	Bench         float64 `json:"bench"`   // this program (baseline worker, writers, consumer)
	Machine       float64 `json:"machine"` // every process on the machine, including other users'
	// KafkaThreads splits Kafka by the broker's threads, grouped by name with the digits
	// dropped ("data-plane-kafka-request-handler-3" and "-5" are one kind; the kernel keeps the
	// first 15 bytes of a name): where the broker's time went.
	KafkaThreads map[string]float64 `json:"kafkaThreads,omitempty"`
}

// KafkaJIT is the part of Kafka spent by the JVM's JIT compiler threads (C1, C2): compiling the
// code paths a workload makes hot, which a long-running production broker has long finished. It
// varies with what ran on the broker before (from 1 to 190 µs per event in one run's windows of
// the same kind) and not with the work of the window, so the reports give it apart from the
// rest: what the broker spent serving the window's requests.
func (u CPUUsage) KafkaJIT() float64 {
	var s float64
	for kind, v := range u.KafkaThreads {
		if strings.Contains(kind, "CompilerThread") {
			s += v
		}
	}
	return s
}

// Other is the CPU time of processes outside the measurement (other engineers' work, and our
// PostgreSQL backends that exited during the window).
func (u CPUUsage) Other() float64 {
	return max(0, u.Machine-u.Relay-u.Postgres-u.Kafka-u.Bench)
}

func (g cpuGroups) snapshot() cpuSnapshot {
	s := cpuSnapshot{at: time.Now(), groups: map[string]map[int]time.Duration{}}
	s.machine, _ = machineBusy()
	add := func(group string, pid int) {
		if pid <= 0 {
			return
		}
		cpu, _, err := procTimes(pid)
		if err != nil {
			return
		}
		if s.groups[group] == nil {
			s.groups[group] = map[int]time.Duration{}
		}
		s.groups[group][pid] = cpu
	}
	if g.relay != nil {
		for _, pid := range g.relay() {
			add("relay", pid)
		}
	}
	add("kafka", g.kafka)
	if g.kafka > 0 {
		s.kafkaThreads, s.kafkaPid = threadTimes(g.kafka), g.kafka
	}
	add("bench", os.Getpid())
	if g.pgMaster > 0 {
		add("postgres", g.pgMaster)
		stats, _ := filepath.Glob("/proc/[0-9]*/stat")
		for _, p := range stats {
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			cpu, ppid, err := parseStat(string(b))
			if err != nil || ppid != g.pgMaster {
				continue
			}
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			if s.groups["postgres"] == nil {
				s.groups["postgres"] = map[int]time.Duration{}
			}
			s.groups["postgres"][pid] = cpu
			if g.pgRelay[pid] {
				if s.groups["postgres-relay"] == nil {
					s.groups["postgres-relay"] = map[int]time.Duration{}
				}
				s.groups["postgres-relay"][pid] = cpu
			}
		}
	}
	return s
}

// usageSince is the CPU used between two snapshots. A process that appeared in between counts
// in full; one that exited is lost (and shows up in Other).
func usageSince(a, b cpuSnapshot) CPUUsage {
	sum := func(group string) float64 {
		var d time.Duration
		for pid, cpu := range b.groups[group] {
			d += cpu - a.groups[group][pid]
		}
		return d.Seconds()
	}
	return CPUUsage{
		Wall:          b.at.Sub(a.at).Seconds(),
		Relay:         sum("relay"),
		Postgres:      sum("postgres"),
		PostgresRelay: sum("postgres-relay"),
		Kafka:         sum("kafka"),
		Bench:         sum("bench"),
		Machine:       (b.machine - a.machine).Seconds(),
		KafkaThreads: threadsSince(a.kafkaThreads, b.kafkaThreads, func(tid int, comm string) string {
			return jvmThreadName(b.kafkaPid, tid, comm)
		}),
	}
}

// threadTimes reads the CPU time of each thread of pid (none if pid is gone).
func threadTimes(pid int) map[int]threadTime {
	dirs, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/[0-9]*", pid))
	out := make(map[int]threadTime, len(dirs))
	for _, d := range dirs {
		stat, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil {
			continue
		}
		cpu, _, err := parseStat(string(stat))
		if err != nil {
			continue
		}
		tid, _ := strconv.Atoi(filepath.Base(d))
		out[tid] = threadTime{name: strings.TrimSpace(string(comm)), cpu: cpu}
	}
	return out
}

// threadsSince is the CPU time spent by each kind of thread between a and b, in seconds (a
// thread that appeared in between counts in full; one that exited is lost), the kinds that spent
// none left out; name gives a thread's full name from its id and its comm.
func threadsSince(a, b map[int]threadTime, name func(tid int, comm string) string) map[string]float64 {
	if len(b) == 0 {
		return nil
	}
	out := map[string]float64{}
	for tid, t := range b {
		d := t.cpu - a[tid].cpu
		if d <= 0 {
			continue
		}
		out[threadKind(name(tid, t.name))] += d.Seconds()
	}
	return out
}

// threadsSummary lists the kinds of thread that spent the most, in µs per event (of events),
// the rest summed as "other".
func threadsSummary(th map[string]float64, events float64) string {
	kinds := slices.Collect(maps.Keys(th))
	slices.SortFunc(kinds, func(a, b string) int { return cmp.Compare(th[b], th[a]) })
	var b strings.Builder
	var rest float64
	for i, k := range kinds {
		if i >= 8 {
			rest += th[k]
			continue
		}
		fmt.Fprintf(&b, "%s %.1f, ", k, th[k]*1e6/events)
	}
	fmt.Fprintf(&b, "other %.1f", rest*1e6/events)
	return b.String()
}

// threadKind is a thread's name without the number that ends it and the separators before
// that: "data-plane-kafk" for every request handler, "GC Thread" for every GC worker.
func threadKind(name string) string {
	if i := strings.Index(name, "-ListenerName("); i > 0 { // a network thread: its listener's name follows
		name = name[:i]
	}
	return strings.TrimRight(name, "0123456789-_ #")
}

// postmasterPid reads the server's pid from its data directory.
func postmasterPid(dataDir string) int {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}
