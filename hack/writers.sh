#!/usr/bin/env bash
# The clients the SQL append's tests in other languages use (test/writers), into the cache:
#   psycopg 3 (PyPI) for Python, pg 8 (the npm registry) for Node.js, the PostgreSQL JDBC driver
#   (Maven Central) for Java. PHP's PDO driver is a Debian package (php-pgsql, hack/setup.sh).
#
#   hack/writers.sh fetch    fetch what is missing (idempotent)
#   hack/writers.sh dir      print the directory the tests read them from
set -euo pipefail
cache=${OUTBOX_CACHE:-$HOME/.cache/outbox-operator}
dir=$cache/writers
jdbc_version=42.7.11

die() { echo "writers.sh: $*" >&2; exit 1; }

fetch() {
	mkdir -p "$dir"
	if [[ ! -f $dir/python/.complete ]]; then
		command -v python3 >/dev/null || die "python3 not found (apt-get install python3 python3-pip)"
		rm -rf "$dir/python"
		python3 -m pip install -q --disable-pip-version-check --break-system-packages --target "$dir/python" 'psycopg[binary]==3.2.*' >&2 ||
			die "could not install psycopg from PyPI"
		touch "$dir/python/.complete"
	fi
	if [[ ! -f $dir/node/.complete ]]; then
		command -v npm >/dev/null || die "npm not found (apt-get install nodejs npm)"
		rm -rf "$dir/node" && mkdir -p "$dir/node"
		(cd "$dir/node" && npm install --silent --no-audit --no-fund --no-save pg@8 >&2) || die "could not install pg from the npm registry"
		touch "$dir/node/.complete"
	fi
	if [[ ! -f $dir/postgresql-$jdbc_version.jar ]]; then
		command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
		mvn -q -B dependency:copy -Dartifact="org.postgresql:postgresql:$jdbc_version" -DoutputDirectory="$dir" >&2 ||
			die "could not fetch the PostgreSQL JDBC driver from Maven Central"
	fi
	# The tests find the driver under a name without its version.
	ln -sf "postgresql-$jdbc_version.jar" "$dir/postgresql.jar"
}

case ${1:-} in
fetch) fetch ;;
dir) echo "$dir" ;;
*) die "usage: hack/writers.sh fetch|dir" ;;
esac
