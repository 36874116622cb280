#!/usr/bin/env bash
# Debezium's PostgreSQL connector with its Outbox Event Router on Kafka Connect 4.3.1 (standalone
# worker) on 127.0.0.1: the peer the benchmark measures the relay against (test/bench, scenario
# debezium). See docs/benchmarks.md for the configuration and why each setting is what it is.
#
#   hack/debezium.sh fetch          fetch Connect and the connector from Maven Central into the cache (once)
#   hack/debezium.sh config DIR     write the worker and connector configuration into DIR, start nothing
#   hack/debezium.sh start DIR      write the configuration, start the worker with its state in DIR
#                                   (offsets kept there across restarts) and wait until the connector
#                                   and its task are RUNNING; prints pid=, rest=, log= lines
#   hack/debezium.sh stop DIR       stop that worker (SIGTERM: it commits its offsets), keep DIR
#   hack/debezium.sh clean DIR      stop it and remove DIR
#   hack/debezium.sh version        print the versions the cache holds
#
# Environment (start and config):
#   DEBEZIUM_BOOTSTRAP    Kafka bootstrap servers (default 127.0.0.1:39092)
#   DEBEZIUM_PG_HOST, DEBEZIUM_PG_PORT, DEBEZIUM_PG_USER, DEBEZIUM_PG_PASSWORD, DEBEZIUM_PG_DB
#                         the database (defaults 127.0.0.1, 5432, postgres, empty, postgres); the
#                         password is written to a file only its owner reads and never printed
#   DEBEZIUM_TABLE        the outbox table (default public.outbox)
#   DEBEZIUM_TOPIC_MAP    aggregate type to topic, as the relay's --topic-map: order=orders,pay=payments
#                         (types not listed go to a topic named like the type, as the router does)
#   DEBEZIUM_SLOT, DEBEZIUM_PUBLICATION  replication slot and publication (default outbox_debezium);
#                         the publication must exist (publication.autocreate.mode=disabled): create it
#                         FOR TABLE the outbox WITH (publish = 'insert', publish_via_partition_root = true)
#   DEBEZIUM_REST_PORT    the worker's REST port (default 38083)
#   DEBEZIUM_CONNECTOR_EXTRA  a file of connector properties appended to the generated ones (they win)
#   DEBEZIUM_WORKER_EXTRA     the same for the worker's properties
#   DEBEZIUM_WAIT         seconds to wait for RUNNING (default 120)
#   DEBEZIUM_OWNER_PID    stop the worker and remove DIR once that process is gone
#   OUTBOX_CACHE          default ~/.cache/outbox-operator
# Java 17 or newer, mvn and curl are required.
set -euo pipefail

CONNECT_VERSION=4.3.1 # not 4.4.0: Debezium 3.6.1 is built against Kafka 4.3 (see hack/debezium/connect/pom.xml)
DEBEZIUM_VERSION=3.6.1.Final
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${OUTBOX_CACHE:-$HOME/.cache/outbox-operator}
root=$cache/debezium-$DEBEZIUM_VERSION-connect-$CONNECT_VERSION
lib=$root/connect
plugins=$root/plugins
rest_port=${DEBEZIUM_REST_PORT:-38083}
name=outbox-debezium

die() { echo "debezium.sh: $*" >&2; exit 1; }

fetch() {
	if [[ -f $root/.complete ]]; then return 0; fi
	command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
	command -v java >/dev/null || die "java not found (apt-get install openjdk-17-jre-headless)"
	echo "fetching Kafka Connect $CONNECT_VERSION and Debezium $DEBEZIUM_VERSION (postgres connector, outbox router) from Maven Central" >&2
	rm -rf "$root"
	mkdir -p "$root"
	if ! mvn -q -B -f "$here/debezium/connect/pom.xml" dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$lib" >&2; then
		die "could not fetch Kafka Connect $CONNECT_VERSION from Maven Central (is it reachable?)"
	fi
	if ! mvn -q -B -f "$here/debezium/plugin/pom.xml" dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$plugins/debezium-connector-postgres" >&2; then
		die "could not fetch Debezium $DEBEZIUM_VERSION from Maven Central (is it reachable?)"
	fi
	# Connect provides the Kafka API, Jackson, slf4j and the compression codecs; a second copy in
	# the plugin's class loader is what Debezium's own archive avoids.
	rm -f "$plugins"/debezium-connector-postgres/{connect-api,kafka-clients,jackson-annotations,jackson-core,jackson-databind,slf4j-api,lz4-java,snappy-java,zstd-jni,jakarta.ws.rs-api}-*.jar
	[[ -f $lib/connect-runtime-$CONNECT_VERSION.jar ]] || die "connect-runtime-$CONNECT_VERSION.jar missing after fetch"
	[[ -f $plugins/debezium-connector-postgres/debezium-connector-postgres-$DEBEZIUM_VERSION.jar ]] || die "debezium-connector-postgres missing after fetch"
	[[ -f $plugins/debezium-connector-postgres/debezium-connect-plugins-$DEBEZIUM_VERSION.jar ]] || die "debezium-connect-plugins (the outbox router) missing after fetch"
	touch "$root/.complete"
}

# JVM flags as Kafka's connect-standalone.sh and kafka-run-class.sh set them.
java_opts() {
	echo "-Xms256M -Xmx2G -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 -Djava.awt.headless=true -Dlog4j2.configurationFile=$1/log4j2.properties"
}

# config writes worker.properties, connector.properties and log4j2.properties into $1.
config() {
	local dir=$1
	mkdir -p "$dir"
	local table=${DEBEZIUM_TABLE:-public.outbox}
	local slot=${DEBEZIUM_SLOT:-outbox_debezium} pub=${DEBEZIUM_PUBLICATION:-outbox_debezium}
	cat >"$dir/worker.properties" <<EOF
bootstrap.servers=${DEBEZIUM_BOOTSTRAP:-127.0.0.1:39092}
listeners=http://127.0.0.1:$rest_port
plugin.path=$plugins
# The default (hybrid_warn) scans every jar: ~10 s more cold start and twice the memory here.
plugin.discovery=service_load
# The relay publishes the row's bytes: plain strings for key and value, no schema envelope.
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
header.converter=org.apache.kafka.connect.storage.SimpleHeaderConverter
offset.storage.file.filename=$dir/offsets.dat
offset.flush.interval.ms=1000
# The relay's guarantee: every event acknowledged by all in-sync replicas, no duplicates from
# producer retries (Connect's defaults already; stated so that the comparison can be checked).
producer.acks=all
producer.enable.idempotence=true
producer.compression.type=none
# The relay sends each partition's messages of a batch at once, without waiting for more; Kafka 4's
# producer default waits 5 ms. Equal footing for latency (records that arrive while requests are
# in flight still share the next one, as the relay's next batch does).
producer.linger.ms=0
EOF
	if [[ -n ${DEBEZIUM_WORKER_EXTRA:-} ]]; then
		cat "$DEBEZIUM_WORKER_EXTRA" >>"$dir/worker.properties"
	fi
	local transforms=outbox extra_transforms="" i=0 entry
	if [[ -n ${DEBEZIUM_TOPIC_MAP:-} ]]; then
		IFS=, read -ra entries <<<"$DEBEZIUM_TOPIC_MAP"
		for entry in "${entries[@]}"; do
			[[ $entry == *=* ]] || die "DEBEZIUM_TOPIC_MAP: $entry is not type=topic"
			i=$((i + 1))
			transforms+=",topic$i"
			extra_transforms+="transforms.topic$i.type=org.apache.kafka.connect.transforms.RegexRouter
transforms.topic$i.regex=$(printf '%s' "${entry%%=*}" | sed 's/[.[\*^$()+?{}|\\]/\\&/g')
transforms.topic$i.replacement=${entry#*=}
"
		done
	fi
	(
		umask 077 # the password
		cat >"$dir/connector.properties" <<EOF
name=$name
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
plugin.name=pgoutput
database.hostname=${DEBEZIUM_PG_HOST:-127.0.0.1}
database.port=${DEBEZIUM_PG_PORT:-5432}
database.user=${DEBEZIUM_PG_USER:-postgres}
database.password=${DEBEZIUM_PG_PASSWORD:-}
database.dbname=${DEBEZIUM_PG_DB:-postgres}
topic.prefix=outbox
table.include.list=$table
slot.name=$slot
publication.name=$pub
publication.autocreate.mode=disabled
# Only rows written after the slot exists: the relay's backlog, not a snapshot of history.
snapshot.mode=no_data
# Throughput settings Debezium documents: larger batches and queue. The poll interval (also how
# long the streaming loop sleeps when the walsender has nothing; default 500 ms) as the relay's
# default poll interval, 10 ms: equal footing for latency.
max.batch.size=8192
max.queue.size=32768
poll.interval.ms=10
tombstones.on.delete=false
# No __debezium.context.* headers: the relay's messages carry only the event's own headers.
extended.headers.enabled=false
transforms=$transforms
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.table.field.event.id=event_id
transforms.outbox.table.field.event.key=aggregate_id
transforms.outbox.table.field.event.type=event_type
transforms.outbox.table.field.event.payload=payload
transforms.outbox.route.by.field=aggregate_type
transforms.outbox.route.topic.replacement=\${routedByValue}
transforms.outbox.table.fields.additional.placement=event_id:header:event_id,event_type:header:event_type,aggregate_type:header:aggregate_type,aggregate_id:header:aggregate_id,headers:header:headers
transforms.outbox.table.expand.json.payload=false
${extra_transforms}
EOF
		if [[ -n ${DEBEZIUM_CONNECTOR_EXTRA:-} ]]; then
			cat "$DEBEZIUM_CONNECTOR_EXTRA" >>"$dir/connector.properties"
		fi
	)
	cat >"$dir/log4j2.properties" <<'EOF'
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
logger.debezium.name = io.debezium
logger.debezium.level = INFO
EOF
}

# status prints the REST API's view of the connector; exit 0 when it and every task are RUNNING,
# 2 when one FAILED.
status() {
	local body
	body=$(curl -fsS --max-time 2 "http://127.0.0.1:$rest_port/connectors/$name/status" 2>/dev/null) || return 1
	if [[ $body == *'"FAILED"'* ]]; then
		echo "$body"
		return 2
	fi
	# {"name":..,"connector":{"state":"RUNNING",..},"tasks":[{"id":0,"state":"RUNNING",..}],..}
	local states
	states=$(grep -o '"state":"[A-Z]*"' <<<"$body" | sort -u)
	[[ $states == '"state":"RUNNING"' ]] && grep -q '"tasks":\[{' <<<"$body"
}

start() {
	local dir=${1:?start needs a state directory}
	command -v curl >/dev/null || die "curl not found (apt-get install curl)"
	fetch
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [[ -f $dir/worker.pid ]] && kill -0 "$(cat "$dir/worker.pid")" 2>/dev/null; then
		die "a worker already runs with its state in $dir (pid $(cat "$dir/worker.pid"))"
	fi
	config "$dir"
	local opts
	opts=$(java_opts "$dir")
	# shellcheck disable=SC2086
	nohup java $opts -cp "$lib/*" org.apache.kafka.connect.cli.ConnectStandalone \
		"$dir/worker.properties" "$dir/connector.properties" >"$dir/connect.log" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >"$dir/worker.pid"
	if [[ -n ${DEBEZIUM_OWNER_PID:-} ]]; then
		# A watchdog as in kafka.sh: when the owner dies without stopping the worker, stop it and
		# remove its state. It ends by itself when the worker stops first.
		# shellcheck disable=SC2016
		nohup bash -c 'while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done
			kill -0 "$2" 2>/dev/null || exit 0
			kill "$2"; for _ in $(seq 1 40); do kill -0 "$2" 2>/dev/null || break; sleep 0.5; done
			kill -9 "$2" 2>/dev/null; rm -rf "$3"' _ "$DEBEZIUM_OWNER_PID" "$pid" "$dir" >/dev/null 2>&1 </dev/null &
	fi
	local wait=${DEBEZIUM_WAIT:-120} deadline rc
	deadline=$((SECONDS + wait))
	while ((SECONDS < deadline)); do
		rc=0
		status >"$dir/status.json" || rc=$?
		if ((rc == 0)); then
			echo "pid=$pid"
			echo "rest=http://127.0.0.1:$rest_port"
			echo "log=$dir/connect.log"
			return 0
		fi
		if ((rc == 2)); then
			cat "$dir/status.json" >&2
			stop "$dir"
			die "the connector or its task FAILED (log: $dir/connect.log)"
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -40 "$dir/connect.log" >&2
			die "the Connect worker exited during start"
		fi
		sleep 0.1
	done
	tail -40 "$dir/connect.log" >&2
	stop "$dir"
	die "the connector was not RUNNING within ${wait}s"
}

stop() {
	local dir=${1:?stop needs a state directory}
	[[ -f $dir/worker.pid ]] || return 0
	local pid
	pid=$(cat "$dir/worker.pid")
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$dir/worker.pid"
}

clean() {
	local dir=${1:?clean needs a state directory}
	stop "$dir"
	rm -rf "$dir"
}

case ${1:-} in
fetch) fetch ;;
config) config "${2:?config needs a directory}" ;;
start) start "${2:-}" ;;
stop) stop "${2:-}" ;;
clean) clean "${2:-}" ;;
version) fetch && echo "connect $CONNECT_VERSION debezium $DEBEZIUM_VERSION" ;;
*) die "usage: $0 fetch|config DIR|start DIR|stop DIR|clean DIR|version" ;;
esac
