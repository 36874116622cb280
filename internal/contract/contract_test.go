package contract

import "testing"

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
