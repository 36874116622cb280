#!/usr/bin/env bash
# Runs go test with the shared test services: one Apache Kafka broker for the whole run
# (tests that need their own start one), PostgreSQL servers are started per test package by
# test/pgtest. Arguments are passed to go test; with --exec first, the rest is a command run with
# the services (make test runs its two lanes that way, on one broker). A broker already given in
# OUTBOX_TEST_KAFKA_BROKERS is used as it is.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cache=${OUTBOX_CACHE:-$HOME/.cache/outbox-operator}

if [[ -z ${KUBEBUILDER_ASSETS:-} || ! -x ${KUBEBUILDER_ASSETS}/kube-apiserver ]]; then
	echo "test.sh: KUBEBUILDER_ASSETS (${KUBEBUILDER_ASSETS:-unset}) has no kube-apiserver: run make setup" >&2
	exit 1
fi

if [[ -z ${OUTBOX_TEST_KAFKA_BROKERS:-} && ${OUTBOX_TEST_KAFKA:-apache} == apache ]]; then
	dir=$(mktemp -d /tmp/outbox-test-kafka.XXXXXX)
	trap 'hack/kafka.sh clean "$dir" >/dev/null 2>&1 || true' EXIT
	start=$(date +%s)
	# Two free ports, the listener's and the controller's (kafka.sh would take port+1, which may
	# be in use: CI once failed on "Address already in use"); another pair if the start fails.
	for attempt in 1 2 3; do
		read -r KAFKA_PORT KAFKA_CONTROLLER_PORT < <(python3 -c 'import socket
a, b = socket.socket(), socket.socket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])')
		export KAFKA_PORT KAFKA_CONTROLLER_PORT
		if OUTBOX_TEST_KAFKA_BROKERS=$(hack/kafka.sh start "$dir"); then
			break
		fi
		[[ $attempt == 3 ]] && exit 1
		echo "test.sh: the broker did not start (attempt $attempt); trying other ports" >&2
		hack/kafka.sh clean "$dir" >/dev/null 2>&1 || true
	done
	export OUTBOX_TEST_KAFKA_BROKERS
	echo "test.sh: Apache Kafka $(hack/kafka.sh version) at $OUTBOX_TEST_KAFKA_BROKERS (started in $(($(date +%s) - start))s)"
	unset KAFKA_PORT KAFKA_CONTROLLER_PORT
fi
if [[ ${1:-} == --exec ]]; then
	shift
	"$@"
	exit
fi
echo "test.sh: envtest binaries in $KUBEBUILDER_ASSETS"
go test "$@"
