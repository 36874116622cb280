#!/usr/bin/env bash
# Builds the manager, relay and kubectl-outbox binaries into one OCI image (as the Dockerfile does) without a Docker engine or registry
# (hack/imgtool) and, with --load, imports it into the local cluster's containerd.
#   hack/build-image.sh [--load] IMAGE   (e.g. localhost/outbox-operator:dev)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
load=0
if [[ ${1:-} == --load ]]; then load=1; shift; fi
image=${1:?usage: $0 [--load] IMAGE}
work=$(mktemp -d /tmp/outbox-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
version=$(git describe --always --dirty 2>/dev/null || echo dev)
for b in manager relay kubectl-outbox; do
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$work/$b" "./cmd/$b"
done
go run ./hack/imgtool -o "$work/image.tar" -t "$image" -entrypoint /manager -user 65532 \
	"$work/manager:/manager" "$work/relay:/relay" "$work/kubectl-outbox:/kubectl-outbox"
if ((load)); then
	hack/cluster.sh load-image "$work/image.tar"
else
	cp "$work/image.tar" "./$(basename "${image%%:*}").tar"
	echo "wrote ./$(basename "${image%%:*}").tar"
fi
