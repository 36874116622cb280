package controllers

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/test/envtestutil"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
)

// TestSamples applies config/samples as a user would, with only the database URL edited (the
// placeholder the sample's comments name), and follows the relay to Ready.
func TestSamples(t *testing.T) {
	s := sharedSuite(t)
	root, err := envtestutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "config", "samples", "outbox_v1alpha1_outboxrelay.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(data), "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("%d documents in the sample, want the Secret and the OutboxRelay", len(docs))
	}
	var secret corev1.Secret
	var relay v1alpha1.OutboxRelay
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &secret); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict([]byte(docs[1]), &relay); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret.StringData["url"], "postgres://") {
		t.Fatalf("sample URL %q", secret.StringData["url"])
	}
	ns := s.env.CreateNamespace(t, "samples")
	secret.Namespace, relay.Namespace = ns, ns
	secret.StringData["url"] = pgtest.NewDatabase(t)
	if err := s.c.Create(testCtx(t), &secret); err != nil {
		t.Fatal(err)
	}
	s.createRelay(t, &relay)

	s.waitCondition(t, ns, relay.Name, v1alpha1.ConditionMigrationsApplied, metav1.ConditionTrue, v1alpha1.ReasonMigrationsApplied)
	for k := int32(0); k < relay.Spec.Shards; k++ {
		s.markAvailable(t, ns, DeploymentName(relay.Name, k))
	}
	s.waitCondition(t, ns, relay.Name, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReady)
}
