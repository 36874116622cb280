package v1alpha1_test

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/test/envtestutil"
)

// TestManagedEnvIsRefused: the API server refuses an OutboxRelay whose spec.relay.env sets any
// variable the operator manages (contract.ManagedEnv), one name at a time, so that no relay runs
// with a setting the operator believes is otherwise (OUTBOX_TRACKING=snapshot under a Row spec
// would have the operator measure lag, partitions and autoscaling as Row). Each setting left open
// to users (contract.Open) is accepted.
func TestManagedEnvIsRefused(t *testing.T) {
	env := envtestutil.Shared(t)
	ns := env.CreateNamespace(t, "managed-env")
	for i, name := range contract.ManagedEnv {
		t.Run(name, func(t *testing.T) {
			u := relayObject(ns, "env-"+itoa(i))
			set("spec.relay.env", []any{map[string]any{"name": name, "value": "x"}})(u)
			err := env.Client.Create(ctx(t), u)
			if err == nil {
				t.Fatalf("spec.relay.env with %s accepted", name)
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "relay.env must not set") {
				t.Fatalf("spec.relay.env with %s: %v, want a refusal naming relay.env", name, err)
			}
		})
	}
	for i, st := range contract.RunSettings {
		if st.Access != contract.Open {
			continue
		}
		t.Run(st.Env, func(t *testing.T) {
			u := relayObject(ns, "env-open-"+itoa(i))
			set("spec.relay.env", []any{map[string]any{"name": st.Env, "value": "x"}})(u)
			if err := env.Client.Create(ctx(t), u); err != nil {
				t.Fatalf("spec.relay.env with %s, open to users, refused: %v", st.Env, err)
			}
		})
	}
}
