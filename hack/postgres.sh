#!/usr/bin/env bash
# A local PostgreSQL server for the demo and the end-to-end test (tests use test/pgtest).
#
#   hack/postgres.sh start [DIR]   initdb DIR (once) and start the server; prints a libpq URL
#   hack/postgres.sh stop  [DIR]   stop it, keep its data
#   hack/postgres.sh clean [DIR]   stop it and remove DIR
#
# Environment: PG_PORT (default 54329), PG_LISTEN (default 127.0.0.1; the e2e adds the node IP so
# pods reach it), PG_PASSWORD (default outbox; user and database are "outbox").
set -euo pipefail
cache=${OUTBOX_CACHE:-$HOME/.cache/outbox-operator}
port=${PG_PORT:-54329}
listen=${PG_LISTEN:-127.0.0.1}
password=${PG_PASSWORD:-outbox}

die() { echo "postgres.sh: $*" >&2; exit 1; }

bindir() {
	local d
	for d in ${OUTBOX_PG_BINDIR:-} "$(pg_config --bindir 2>/dev/null || true)" $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		[[ -n $d && -x $d/initdb && -x $d/pg_ctl ]] && { echo "$d"; return; }
	done
	die "no PostgreSQL server binaries found: run make setup (apt-get install postgresql)"
}

as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

start() {
	local dir=${1:-$cache/demo-postgres} bin
	bin=$(bindir)
	mkdir -p "$dir"
	if [[ $(id -u) == 0 ]]; then
		chown postgres: "$dir"
		runuser -u postgres -- test -w "$dir" ||
			die "the postgres user cannot reach $dir (a parent directory is not searchable); choose a directory under /tmp or /var/tmp"
	fi
	if [[ ! -f $dir/data/PG_VERSION ]]; then
		local pw
		pw=$(mktemp) && echo "$password" >"$pw" && chmod 644 "$pw"
		as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
			--pwfile="$pw" --encoding=UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || { rm -f "$pw"; cat "$dir/initdb.log" >&2; die "initdb failed"; }
		rm -f "$pw"
		cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '$listen'
port = $port
unix_socket_directories = '$dir'
max_connections = 200
shared_buffers = 256MB
CONF
		echo "host all all 0.0.0.0/0 scram-sha-256" >>"$dir/data/pg_hba.conf"
	fi
	if ! as_pg "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
		as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null || { tail -20 "$dir/server.log" >&2; die "server did not start"; }
	fi
	as_pg "$bin/psql" -h "$dir" -p "$port" -U postgres -d postgres -qtAc \
		"DO \$\$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox') THEN CREATE ROLE outbox LOGIN PASSWORD '$password'; END IF; END \$\$;" >/dev/null
	if [[ -z $(as_pg "$bin/psql" -h "$dir" -p "$port" -U postgres -d postgres -qtAc "SELECT 1 FROM pg_database WHERE datname = 'outbox'") ]]; then
		as_pg "$bin/psql" -h "$dir" -p "$port" -U postgres -d postgres -qtAc "CREATE DATABASE outbox OWNER outbox" >/dev/null
	fi
	echo "postgres://outbox:$password@${listen%%,*}:$port/outbox?sslmode=disable"
}

stop() {
	local dir=${1:-$cache/demo-postgres} bin
	bin=$(bindir)
	[[ -f $dir/data/PG_VERSION ]] || return 0
	as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
}

case ${1:-} in
start) start "${2:-}" ;;
stop) stop "${2:-}" ;;
clean) stop "${2:-}"; rm -rf "${2:-$cache/demo-postgres}" ;;
*) die "usage: $0 start|stop|clean [DIR]" ;;
esac
