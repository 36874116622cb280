package contract

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestRelayState(t *testing.T) {
	for _, state := range []string{"", RelayKafkaUnreachable, RelayKafkaRefused} {
		name := RelayStateName(state, "outbox-relay public.outbox shard 0/1")
		if got := RelayState(name); got != state {
			t.Errorf("RelayState(%q) = %q, want %q", name, got, state)
		}
	}
	// PostgreSQL truncates application_name to 63 bytes: the state comes first and survives.
	long := RelayStateName(RelayKafkaRefused, "outbox-relay a_very_long_schema_name.a_very_long_table_name_indeed shard 17/32")
	if got := RelayState(long[:63]); got != RelayKafkaRefused {
		t.Errorf("truncated: %q", got)
	}
	if got := RelayState("[kafka-refused"); got != "" {
		t.Errorf("malformed: %q", got)
	}
}

// TestManagedEnvMatchesTheCRD: the CEL rule on spec.relay.env (a kubebuilder marker, which cannot
// name a Go constant) refuses exactly the variables the operator manages, ManagedEnv as derived
// from the settings of `relay run` (RunSettings) and the secrets, and none of those open to users.
func TestManagedEnvMatchesTheCRD(t *testing.T) {
	src, err := os.ReadFile("../../api/v1alpha1/outboxrelay_types.go")
	if err != nil {
		t.Fatal(err)
	}
	// Every rule on spec.relay.env that refuses names (the database URL has one of its own, with
	// its own message).
	var inCRD []string
	for _, line := range strings.Split(string(src), "\n") {
		if !strings.Contains(line, "XValidation") || !strings.Contains(line, "relay.env must not set") {
			continue
		}
		rule := line[:strings.Index(line, "message=")]
		for _, f := range strings.Split(rule, "'")[1:] {
			if strings.HasPrefix(f, "OUTBOX_") {
				inCRD = append(inCRD, f)
			}
		}
	}
	slices.Sort(inCRD)
	want := slices.Sorted(slices.Values(ManagedEnv))
	if !slices.Equal(inCRD, want) {
		t.Errorf("the CRD's rule refuses\n  %v\nthe operator manages\n  %v", inCRD, want)
	}
	for _, st := range RunSettings {
		if st.Access == Open && slices.Contains(inCRD, st.Env) {
			t.Errorf("the CRD's rule refuses %s, which is open to spec.relay.env", st.Env)
		}
	}
}

// TestReservedHeadersMatchTheCRD: the CEL rule of HeaderName (spec.routing's headers) refuses
// exactly the headers the relay sets itself, ReservedHeaders.
func TestReservedHeadersMatchTheCRD(t *testing.T) {
	src, err := os.ReadFile("../../api/v1alpha1/outboxrelay_routing_types.go")
	if err != nil {
		t.Fatal(err)
	}
	var inCRD []string
	for _, line := range strings.Split(string(src), "\n") {
		if !strings.Contains(line, "XValidation") || !strings.Contains(line, "sets this header itself") {
			continue
		}
		rule := line[:strings.Index(line, "message=")]
		fields := strings.Split(rule, "'")
		for i := 1; i < len(fields); i += 2 {
			inCRD = append(inCRD, fields[i])
		}
	}
	slices.Sort(inCRD)
	if want := slices.Sorted(slices.Values(ReservedHeaders)); !slices.Equal(inCRD, want) {
		t.Errorf("the CRD's rule refuses\n  %v\nthe relay reserves\n  %v", inCRD, want)
	}
}
