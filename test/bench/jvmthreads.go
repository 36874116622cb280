package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// jvmNames caches a JVM's thread names by native thread id, in full, as jcmd's Thread.print
// prints them: the kernel keeps the first 15 bytes of a thread's name, so that the broker's
// request handlers and its network threads are both "data-plane-kafk" in /proc.
var jvmNames struct {
	sync.Mutex
	pid   int
	names map[int]string
	tried time.Time
}

// jvmThreadName returns the full name of thread tid of JVM pid, or comm (the kernel's) where jcmd
// is not there or does not know it. A thread it has not seen makes it ask jcmd again, at most
// every 10 s; callers ask after a measurement's window, so that jcmd's cost (the JVM's attach
// listener and a safepoint) falls outside it.
func jvmThreadName(pid, tid int, comm string) string {
	jvmNames.Lock()
	defer jvmNames.Unlock()
	if jvmNames.pid != pid {
		jvmNames.pid, jvmNames.names, jvmNames.tried = pid, nil, time.Time{}
	}
	name, ok := jvmNames.names[tid]
	if !ok && time.Since(jvmNames.tried) > 10*time.Second {
		jvmNames.tried = time.Now()
		if names, err := jcmdThreads(pid); err == nil {
			jvmNames.names = names
			name, ok = names[tid]
		}
	}
	if !ok {
		return comm
	}
	return name
}

// jcmdThreads runs the jcmd beside the JVM's java (a JDK's; a JRE has none) for its threads.
func jcmdThreads(pid int) (map[int]string, error) {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return nil, err
	}
	jcmd := filepath.Join(filepath.Dir(exe), "jcmd")
	if _, err := os.Stat(jcmd); err != nil {
		return nil, err
	}
	out, err := exec.Command(jcmd, strconv.Itoa(pid), "Thread.print").Output()
	if err != nil {
		return nil, err
	}
	return parseThreadDump(string(out)), nil
}

// threadLine is a thread's line in a HotSpot thread dump: its name in quotes, its native id as
// nid, in hex (JDK 17) or decimal (JDK 19 on).
var threadLine = regexp.MustCompile(`(?m)^"(.*)"\s.*\bnid=(0x[0-9a-fA-F]+|[0-9]+)\b`)

func parseThreadDump(dump string) map[int]string {
	names := map[int]string{}
	for _, m := range threadLine.FindAllStringSubmatch(dump, -1) {
		if tid, err := strconv.ParseInt(m[2], 0, 64); err == nil {
			names[int(tid)] = m[1]
		}
	}
	return names
}
