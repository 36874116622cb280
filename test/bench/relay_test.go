package main

import "testing"

// The bench reads each relay's HTTP address from its log (relays bind port 0): the line the
// relay writes in both log formats.
func TestServingRE(t *testing.T) {
	for _, line := range []string{
		`{"time":"2026-12-06T09:55:01Z","level":"INFO","msg":"serving /metrics, /healthz and /readyz","version":"dev","table":"public.outbox","shard":0,"layout":1,"addr":"127.0.0.1:43029"}`,
		`time=2026-12-06T09:55:01Z level=INFO msg="serving /metrics, /healthz and /readyz" version=dev addr=127.0.0.1:43029`,
	} {
		m := servingRE.FindSubmatch([]byte(`{"msg":"connecting","addr":"127.0.0.1:1"}` + "\n" + line + "\n"))
		if m == nil || string(m[1]) != "127.0.0.1:43029" {
			t.Errorf("address in %s: %q", line, m)
		}
	}
}
