#!/usr/bin/env bash
# Apache Kafka 4.4.0, single node in KRaft mode (broker + controller), on 127.0.0.1.
#
#   hack/kafka.sh fetch            fetch the broker jars from Maven Central into the cache (once)
#   hack/kafka.sh start [DIR]      start the broker with its state in DIR (formatting the storage the
#                                  first time); prints the bootstrap address once it answers
#   hack/kafka.sh stop  [DIR]      stop the broker started in DIR (SIGTERM, clean shutdown), keep its data
#   hack/kafka.sh clean [DIR]      stop it and remove DIR
#   hack/kafka.sh status           exit 0 when a broker answers a metadata request on KAFKA_PORT
#   hack/kafka.sh version          print the broker version the cache holds
#
# Environment: KAFKA_PORT (default 39092), KAFKA_CONTROLLER_PORT (default KAFKA_PORT+1),
# KAFKA_HOST (default 127.0.0.1: the address the broker listens on and advertises; the e2e sets
# the node IP so that pods reach it),
# KAFKA_OWNER_PID (start: stop the broker and remove DIR once that process is gone; the test
# helpers pass their own pid), KAFKA_EXTRA_PROPERTIES (start: a file appended to the broker's
# server.properties, whose settings win: the tests' TLS, SASL and ACL listeners), OUTBOX_CACHE (default ~/.cache/outbox-operator). Java 17 or newer
# and mvn are required.
set -euo pipefail

KAFKA_VERSION=4.4.0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${OUTBOX_CACHE:-$HOME/.cache/outbox-operator}
lib=$cache/kafka-$KAFKA_VERSION/lib
host=${KAFKA_HOST:-127.0.0.1}
port=${KAFKA_PORT:-39092}
cport=${KAFKA_CONTROLLER_PORT:-$((port + 1))}

die() { echo "kafka.sh: $*" >&2; exit 1; }

fetch() {
	if [[ -f $lib/.complete ]]; then return 0; fi
	command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
	command -v java >/dev/null || die "java not found (apt-get install openjdk-17-jre-headless)"
	echo "fetching org.apache.kafka:kafka_2.13:$KAFKA_VERSION and its runtime dependencies from Maven Central" >&2
	rm -rf "$lib"
	if ! mvn -q -B -f "$here/kafka/pom.xml" dependency:copy-dependencies \
		-DincludeScope=runtime -DoutputDirectory="$lib" >&2; then
		die "could not fetch Apache Kafka $KAFKA_VERSION from Maven Central (is it reachable?)"
	fi
	[[ -f $lib/kafka_2.13-$KAFKA_VERSION.jar ]] || die "kafka_2.13-$KAFKA_VERSION.jar missing after fetch"
	touch "$lib/.complete"
}

# The tests' JVM: a small heap, the serial collector and the quick C1 compiler start fast and
# stay small, but pause 12-17 ms in every young collection (about every second under load).
# KAFKA_JVM_OPTS replaces these settings (make bench passes the production ones of Kafka's
# own start script: G1 with MaxGCPauseMillis=20, the full JIT, a 1 GiB heap).
java_opts() {
	echo "${KAFKA_JVM_OPTS:--Xms128m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1} -Dlog4j2.configurationFile=$1/log4j2.properties"
}

ready() {
	local bootstrap=$1
	if command -v kcat >/dev/null; then
		kcat -b "$bootstrap" -L -m 2 >/dev/null 2>&1
	else
		(exec 3<>"/dev/tcp/${bootstrap%:*}/${bootstrap#*:}") 2>/dev/null
	fi
}

start() {
	local dir=${1:-$cache/kafka-run}
	fetch
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [[ -f $dir/broker.pid ]] && kill -0 "$(cat "$dir/broker.pid")" 2>/dev/null; then
		echo "$host:$port"
		return 0
	fi
	cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://$host:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://$host:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/data
num.partitions=6
auto.create.topics.enable=true
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
log.segment.bytes=67108864
log.flush.interval.ms=9223372036854775807
EOF
	if [[ -n ${KAFKA_EXTRA_PROPERTIES:-} ]]; then
		cat "$KAFKA_EXTRA_PROPERTIES" >>"$dir/server.properties"
	fi
	cat >"$dir/log4j2.properties" <<'EOF'
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
EOF
	local opts cid
	opts=$(java_opts "$dir")
	# A fixed, valid cluster id: the storage is thrown away with the broker.
	cid=b3V0Ym94LW9wZXJhdG9yAA
	if [[ ! -f $dir/data/meta.properties ]]; then
	# shellcheck disable=SC2086
	java $opts -cp "$lib/*" kafka.tools.StorageTool format -t "$cid" -c "$dir/server.properties" \
		--ignore-formatted >"$dir/format.log" 2>&1 || { cat "$dir/format.log" >&2; die "storage format failed"; }
	fi
	# shellcheck disable=SC2086
	nohup java $opts -cp "$lib/*" kafka.Kafka "$dir/server.properties" >"$dir/broker.log" 2>&1 </dev/null &
	echo $! >"$dir/broker.pid"
	if [[ -n ${KAFKA_OWNER_PID:-} ]]; then
		# A watchdog: when the owner (a test binary) dies without stopping the broker, stop the
		# broker and remove its state. It ends by itself when the broker stops first.
		# shellcheck disable=SC2016
		nohup bash -c 'while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done
			kill -0 "$2" 2>/dev/null || exit 0
			kill "$2"; for _ in $(seq 1 40); do kill -0 "$2" 2>/dev/null || break; sleep 0.5; done
			kill -9 "$2" 2>/dev/null; rm -rf "$3"' _ "$KAFKA_OWNER_PID" "$!" "$dir" >/dev/null 2>&1 </dev/null &
	fi
	for _ in $(seq 1 120); do
		if ready "$host:$port"; then
			echo "$host:$port"
			return 0
		fi
		kill -0 "$(cat "$dir/broker.pid")" 2>/dev/null || { tail -30 "$dir/broker.log" >&2; die "broker exited during start"; }
		sleep 0.5
	done
	tail -30 "$dir/broker.log" >&2
	die "broker did not answer on $host:$port within 60s"
}

stop() {
	local dir=${1:-$cache/kafka-run}
	[[ -f $dir/broker.pid ]] || return 0
	local pid
	pid=$(cat "$dir/broker.pid")
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$dir/broker.pid"
}

clean() {
	local dir=${1:-$cache/kafka-run}
	stop "$dir"
	rm -rf "$dir"
}

case ${1:-} in
fetch) fetch ;;
start) start "${2:-}" ;;
stop) stop "${2:-}" ;;
clean) clean "${2:-}" ;;
version) fetch && echo "$KAFKA_VERSION" ;;
status) ready "$host:$port" ;;
*) die "usage: $0 fetch|start [DIR]|stop [DIR]|clean [DIR]|status|version" ;;
esac
