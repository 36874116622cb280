#!/usr/bin/env bash
# Runs the benchmark suite (test/bench) at full size and writes docs/benchmarks.md and
# docs/benchmarks.png. The benchmark starts its own PostgreSQL server and Apache Kafka broker,
# builds ./cmd/relay and runs it as a subprocess; it takes about 90 minutes on 2 cores, of which
# about 33 are the side by side with Debezium (scenario debezium: Kafka Connect and Debezium from
# hack/debezium.sh, skipped with a note where Java or Maven is missing), about 15 the idle
# shards (scenario idle: 100 relay processes on one database, polling and then notified) and
# about 13 what a Kafka transaction costs the broker (scenario txncost: one client, no relay).
#
#   hack/bench.sh                               # what `make bench` runs (also docs/benchmarks.json)
#   hack/bench.sh -scale 0.1 -out /tmp/bench    # a quick run that leaves docs/ alone
#   hack/bench.sh -scenarios sharddown -merge-into docs/benchmarks.json -json docs/benchmarks.json -out docs
#                                               # measure some scenarios again, into the last full run
#   hack/bench.sh -scenarios debezium -out /tmp/bench   # only the side by side with Debezium (~33 min)
#   hack/bench.sh -scenarios idle -scale 0.1 -out /tmp/bench  # 10 idle shards, windows of 12s (~2 min)
#   hack/bench.sh -scenarios envelopes -merge-into docs/benchmarks.json -json docs/benchmarks.json -out docs
#                                               # CloudEvents and tracing against none (~4 min)
#   hack/bench.sh -scenarios debezium -peers relay-snapshot -statements 8 -latency-dump /tmp/ld -out /tmp/bench
#                                               # one publisher, with its top statements (planning
#                                               # included) and every event's times as CSV
#   hack/bench.sh -h                            # every flag
#
# Arguments are passed to the benchmark. The result table goes to stdout, progress to stderr.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

hack/kafka.sh fetch >&2 # the broker's jars, fetched once into the cache
bin=$(mktemp -d /tmp/outbox-bench-bin.XXXXXX)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/bench" ./test/bench
# The full run also keeps its raw results, so that the report can be written again from them
# (go run ./test/bench -report-from docs/benchmarks.json) without measuring anew.
if [[ $# -eq 0 ]]; then
	set -- -json docs/benchmarks.json
fi
"$bin/bench" "$@"
