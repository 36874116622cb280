#!/usr/bin/env bash
# The end-to-end test on a real single-node cluster (make test-e2e):
#   1. hack/cluster.sh up (containerd, etcd, kube-apiserver, controller-manager, scheduler, kubelet, kube-proxy)
#   2. build the manager and relay binaries into one OCI image (hack/imgtool) and load it into containerd,
#      and bin/kubectl-outbox, the plugin the test runs as a user would
#   3. build the previous version's image too (the upgrade starts from it)
#   4. start PostgreSQL and Apache Kafka on the host, reachable from pods at the node IP, as a
#      managed database and broker would be
#   5. go test -tags e2e ./test/e2e (installs the previous Helm chart, upgrades it to this one
#      under load, and walks the user's path)
#   6. tear everything down, leaving the host as it was
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ $(id -u) == 0 ]] || { echo "e2e.sh: the local cluster needs root" >&2; exit 1; }

work=$(mktemp -d /tmp/outbox-e2e.XXXXXX)
chmod 755 "$work" # the PostgreSQL server runs as the postgres user
cleanup() {
	rc=$?
	set +e
	hack/kafka.sh clean "$work/kafka" >/dev/null 2>&1
	hack/postgres.sh clean "$work/pg" >/dev/null 2>&1
	hack/cluster.sh down
	git worktree remove --force "$work/previous" >/dev/null 2>&1
	rm -rf "$work"
	exit $rc
}
trap cleanup EXIT

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start=$(date +%s)
hack/cluster.sh up
eval "$(hack/cluster.sh env)"
echo "e2e: cluster up in $(($(date +%s) - start))s; node IP $OUTBOX_NODE_IP"

image=localhost/outbox-operator:e2e
hack/build-image.sh --load "$image"
# The kubectl plugin as users run it: the test calls the binary with the cluster's kubeconfig.
CGO_ENABLED=0 go build -trimpath -o bin/kubectl-outbox ./cmd/kubectl-outbox
export E2E_PLUGIN=$PWD/bin/kubectl-outbox

# The version users upgrade from: its chart and its image, built from its commit. No release is
# tagged yet, so it is the commit a release would have been (E2E_PREVIOUS overrides it); the test
# installs it first and upgrades to this checkout with helm upgrade.
previous=${E2E_PREVIOUS:-326711440c837a1ce20f93c9c4933e406dfc1e41}
git worktree add --detach --force "$work/previous" "$previous" >/dev/null
(cd "$work/previous" && hack/build-image.sh localhost/outbox-operator:previous >/dev/null)
hack/cluster.sh load-image "$work/previous/outbox-operator.tar"
export E2E_PREVIOUS_CHART=$work/previous/charts/outbox-operator E2E_PREVIOUS_IMAGE=localhost/outbox-operator:previous
echo "e2e: previous version $(git -C "$work/previous" describe --always) built for the upgrade"

pg_port=$(freeport)
PG_PORT=$pg_port PG_LISTEN="127.0.0.1,$OUTBOX_NODE_IP" hack/postgres.sh start "$work/pg" >/dev/null
export E2E_DATABASE_URL="postgres://outbox:outbox@$OUTBOX_NODE_IP:$pg_port/outbox?sslmode=disable"
kafka_port=$(freeport)
E2E_KAFKA_BROKERS=$(KAFKA_HOST=$OUTBOX_NODE_IP KAFKA_PORT=$kafka_port KAFKA_CONTROLLER_PORT=$(freeport) hack/kafka.sh start "$work/kafka")
export E2E_KAFKA_BROKERS E2E_IMAGE=$image
HELM=$(hack/helm.sh)
export HELM
echo "e2e: PostgreSQL at $OUTBOX_NODE_IP:$pg_port, Apache Kafka $(hack/kafka.sh version) at $E2E_KAFKA_BROKERS"

go test -tags e2e -count=1 -timeout 30m -v ./test/e2e/ 2>&1
