#!/usr/bin/env bash
# Builds the kubectl plugin (kubectl-outbox) for each platform of PLUGIN_PLATFORMS and writes
#   dist/kubectl-outbox_<version>_<os>_<arch>.tar.gz   (the binary, README.md)
#   dist/kubectl-outbox_<version>_checksums.txt         (sha256sum format)
# Install: tar -xzf the archive into a directory on PATH; kubectl finds `kubectl outbox` by name.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
platforms=${PLUGIN_PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}
go=${GO:-go}
mkdir -p dist
work=$(mktemp -d /tmp/outbox-plugin.XXXXXX)
trap 'rm -rf "$work"' EXIT
archives=()
for p in $platforms; do
	os=${p%/*} arch=${p#*/}
	name=kubectl-outbox_${version}_${os}_${arch}
	mkdir -p "$work/$name"
	CGO_ENABLED=0 GOOS=$os GOARCH=$arch "$go" build -trimpath -ldflags "-s -w -X main.version=$version" \
		-o "$work/$name/kubectl-outbox" ./cmd/kubectl-outbox
	cp README.md "$work/$name/"
	# Reproducible archives: fixed owner, order and times.
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2000-01-01 00:00Z' \
		-C "$work/$name" -czf "dist/$name.tar.gz" kubectl-outbox README.md
	archives+=("$name.tar.gz")
	echo "dist/$name.tar.gz"
done
(cd dist && sha256sum "${archives[@]}" > "kubectl-outbox_${version}_checksums.txt")
echo "dist/kubectl-outbox_${version}_checksums.txt"
