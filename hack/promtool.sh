#!/usr/bin/env bash
# Prints the path of a promtool binary (Prometheus's rule checker and unit tester), building it
# from the Go module proxy into the cache once. The chart's alerts are evaluated with it
# (test/chart, promtool test rules).
set -euo pipefail
PROMETHEUS_MODULE_VERSION=${PROMETHEUS_MODULE_VERSION:-v0.316.0}
dir=${OUTBOX_CACHE:-$HOME/.cache/outbox-operator}/tools/promtool-$PROMETHEUS_MODULE_VERSION
if [[ ! -x $dir/promtool ]]; then
	echo "building promtool (github.com/prometheus/prometheus $PROMETHEUS_MODULE_VERSION) from the Go module proxy into $dir" >&2
	GOBIN=$dir CGO_ENABLED=0 GOFLAGS=-mod=mod go install "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_MODULE_VERSION" >&2
fi
echo "$dir/promtool"
