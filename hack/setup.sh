#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks for building and testing outbox-operator, and builds
# or fetches the test components into the cache (~/.cache/outbox-operator), so later runs are fast:
#   - Debian packages: PostgreSQL server, kcat, Maven and a JRE (Apache Kafka), openssl, curl,
#     and the SQL append's writers in other languages: Python, Node.js, a JDK, PHP with PDO pgsql
#   - their clients: psycopg (PyPI), pg (npm), the PostgreSQL JDBC driver (hack/writers.sh fetch)
#     (and, with SETUP_E2E=1 (the default), containerd, runc, CNI plugins, iptables for the e2e cluster)
#   - Apache Kafka 4.4.0 jars from Maven Central (hack/kafka.sh fetch)
#   - Apicurio Registry 3.3.3, the tests' schema registry, from Maven Central (hack/registry.sh
#     fetch; running it needs Java 21 or newer, which Debian 12 does not package: see the script)
#   - PostgreSQL server binaries of the version matrix (13-18, make test-pg) from Maven Central
#     (hack/pg-versions.sh fetch)
#   - Kafka Connect 4.3.1 and Debezium 3.6.1 jars from Maven Central (hack/debezium.sh fetch: the
#     benchmark's side by side with Debezium, which fetches them itself when missing; not in CI)
#   - envtest control plane binaries built from the Go module proxy (hack/envtest-assets.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cache=${OUTBOX_CACHE:-$HOME/.cache/outbox-operator}
mkdir -p "$cache"

need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
have_cmd kcat || need+=(kcat)
have_cmd mvn || need+=(maven)
have_cmd java || need+=(openjdk-17-jre-headless)
have_cmd openssl || need+=(openssl)
have_cmd curl || need+=(curl)
[[ -x /usr/sbin/pgbouncer ]] || have_cmd pgbouncer || need+=(pgbouncer) # the writers-through-PgBouncer tests
have_cmd unzip || need+=(unzip) # hack/pg-versions.sh
have_cmd xz || need+=(xz-utils)
have_cmd gcc || need+=(gcc libc6-dev) # the race detector (make test) needs cgo
# The SQL append's writers in other languages (test/writers; their clients: hack/writers.sh).
have_cmd python3 || need+=(python3 python3-pip)
have_cmd node || need+=(nodejs)
have_cmd npm || need+=(npm)
have_cmd javac || need+=(openjdk-17-jdk-headless) # java runs Append.java as a source file
have_cmd php || need+=(php-cli)
{ have_cmd php && php -m 2>/dev/null | grep -qx pdo_pgsql; } || need+=(php-pgsql)
if [[ ${SETUP_E2E:-1} == 1 ]]; then
	have_cmd containerd || need+=(containerd)
	have_cmd runc || need+=(runc)
	[[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
	have_cmd iptables || need+=(iptables)
	have_cmd conntrack || need+=(conntrack)
	have_cmd socat || need+=(socat)
	have_cmd ethtool || need+=(ethtool)
fi
if ((${#need[@]})); then
	echo "setup: installing Debian packages: ${need[*]}"
	if [[ $(id -u) != 0 ]]; then sudo=sudo; else sudo=; fi
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	# Debian starts a cluster on install; the tests and the demo run their own.
	if [[ " ${need[*]} " == *" postgresql "* ]] && have_cmd pg_ctlcluster; then
		for c in /etc/postgresql/*/main; do
			[[ -d $c ]] && $sudo pg_ctlcluster "$(basename "$(dirname "$c")")" main stop 2>/dev/null || true
		done
	fi
fi

hack/writers.sh fetch
echo "setup: the SQL append's clients (psycopg, pg, the JDBC driver) in $(hack/writers.sh dir)"
hack/kafka.sh fetch
echo "setup: Apache Kafka $(hack/kafka.sh version) jars in $cache/kafka-$(hack/kafka.sh version)/lib"
hack/registry.sh fetch
echo "setup: Apicurio Registry $(hack/registry.sh version) in $cache/apicurio-$(hack/registry.sh version)"
start=$(date +%s)
hack/pg-versions.sh fetch
echo "setup: PostgreSQL servers of the version matrix ($(($(date +%s) - start))s):" \
	"$(for m in $(hack/pg-versions.sh versions); do printf '%s=%s ' "$m" "$(hack/pg-versions.sh bindir "$m")"; done)"
# Only the benchmark uses Debezium (it fetches it itself when missing); CI does not.
if [[ ${CI:-} != true ]]; then
	if hack/debezium.sh fetch; then
		echo "setup: $(hack/debezium.sh version) jars in $cache (make bench's side by side)"
	else
		echo "setup: Debezium not fetched; make bench fetches it again or skips its side by side with a note" >&2
	fi
fi

start=$(date +%s)
echo "setup: promtool (the chart's alerts are evaluated with it) in $(hack/promtool.sh) ($(($(date +%s) - start))s)"
start=$(date +%s)
echo "setup: kubebuilder (test/project runs it on a copy of PROJECT) in $(hack/kubebuilder.sh) ($(($(date +%s) - start))s)"

k8s_version=$(go list -m -f '{{.Version}}' k8s.io/api | sed 's/^v0\./1./')
start=$(date +%s)
assets=$(K8S_VERSION=$k8s_version hack/envtest-assets.sh "$cache/envtest-$k8s_version")
echo "setup: envtest binaries (Kubernetes $k8s_version) in $assets ($(($(date +%s) - start))s)"

if [[ ${SETUP_E2E:-1} == 1 && -x hack/k8s-bins.sh ]]; then
	start=$(date +%s)
	bins=$(K8S_VERSION=$k8s_version hack/k8s-bins.sh "$cache/k8s-$k8s_version")
	echo "setup: node binaries (Kubernetes $k8s_version) in $bins ($(($(date +%s) - start))s)"
fi
