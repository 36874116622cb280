/*
Copyright 2026 The outbox-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// Package controllers holds the OutboxRelay reconciler. Reconcile runs named steps in order:
// loadDatabase, claimTable, ensureMigrations, resolveTracking, ensureWakeups, ensureInserts, ensureChecks, ensureIndexes, ensurePartitions, observeLag, observeLayout, desiredShards, ensureBucketIndex
// (the autoscaler), ensureDeployments, ensurePDB and ensureLayout (resharding), one file each, then writes status once
// (outboxrelay_status.go).
package controllers

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"golang.org/x/time/rate"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// Result is the result of a reconcile step.
type Result = ctrl.Result

// Field indexes on OutboxRelay.
const (
	// secretRefIndex holds every Secret name a relay refers to (database, TLS, SASL).
	secretRefIndex = "spec.secretRefs"
	// configMapRefIndex holds the ConfigMap a relay refers to (its schema registry's schemas).
	configMapRefIndex = "spec.configMapRefs"
	// tableIDIndex holds status.tableID, the identity of the database table a relay claimed.
	tableIDIndex = "status.tableID"
)

// Timeouts of the database work of one pass.
const (
	dbTimeout      = 10 * time.Second
	migrateTimeout = 60 * time.Second
)

// staleStatusRetry is how soon a pass whose status write was refused as stale runs again.
const staleStatusRetry = 100 * time.Millisecond

// Defaults of the reconciler's intervals.
const (
	DefaultLagPollInterval   = 30 * time.Second
	DefaultLagStatusInterval = time.Minute
	DefaultWaitInterval      = time.Minute
)

// errWait stops a pass without an error: a condition says what is missing, and a watch (Secret,
// Deployment) or the slow WaitInterval brings the next pass. It is not a success either, so
// observedGeneration does not move.
var errWait = errors.New("waiting for a change")

// OutboxRelayReconciler turns an OutboxRelay into migrations, partitions, relay Deployments and status.
type OutboxRelayReconciler struct {
	client.Client
	// APIReader reads Secrets directly; the cache holds only their metadata.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Clock     clock.Clock
	// OpenDB opens the database behind a URL (OpenDB by default; tests point it anywhere).
	OpenDB func(ctx context.Context, url string) (*sql.DB, error)
	// RelayImage is the relay image when spec.relay.image is empty.
	RelayImage string
	// RelayOTLPEndpoint is where relays export their spans when spec.publish.tracing is unset
	// (empty: they do not).
	RelayOTLPEndpoint string
	// LagPollInterval is how often lag is measured.
	LagPollInterval time.Duration
	// LagStatusInterval is the least time between two writes of pendingEvents and lagSeconds,
	// unless LagWithinTarget flips.
	LagStatusInterval time.Duration
	// WaitInterval is how soon a pass that waits for a change looks again anyway.
	WaitInterval time.Duration
	// RetryMaxDelay caps the backoff of a failed pass (default MaxRetryDelay).
	RetryMaxDelay time.Duration
	// AutoscaleInterval is how often an OutboxRelay with spec.autoscaling is measured and scaled.
	AutoscaleInterval time.Duration

	// relays is what the reconciler remembers of each OutboxRelay from pass to pass.
	relays relayStates
	// switches waits for switches of layout in the background (nil outside a manager: the
	// passes that follow retry the switch then).
	switches *switchWaiter
}

// scope is what the steps of one pass share.
type scope struct {
	relay        *v1alpha1.OutboxRelay
	before       *v1alpha1.OutboxRelay
	table        outboxdb.Table
	dbURL        string                    // secret: never logged, never in a message
	db           *sql.DB                   // the OutboxRelay's pooled handle (dbPools): not closed by a pass
	secretValues map[string][]byte         // "secret/key" -> value, for the pod template hash
	secrets      map[string]*corev1.Secret // the Secrets this pass read, by name: each is read once
	lagKnown     bool                      // observeLag measured lagSeconds in this pass
	lagSeconds   int64
	// scalableLag is the lag more shards can fix (outboxdb.ScalableLagSQL), measured while
	// anything is pending (0 otherwise); scalableKnown says it was.
	scalableKnown bool
	scalableLag   int64
	layout        *outboxdb.Layout // the table's shard layout, nil before the first
	// bucketIndexReady: ensureBucketIndex found the bucket index valid, which a change to a
	// layout of several shards waits for.
	bucketIndexReady bool
	// newTable: ensureMigrations made the table in this pass (it was at schema version 0).
	newTable bool
}

type step func(context.Context, *scope) (Result, error)

// +kubebuilder:rbac:groups=outbox.dev,resources=outboxrelays,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=outbox.dev,resources=outboxrelays/finalizers,verbs=update
// +kubebuilder:rbac:groups=outbox.dev,resources=outboxrelays/status,verbs=patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;patch
// (server-side apply of a new object needs create as well as patch)
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile runs the steps in order, stops at the first that fails or waits, and writes status once.
func (r *OutboxRelayReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	relay := &v1alpha1.OutboxRelay{}
	if err := r.Get(ctx, req.NamespacedName, relay); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone: forget what was remembered of it. Any other error keeps it for the retry.
			r.relays.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !relay.DeletionTimestamp.IsZero() {
		return r.drain(ctx, relay) // spec.deletion (outboxrelay_deletion.go)
	}
	if err := r.ensureFinalizer(ctx, relay); err != nil {
		return ctrl.Result{}, err
	}
	s := &scope{relay: relay, before: relay.DeepCopy(), secretValues: map[string][]byte{}}

	res, err := r.runSteps(ctx, s, r.ensureTopics, r.loadDatabase, r.claimTable, r.ensureMigrations, r.resolveTracking, r.ensureWakeups, r.ensureInserts, r.ensureChecks, r.ensureIndexes, r.ensurePartitions, r.observeLag,
		r.observeLayout, r.desiredShards, r.ensureBucketIndex, r.ensureDeployments, r.ensurePDB, r.ensureLayout)
	waiting := errors.Is(err, errWait)
	if waiting {
		res, err = ctrl.Result{RequeueAfter: r.WaitInterval}, nil
	}
	if perr := r.patchStatus(ctx, s, err == nil && !waiting); errors.Is(perr, errStaleStatus) {
		if err == nil {
			res = ctrl.Result{RequeueAfter: staleStatusRetry}
		}
	} else if perr != nil {
		err = errors.Join(err, perr)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	return res, nil
}

// runSteps runs the steps in order and stops at the first error (migrations must finish before
// the Deployments exist). It keeps the lowest non-zero RequeueAfter.
func (r *OutboxRelayReconciler) runSteps(ctx context.Context, s *scope, steps ...step) (Result, error) {
	var res Result
	for _, st := range steps {
		sr, err := st(ctx, s)
		if err != nil {
			return Result{}, err
		}
		if sr.RequeueAfter > 0 && (res.RequeueAfter == 0 || sr.RequeueAfter < res.RequeueAfter) {
			res.RequeueAfter = sr.RequeueAfter
		}
	}
	return res, nil
}

// SetupWithManager fills in defaults, registers the field indexes and the watches.
func (r *OutboxRelayReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder(fieldOwnerName)
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.OpenDB == nil {
		r.OpenDB = OpenDB
	}
	if r.LagPollInterval <= 0 {
		r.LagPollInterval = DefaultLagPollInterval
	}
	if r.LagStatusInterval <= 0 {
		r.LagStatusInterval = DefaultLagStatusInterval
	}
	if r.WaitInterval <= 0 {
		r.WaitInterval = DefaultWaitInterval
	}
	if r.RetryMaxDelay <= 0 {
		r.RetryMaxDelay = MaxRetryDelay
	}
	if r.AutoscaleInterval <= 0 {
		r.AutoscaleInterval = DefaultAutoscaleInterval
	}

	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &v1alpha1.OutboxRelay{}, secretRefIndex, func(o client.Object) []string {
		return secretRefsOf(o.(*v1alpha1.OutboxRelay))
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &v1alpha1.OutboxRelay{}, configMapRefIndex, func(o client.Object) []string {
		if sr := o.(*v1alpha1.OutboxRelay).Spec.Publish.SchemaRegistry; sr != nil && sr.SchemasConfigMapRef != nil {
			return []string{string(sr.SchemasConfigMapRef.Name)}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &v1alpha1.OutboxRelay{}, tableIDIndex, func(o client.Object) []string {
		if id := o.(*v1alpha1.OutboxRelay).Status.TableID; id != "" {
			return []string{id}
		}
		return nil
	}); err != nil {
		return err
	}
	r.switches = newSwitchWaiter(ctx, r.Clock)
	// The pooled database handles close when the manager stops.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		r.relays.closeAll()
		return nil
	})); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		// A spec change, or a delete (which sets deletionTimestamp: the drain of spec.deletion).
		For(&v1alpha1.OutboxRelay{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{},
			predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				return e.ObjectOld.GetDeletionTimestamp() == nil && e.ObjectNew.GetDeletionTimestamp() != nil
			}}))).
		Owns(&appsv1.Deployment{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		// Metadata only: the cache never holds Secret data; the steps read values through APIReader.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.relaysForSecret), builder.OnlyMetadata).
		// The schemas' ConfigMaps likewise: a change rolls the relays that read them.
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.relaysForConfigMap), builder.OnlyMetadata).
		// A switch of layout waited for in the background brings the pass that reports it.
		WatchesRawSource(source.Channel(r.switches.events, &handler.TypedEnqueueRequestForObject[*v1alpha1.OutboxRelay]{})).
		// Passes of different relays run in parallel (a slow database holds up only its own relay);
		// one relay is never reconciled twice at once.
		// A failed pass (the database is down) is retried with backoff up to RetryMaxDelay, not
		// controller-runtime's default of 16 minutes: status recovers within that once it is back.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4, RateLimiter: retryLimiter(r.RetryMaxDelay)}).
		Named("outboxrelay").
		Complete(r)
}

// MaxRetryDelay is the longest wait before a failed pass of an OutboxRelay runs again, by default.
const MaxRetryDelay = 30 * time.Second

// retryLimiter is controller-runtime's default rate limiter (per-item exponential backoff from
// 5 ms, and an overall token bucket) with the backoff capped at max.
func retryLimiter(max time.Duration) workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, max),
		&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}

// relaysForSecret maps a Secret to the OutboxRelays of its namespace that refer to it.
func (r *OutboxRelayReconciler) relaysForSecret(ctx context.Context, o client.Object) []reconcile.Request {
	return r.relaysReferring(ctx, o, secretRefIndex)
}

// relaysForConfigMap maps a ConfigMap to the OutboxRelays that refer to it.
func (r *OutboxRelayReconciler) relaysForConfigMap(ctx context.Context, o client.Object) []reconcile.Request {
	return r.relaysReferring(ctx, o, configMapRefIndex)
}

// relaysReferring maps o to the OutboxRelays of its namespace whose index holds its name.
func (r *OutboxRelayReconciler) relaysReferring(ctx context.Context, o client.Object, index string) []reconcile.Request {
	var list v1alpha1.OutboxRelayList
	if err := r.List(ctx, &list, client.InNamespace(o.GetNamespace()),
		client.MatchingFields{index: o.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "cannot map an object to OutboxRelays", "index", index, "name", o.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, len(list.Items))
	for i, item := range list.Items {
		reqs[i] = reconcile.Request{NamespacedName: types.NamespacedName{Namespace: item.Namespace, Name: item.Name}}
	}
	return reqs
}
