package relay

import (
	"slices"
	"testing"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// TestSettingsAreTheContract: the settings table of `relay run` holds exactly the settings the
// contract names (contract.RunSettings), in the same order, each classified there as managed by
// the operator or open to spec.relay.env. A flag added here without a contract entry (and so
// without a decision on who sets it) fails, as does a contract entry the relay does not read.
func TestSettingsAreTheContract(t *testing.T) {
	var c Config
	var table []contract.Setting
	for _, s := range runSettings(&c) {
		table = append(table, s.Setting)
		if s.Access != contract.Managed && s.Access != contract.Open {
			t.Errorf("--%s (%s) is neither managed by the operator nor open to spec.relay.env", s.Flag, s.Env)
		}
	}
	if !slices.Equal(table, contract.RunSettings) {
		t.Errorf("relay run's settings\n  %v\ncontract.RunSettings\n  %v", table, contract.RunSettings)
	}
	// Every variable the relay reads is either managed or open, the secrets managed.
	for _, env := range RunEnv() {
		managed := contract.IsManagedEnv(env)
		open := slices.ContainsFunc(contract.RunSettings, func(s contract.Setting) bool { return s.Env == env && s.Access == contract.Open })
		if managed == open {
			t.Errorf("%s: managed %v, open %v; want exactly one", env, managed, open)
		}
	}
}
