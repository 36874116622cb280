#!/usr/bin/env bash
# Prints the path of a kubebuilder binary (the scaffolding CLI), building it from the Go module
# proxy into the cache once. The tests run it in a copy of the project to check that PROJECT
# matches the tree (test/project).
set -euo pipefail
KUBEBUILDER_VERSION=${KUBEBUILDER_VERSION:-v4.16.0}
dir=${OUTBOX_CACHE:-$HOME/.cache/outbox-operator}/tools/kubebuilder-$KUBEBUILDER_VERSION
if [[ ! -x $dir/kubebuilder ]]; then
	echo "building kubebuilder (sigs.k8s.io/kubebuilder/v4 $KUBEBUILDER_VERSION) from the Go module proxy into $dir" >&2
	GOBIN=$dir CGO_ENABLED=0 GOFLAGS=-mod=mod go install "sigs.k8s.io/kubebuilder/v4@$KUBEBUILDER_VERSION" >&2
fi
echo "$dir/kubebuilder"
