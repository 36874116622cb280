package relay

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// Handler serves /metrics, /healthz (200 while the relay runs its loop) and /readyz (200 while
// it holds all its bucket locks and its last database round trip succeeded), at the paths the
// operator's probes use (contract.PathMetrics, PathHealthz, PathReadyz).
func (r *Relay) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(contract.PathMetrics, promhttp.HandlerFor(r.metrics.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc(contract.PathHealthz, func(w http.ResponseWriter, _ *http.Request) {
		if !r.running.Load() {
			http.Error(w, "relay loop not running", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc(contract.PathReadyz, func(w http.ResponseWriter, _ *http.Request) {
		if !r.Ready() {
			http.Error(w, "not ready: "+r.notReadyReason(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// serveHTTP listens on addr and serves Handler until ctx ends.
func (r *Relay) serveHTTP(ctx context.Context, addr string) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: r.Handler(), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Error("http server stopped", "err", err)
		}
	}()
	r.log.Info("serving /metrics, /healthz and /readyz", "addr", ln.Addr().String())
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, nil
}
