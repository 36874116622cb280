package plugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/internal/redact"
)

// kube is the user's access to the cluster, from the kubeconfig and the standard flags.
type kube struct {
	cfg       *rest.Config
	namespace string
	// kubeconfigUser is the kubeconfig's user (AuthInfo) name of the context in use: who acts,
	// when the API server cannot say (SelfSubjectReview).
	kubeconfigUser string
	cs             kubernetes.Interface
	cl             client.Client
}

func (o *Options) kube() (*kube, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.Kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: o.Context}
	if o.Namespace != "" {
		overrides.Context.Namespace = o.Namespace
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, fmt.Errorf("reading the namespace from the kubeconfig: %w", err)
	}
	k := &kube{cfg: cfg, namespace: ns}
	if raw, err := cc.RawConfig(); err == nil {
		name := o.Context
		if name == "" {
			name = raw.CurrentContext
		}
		if c := raw.Contexts[name]; c != nil {
			k.kubeconfigUser = c.AuthInfo
		}
	}
	if k.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	// controller-runtime's client logs through its root logger, which would print a stack trace
	// to stderr after 30 seconds if nobody set it: the plugin logs nothing.
	ctrllog.SetLogger(logr.Discard())
	if k.cl, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	return k, nil
}

// relay returns the OutboxRelay name of the namespace in use.
func (k *kube) relay(ctx context.Context, name string) (*v1alpha1.OutboxRelay, error) {
	r := &v1alpha1.OutboxRelay{}
	err := k.cl.Get(ctx, client.ObjectKey{Namespace: k.namespace, Name: name}, r)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("OutboxRelay %s/%s not found (kubectl get outboxrelays -n %s lists them)", k.namespace, name, k.namespace)
	case apierrors.IsForbidden(err):
		return nil, fmt.Errorf("you may not get OutboxRelay %s/%s: ask for the verb \"get\" on outboxrelays.%s in namespace %s",
			k.namespace, name, v1alpha1.GroupVersion.Group, k.namespace)
	case err != nil:
		return nil, fmt.Errorf("getting OutboxRelay %s/%s: %w", k.namespace, name, err)
	}
	return r, nil
}

// databaseURL reads the database URL from the Secret the relay names, with the user's own
// RBAC, and returns it with a redactor of it. The URL is never printed.
func (k *kube) databaseURL(ctx context.Context, r *v1alpha1.OutboxRelay) (string, *redact.Redactor, error) {
	ref := r.Spec.Database.SecretRef
	key := ref.URLKey()
	s, err := k.cs.CoreV1().Secrets(r.Namespace).Get(ctx, string(ref.Name), metav1.GetOptions{})
	switch {
	case apierrors.IsForbidden(err):
		return "", nil, &forbiddenSecretError{namespace: r.Namespace, secret: string(ref.Name), relay: r.Name, user: k.whoamiOrEmpty(ctx)}
	case apierrors.IsNotFound(err):
		return "", nil, fmt.Errorf("the Secret %s/%s that OutboxRelay %s names in spec.database.secretRef does not exist", r.Namespace, ref.Name, r.Name)
	case err != nil:
		return "", nil, fmt.Errorf("getting Secret %s/%s: %w", r.Namespace, ref.Name, err)
	}
	v, ok := s.Data[key]
	if !ok || len(v) == 0 {
		return "", nil, fmt.Errorf("the Secret %s/%s has no key %q (spec.database.secretRef.key of OutboxRelay %s)", r.Namespace, ref.Name, key, r.Name)
	}
	url := string(v)
	return url, redact.New(redact.DatabaseSecrets(url)...), nil
}

// forbiddenSecretError says which Secret the user may not read and what to ask for.
type forbiddenSecretError struct {
	namespace, secret, relay, user string
}

func (e *forbiddenSecretError) Error() string {
	who := "you"
	if e.user != "" {
		who = "you (" + e.user + ")"
	}
	return fmt.Sprintf("%s may not get Secret %s/%s, which holds the database URL of OutboxRelay %s (spec.database.secretRef): "+
		"kubectl outbox reads it with your own permissions; ask for the verb \"get\" on secrets named %s in namespace %s",
		who, e.namespace, e.secret, e.relay, e.secret, e.namespace)
}

// whoami returns the user's name as the API server authenticated it (SelfSubjectReview,
// authentication.k8s.io/v1), else the kubeconfig's user name.
func (k *kube) whoami(ctx context.Context) (string, error) {
	rev, err := k.cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err == nil && rev.Status.UserInfo.Username != "" {
		return rev.Status.UserInfo.Username, nil
	}
	if k.kubeconfigUser != "" {
		return k.kubeconfigUser, nil
	}
	if err == nil {
		err = errors.New("the API server returned no user name")
	}
	return "", fmt.Errorf("cannot tell who you are (SelfSubjectReview: %w; and the kubeconfig context names no user): it is recorded with every change", err)
}

func (k *kube) whoamiOrEmpty(ctx context.Context) string {
	u, _ := k.whoami(ctx)
	return u
}
