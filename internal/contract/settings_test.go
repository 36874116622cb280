package contract

import (
	"slices"
	"testing"
)

// TestEverySettingIsClassified: each setting of `relay run` is managed by the operator or open to
// spec.relay.env, and no flag or variable is named twice.
func TestEverySettingIsClassified(t *testing.T) {
	flags, envs := map[string]bool{}, map[string]bool{}
	for _, s := range RunSettings {
		if s.Access != Managed && s.Access != Open {
			t.Errorf("--%s (%s): neither Managed nor Open", s.Flag, s.Env)
		}
		if flags[s.Flag] || envs[s.Env] {
			t.Errorf("--%s (%s) named twice", s.Flag, s.Env)
		}
		flags[s.Flag], envs[s.Env] = true, true
	}
	for _, e := range SecretEnv {
		if envs[e] || !IsManagedEnv(e) {
			t.Errorf("secret %s: a flag's twin, or not managed", e)
		}
	}
	// The settings the operator leaves to spec.relay.env: adding one is a decision, made here.
	var open []string
	for _, s := range RunSettings {
		if s.Access == Open {
			open = append(open, s.Env)
		}
	}
	if want := []string{"OUTBOX_LOCK_LEASE", "OUTBOX_QUERY_TIMEOUT", "OUTBOX_LOG_FORMAT"}; !slices.Equal(open, want) {
		t.Errorf("open to spec.relay.env: %v, want %v", open, want)
	}
}
