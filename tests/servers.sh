#!/usr/bin/env bash
# What the tests need from this machine, made ready: the PostgreSQL and MariaDB
# servers they talk to started if they are down, and the Debian programs some
# tests run installed if they are missing (etcd for the private etcd clusters,
# Chromium for the dashboard's browser tests). Safe to run again: it changes
# nothing that is already in place. Installing needs root (or sudo).
set -euo pipefail

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "tests/servers.sh: '$*' needs root; run it as root or install sudo" >&2
        exit 1
    fi
}

# PostgreSQL on 127.0.0.1:5432 (the PostgreSQL tests make a schema of their own in `test`).
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
    for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi

# MariaDB on 127.0.0.1:3306 (the MySQL tests make a database of their own).
if ! mariadb-admin ping -h 127.0.0.1 -u root --silent >/dev/null 2>&1; then
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
    for _ in $(seq 30); do mariadb-admin ping -h 127.0.0.1 -u root --silent >/dev/null 2>&1 && break; sleep 1; done
fi

# Debian's packages for the programs the tests start.
missing=()
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
    install() { as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }
    install "${missing[@]}" || { as_root apt-get update -qq && install "${missing[@]}"; }
fi
