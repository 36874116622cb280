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

// Command manager runs the outbox-operator: the OutboxRelay controller, with leader election,
// health probes and Prometheus metrics.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	outboxv1alpha1 "github.com/outbox-operator/outbox-operator/api/v1alpha1"
	"github.com/outbox-operator/outbox-operator/controllers"
	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

// leaderElectionID names the Lease the replicas compete for.
const leaderElectionID = "outbox-operator.outbox.dev"

// options are the command line.
type options struct {
	metricsAddr             string
	probeAddr               string
	leaderElect             bool
	leaderElectionNamespace string
	relayImage              string
	relayOTLPEndpoint       string
	lagPollInterval         time.Duration
	autoscaleInterval       time.Duration
	logLevel                string
	logFormat               string
	// watchNamespaces limits the operator to these namespaces (nil: every namespace).
	watchNamespaces []string
}

func parseFlags(args []string, getenv func(string) string, out io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.SetOutput(out)
	ctrlconfig.RegisterFlags(fs) // --kubeconfig
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus /metrics endpoint; 0 turns it off")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz probes")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader so that only one replica reconciles (needs --leader-election-namespace outside a cluster)")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's namespace)")
	fs.StringVar(&o.relayImage, "relay-image", getenv("OUTBOX_RELAY_IMAGE"),
		"image of the relay pods when an OutboxRelay names none; it must hold /relay (default $OUTBOX_RELAY_IMAGE)")
	fs.StringVar(&o.relayOTLPEndpoint, "relay-otlp-endpoint", "", "OTLP/gRPC endpoint (http:// or https:// URL) the relays of an OutboxRelay without spec.publish.tracing export their spans to (empty: they do not)")
	fs.DurationVar(&o.lagPollInterval, "lag-poll-interval", controllers.DefaultLagPollInterval, "how often the pending count and lag of each outbox table are read")
	fs.DurationVar(&o.autoscaleInterval, "autoscale-interval", controllers.DefaultAutoscaleInterval, "how often OutboxRelays with spec.autoscaling are measured and scaled")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info or error")
	fs.StringVar(&o.logLevel, "zap-log-level", "info", "alias of --log-level")
	fs.StringVar(&o.logFormat, "log-format", "json", "json or text")
	fs.Func("watch-namespaces", "comma-separated namespaces whose OutboxRelays the operator reconciles, the only ones whose Secrets and Deployments it reads (default: every namespace)", func(v string) error {
		for _, ns := range strings.Split(v, ",") {
			if ns = strings.TrimSpace(ns); ns != "" {
				if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
					return fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
				}
				o.watchNamespaces = append(o.watchNamespaces, ns)
			}
		}
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.relayImage == "" {
		return o, errors.New("--relay-image (or OUTBOX_RELAY_IMAGE) is required")
	}
	if o.relayOTLPEndpoint != "" && !contract.ValidOTLPEndpoint(o.relayOTLPEndpoint) {
		return o, fmt.Errorf("--relay-otlp-endpoint %q: want an http:// or https:// URL", o.relayOTLPEndpoint)
	}
	if o.lagPollInterval < time.Second {
		return o, fmt.Errorf("--lag-poll-interval %s is below 1s", o.lagPollInterval)
	}
	if o.autoscaleInterval < time.Second {
		return o, fmt.Errorf("--autoscale-interval %s is below 1s", o.autoscaleInterval)
	}
	if _, err := parseLevel(o.logLevel); err != nil {
		return o, err
	}
	if o.logFormat != "json" && o.logFormat != "text" {
		return o, fmt.Errorf("--log-format %q: want json or text", o.logFormat)
	}
	return o, nil
}

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("log level %q: want debug, info or error", s)
}

func newLogger(o options, w io.Writer) logr.Logger {
	level, _ := parseLevel(o.logLevel)
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewJSONHandler(w, opts)
	if o.logFormat == "text" {
		h = slog.NewTextHandler(w, opts)
	}
	return logr.FromSlogHandler(h)
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(outboxv1alpha1.AddToScheme(s))
	return s
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(2)
	}
	log := newLogger(o, os.Stderr)
	ctrl.SetLogger(log)
	klog.SetLogger(log)
	if err := run(ctrl.SetupSignalHandler(), o); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	log := ctrl.Log.WithName("setup")
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	var cacheOpts cache.Options
	if len(o.watchNamespaces) > 0 {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range o.watchNamespaces {
			cacheOpts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Cache: cacheOpts,
		// One manager per process in production; the tests start several in one process, and
		// controller names are otherwise checked to be unique per process.
		Controller:                    config.Controller{SkipNameValidation: ptr.To(true)},
		Scheme:                        newScheme(),
		Metrics:                       metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:        o.probeAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              leaderElectionID,
		LeaderElectionNamespace:       o.leaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	r := &controllers.OutboxRelayReconciler{
		RelayImage:        o.relayImage,
		RelayOTLPEndpoint: o.relayOTLPEndpoint,
		LagPollInterval:   o.lagPollInterval,
		AutoscaleInterval: o.autoscaleInterval,
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("set up the OutboxRelay controller: %w", err)
	}
	collector := controllers.NewRelayCollector(mgr.GetClient())
	if err := metrics.Registry.Register(collector); err != nil {
		return fmt.Errorf("register the OutboxRelay metrics: %w", err)
	}
	defer metrics.Registry.Unregister(collector)

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("informers", func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("informer caches not synced")
		}
		return nil
	}); err != nil {
		return err
	}
	log.Info("starting manager", "version", version, "relayImage", o.relayImage, "watchNamespaces", o.watchNamespaces,
		"leaderElection", o.leaderElect, "lagPollInterval", o.lagPollInterval.String())
	return mgr.Start(ctx)
}
