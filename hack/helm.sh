#!/usr/bin/env bash
# Prints the path of a helm binary, building helm from the Go module proxy into the cache once.
set -euo pipefail
HELM_VERSION=${HELM_VERSION:-v3.22.0}
dir=${OUTBOX_CACHE:-$HOME/.cache/outbox-operator}/tools/helm-$HELM_VERSION
if [[ ! -x $dir/helm ]]; then
	echo "building helm $HELM_VERSION from the Go module proxy into $dir" >&2
	GOBIN=$dir CGO_ENABLED=0 GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
fi
echo "$dir/helm"
