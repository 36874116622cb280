#!/usr/bin/env bash
# Apicurio Registry 3.3.3 (its Confluent-compatible API), in-memory storage, on 127.0.0.1 (or REGISTRY_HOST).
#
#   hack/registry.sh fetch            fetch the ready-to-run package from Maven Central into the
#                                     cache and unpack it (once)
#   hack/registry.sh start [DIR]      start the registry with its pid and log in DIR; prints the base
#                                     URL of the Confluent-compatible API
#                                     (http://HOST:PORT/apis/ccompat/v7) once it answers
#   hack/registry.sh stop  [DIR]      stop the registry started in DIR (its schemas are lost: they
#                                     live in memory)
#   hack/registry.sh clean [DIR]      stop it and remove DIR
#   hack/registry.sh status           exit 0 when a registry answers on REGISTRY_PORT
#   hack/registry.sh version          print the registry version the cache holds
#
# Environment: REGISTRY_HOST (default 127.0.0.1: the address it listens on and names in its URL;
# the demo sets the node IP so that pods reach it), REGISTRY_PORT (default 38081), REGISTRY_MANAGEMENT_PORT (default REGISTRY_PORT+1:
# Quarkus' health and metrics endpoints, which otherwise listen on 0.0.0.0:9000),
# REGISTRY_OWNER_PID (start: stop the registry and remove DIR once that process is gone; the test
# helpers pass their own pid), REGISTRY_JAVA (the java binary to run it with; by default the
# newest /usr/lib/jvm/*/bin/java of version 21 or newer, else java on PATH if it is 21 or newer),
# OUTBOX_CACHE (default ~/.cache/outbox-operator). Java 21 or newer, curl, and mvn (for fetch) are
# required.
set -euo pipefail

REGISTRY_VERSION=3.3.3
REGISTRY_SHA1=71e7918455480cbce405ad45552254eb47ec932d
cache=${OUTBOX_CACHE:-$HOME/.cache/outbox-operator}
archive=$cache/apicurio/apicurio-registry-app-$REGISTRY_VERSION-all.tar.gz
app=$cache/apicurio-$REGISTRY_VERSION
host=${REGISTRY_HOST:-127.0.0.1}
port=${REGISTRY_PORT:-38081}
mport=${REGISTRY_MANAGEMENT_PORT:-$((port + 1))}
base=http://$host:$port/apis/ccompat/v7

die() { echo "registry.sh: $*" >&2; exit 1; }

java_hint="Apicurio Registry $REGISTRY_VERSION needs Java 21 or newer: apt-get install openjdk-21-jre-headless (Debian 13, Ubuntu 24.04), or Temurin 25 from https://adoptium.net (temurin-25-jdk of its apt repository), or set REGISTRY_JAVA to one"

# java_major JAVA prints the major version of a java binary (8 for 1.8), or fails.
java_major() {
	local out
	out=$("$1" -version 2>&1) || return 1
	[[ $out =~ version\ \"([0-9]+)(\.([0-9]+))? ]] || return 1
	if [[ ${BASH_REMATCH[1]} == 1 ]]; then echo "${BASH_REMATCH[3]}"; else echo "${BASH_REMATCH[1]}"; fi
}

# find_java sets java to a java binary of version 21 or newer, or sets java_problem and fails.
java="" java_problem=""
find_java() {
	local j v bestv=0
	java=""
	if [[ -n ${REGISTRY_JAVA:-} ]]; then
		if ! v=$(java_major "$REGISTRY_JAVA"); then
			java_problem="REGISTRY_JAVA=$REGISTRY_JAVA does not run. $java_hint"
			return 1
		fi
		if ((v < 21)); then
			java_problem="REGISTRY_JAVA=$REGISTRY_JAVA is Java $v. $java_hint"
			return 1
		fi
		java=$REGISTRY_JAVA
		return 0
	fi
	for j in /usr/lib/jvm/*/bin/java; do
		[[ -x $j ]] || continue
		v=$(java_major "$j") || continue
		if ((v >= 21 && v > bestv)); then java=$j bestv=$v; fi
	done
	if [[ -z $java ]] && j=$(command -v java) && v=$(java_major "$j") && ((v >= 21)); then
		java=$j
	fi
	[[ -n $java ]] && return 0
	java_problem="no Java 21 or newer found (java on PATH: $(command -v java || echo none)). $java_hint"
	return 1
}

fetch() {
	if [[ -f $app/.complete ]]; then return 0; fi
	if [[ ! -f $archive ]] || [[ $(sha1sum "$archive" | cut -d' ' -f1) != "$REGISTRY_SHA1" ]]; then
		command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
		echo "fetching io.apicurio:apicurio-registry-app:$REGISTRY_VERSION:tar.gz:all (159 MB) from Maven Central" >&2
		rm -f "$archive"
		mkdir -p "$(dirname "$archive")"
		if ! mvn -B -q -Dstyle.color=never org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy \
			-Dartifact="io.apicurio:apicurio-registry-app:$REGISTRY_VERSION:tar.gz:all" \
			-DoutputDirectory="$(dirname "$archive")" >&2; then
			die "could not fetch Apicurio Registry $REGISTRY_VERSION from Maven Central (is it reachable?)"
		fi
		[[ -f $archive ]] || die "$archive missing after fetch"
		local got
		got=$(sha1sum "$archive" | cut -d' ' -f1)
		if [[ $got != "$REGISTRY_SHA1" ]]; then
			rm -f "$archive"
			die "$archive has sha1 $got, want $REGISTRY_SHA1"
		fi
	fi
	rm -rf "$app"
	mkdir -p "$app"
	tar -xzf "$archive" -C "$app" || die "could not unpack $archive"
	[[ -f $app/quarkus-run.jar ]] || die "quarkus-run.jar missing in $archive"
	touch "$app/.complete"
	# The package is fetched on any machine; only running it needs Java 21.
	find_java || echo "registry.sh: warning: $java_problem" >&2
}

ready() {
	curl -fs --max-time 2 -o /dev/null "$base/subjects"
}

start() {
	local dir=${1:-$cache/registry-run}
	fetch
	command -v curl >/dev/null || die "curl not found (apt-get install curl)"
	find_java || die "$java_problem"
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [[ -f $dir/registry.pid ]] && kill -0 "$(cat "$dir/registry.pid")" 2>/dev/null; then
		cat "$dir/registry.url" # the running one's, whatever REGISTRY_PORT says now
		return 0
	fi
	echo "$base" >"$dir/registry.url"
	mkdir -p "$dir/tmp"
	# A small heap, the serial collector and the quick C1 compiler: it starts in 2-4 s and stays
	# small. Storage is the default in-memory H2 database: the schemas go with the process.
	nohup "$java" -Xms64m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
		-Djava.io.tmpdir="$dir/tmp" \
		-Dquarkus.http.host="$host" -Dquarkus.http.port="$port" \
		-Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$mport" \
		-Dquarkus.log.level=WARN '-Dquarkus.log.category."io.apicurio".level=WARN' -Dquarkus.banner.enabled=false \
		-jar "$app/quarkus-run.jar" >"$dir/registry.log" 2>&1 </dev/null &
	echo $! >"$dir/registry.pid"
	if [[ -n ${REGISTRY_OWNER_PID:-} ]]; then
		# A watchdog: when the owner (a test binary) dies without stopping the registry, stop the
		# registry and remove its state. It ends by itself when the registry stops first.
		# shellcheck disable=SC2016
		nohup bash -c 'while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done
			kill -0 "$2" 2>/dev/null || exit 0
			kill "$2"; for _ in $(seq 1 40); do kill -0 "$2" 2>/dev/null || break; sleep 0.5; done
			kill -9 "$2" 2>/dev/null; rm -rf "$3"' _ "$REGISTRY_OWNER_PID" "$!" "$dir" >/dev/null 2>&1 </dev/null &
	fi
	local deadline=$((SECONDS + 60))
	while ((SECONDS < deadline)); do
		if ready; then
			echo "$base"
			return 0
		fi
		kill -0 "$(cat "$dir/registry.pid")" 2>/dev/null || { tail -30 "$dir/registry.log" >&2; die "registry exited during start"; }
		sleep 0.25
	done
	tail -30 "$dir/registry.log" >&2
	die "registry did not answer on $base within 60s"
}

stop() {
	local dir=${1:-$cache/registry-run}
	[[ -f $dir/registry.pid ]] || return 0
	local pid
	pid=$(cat "$dir/registry.pid")
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$dir/registry.pid"
}

clean() {
	local dir=${1:-$cache/registry-run}
	stop "$dir"
	rm -rf "$dir"
}

case ${1:-} in
fetch) fetch ;;
start) start "${2:-}" ;;
stop) stop "${2:-}" ;;
clean) clean "${2:-}" ;;
version) fetch && echo "$REGISTRY_VERSION" ;;
status) ready ;;
*) die "usage: $0 fetch|start [DIR]|stop [DIR]|clean [DIR]|status|version" ;;
esac
