package relay

import (
	"runtime"
	"testing"
)

// TestSizeProcs: the relay runs on MaxProcs CPUs unless GOMAXPROCS says otherwise.
func TestSizeProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	runtime.GOMAXPROCS(4)
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	if got := SizeProcs(getenv); got != MaxProcs {
		t.Errorf("GOMAXPROCS unset: %d procs, want %d", got, MaxProcs)
	}
	runtime.GOMAXPROCS(3) // as the runtime would from GOMAXPROCS=3
	env["GOMAXPROCS"] = "3"
	if got := SizeProcs(getenv); got != 3 {
		t.Errorf("GOMAXPROCS=3: %d procs, want 3 (the environment wins)", got)
	}
	env["GOMAXPROCS"] = "bogus" // the runtime ignores it; so does SizeProcs
	if got := SizeProcs(getenv); got != MaxProcs {
		t.Errorf("GOMAXPROCS=bogus: %d procs, want %d", got, MaxProcs)
	}
}
