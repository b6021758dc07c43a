#!/usr/bin/env bash
# A throw-away PostgreSQL 15 cluster for tests.
#
# Run as a command:
#
#   bash tests/unit/with_postgres.sh COMMAND [ARG...]
#
# starts a cluster, runs COMMAND with STRATA_TEST_PG_URL set (a libpq
# connection string: superuser `strata`, database `postgres`, over a Unix
# socket), then stops the cluster and removes it, whatever the command did
# (also on SIGINT, SIGTERM and SIGHUP). Its exit status is the command's.
#
# Or sourced, by a test that has more to run around the cluster:
#
#   source tests/unit/with_postgres.sh
#   strata_pg_start          # sets and exports the variables below
#   ...                      # psql "$STRATA_TEST_PG_URL" ..., strata-server ...
#   strata_pg_stop           # idempotent; call it from the test's EXIT trap
#
# Sourcing only defines the functions and sets no shell option and no trap.
# After strata_pg_start:
#
#   STRATA_TEST_PG_URL   "host=DIR port=PORT user=strata dbname=postgres"
#   STRATA_PG_DIR        the cluster's temporary directory (removed by stop):
#                        the socket, postgres.log, and the data directory
#   STRATA_PG_DATA       $STRATA_PG_DIR/data
#   STRATA_PG_PORT       the port number (it only names the socket: the
#                        server listens on no TCP address)
#   STRATA_PG_PID        the postmaster's process id
#
# strata_pg_as_owner COMMAND... runs a command as the cluster's owner (e.g.
# "$STRATA_PG_BIN/pg_ctl" -D "$STRATA_PG_DATA" ...).
#
# PostgreSQL refuses to run as root: as root, the cluster belongs to the
# system user strata-pg (created once, with no home and no login shell) and
# initdb and pg_ctl run as it; otherwise as the current user. The binaries
# come from STRATA_PG_BIN (default /usr/lib/postgresql/15/bin, Debian's
# postgresql-15, which scripts/setup.sh installs).
#
# Environment: STRATA_PG_BIN; STRATA_PG_PORT (default from $$); TMPDIR.

STRATA_PG_BIN=${STRATA_PG_BIN:-/usr/lib/postgresql/15/bin}
STRATA_PG_OWNER=strata-pg # the cluster's owner when run as root
# The running cluster's directory and postmaster: shell variables, not
# exported, so that a command run inside a cluster may start its own.
_strata_pg_dir=${_strata_pg_dir:-}
_strata_pg_pid=${_strata_pg_pid:-}

_strata_pg_log() {
    echo "with_postgres: $*" >&2
}

# strata_pg_as_owner COMMAND...: runs COMMAND as the cluster's owner, from
# the cluster's directory (the owner may not be able to read the caller's
# working directory).
strata_pg_as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        (cd "${_strata_pg_dir:-/}" && runuser -u "$STRATA_PG_OWNER" -- "$@")
    else
        (cd "${_strata_pg_dir:-/}" && "$@")
    fi
}

# Creates the system user that owns the cluster when run as root, unless it
# exists. Two runs may race for it: a failed useradd is fine when the user
# exists afterwards.
_strata_pg_owner() {
    local try
    for try in 1 2 3 4 5; do
        id -u "$STRATA_PG_OWNER" >/dev/null 2>&1 && return 0
        useradd --system --no-create-home --shell /usr/sbin/nologin "$STRATA_PG_OWNER" \
            >/dev/null 2>&1 && return 0
        sleep 1
    done
    id -u "$STRATA_PG_OWNER" >/dev/null 2>&1 && return 0
    _strata_pg_log "cannot create the system user $STRATA_PG_OWNER (useradd)"
    return 1
}

# A value between single quotes for postgresql.conf.
_strata_pg_quote() {
    printf "'%s'" "$(printf '%s' "$1" | sed "s/'/''/g")"
}

# Says why the start failed, with the end of the server's log, and removes
# what the start made.
_strata_pg_fail_start() {
    _strata_pg_log "$*"
    if [ -f "$_strata_pg_dir/postgres.log" ]; then
        echo "---- postgres.log (last lines) ----" >&2
        tail -n 30 "$_strata_pg_dir/postgres.log" >&2
    fi
    strata_pg_stop
    return 1
}

# strata_pg_start: initdb, start and wait (at most 30 s) until the server
# accepts connections; sets the variables above. Returns non-zero (having
# removed what it made) when any step fails.
strata_pg_start() {
    local base port end data
    if [ -n "$_strata_pg_dir" ]; then
        _strata_pg_log "this shell runs a cluster already, in $_strata_pg_dir"
        return 1
    fi
    if [ ! -x "$STRATA_PG_BIN/initdb" ]; then
        _strata_pg_log "$STRATA_PG_BIN/initdb not found: install the Debian package" \
            "postgresql-15 (scripts/setup.sh installs it)"
        return 1
    fi
    if [ "$(id -u)" -eq 0 ]; then
        _strata_pg_owner || return 1
    fi

    # The socket's path must fit in sun_path (108 bytes).
    base=${TMPDIR:-/tmp}
    if [ "${#base}" -gt 60 ]; then base=/tmp; fi
    _strata_pg_dir=$(mktemp -d "$base/strata-pg.XXXXXX") || {
        _strata_pg_dir=
        _strata_pg_log "cannot make a temporary directory in $base"
        return 1
    }
    data=$_strata_pg_dir/data
    port=${STRATA_PG_PORT:-$((40000 + $$ % 20000))}
    if [ "$(id -u)" -eq 0 ]; then
        if ! chown "$STRATA_PG_OWNER" "$_strata_pg_dir" ||
            ! strata_pg_as_owner test -w "$_strata_pg_dir"; then
            _strata_pg_fail_start "$STRATA_PG_OWNER cannot write to $_strata_pg_dir" \
                "(can other users search $base? set TMPDIR)"
            return 1
        fi
    fi

    if ! strata_pg_as_owner "$STRATA_PG_BIN/initdb" -D "$data" -A trust -U strata -E UTF8 \
        --locale=C --no-sync >"$_strata_pg_dir/initdb.log" 2>&1; then
        cat "$_strata_pg_dir/initdb.log" >&2
        _strata_pg_fail_start "initdb failed"
        return 1
    fi
    # The settings go into postgresql.conf rather than onto pg_ctl's command
    # line (where a shell would split the directory's name), so that a
    # restart by pg_ctl keeps them. A Unix socket in the cluster's own
    # directory and no TCP address: parallel runs cannot collide, whatever
    # their port numbers. fsync off: the tests kill processes (the server's
    # clients, or the server itself), never the machine, and what a process
    # wrote survives its death in the kernel's page cache; without fsync a
    # commit costs no disk flush.
    {
        echo
        echo "# with_postgres.sh"
        echo "listen_addresses = ''"
        echo "unix_socket_directories = $(_strata_pg_quote "$_strata_pg_dir")"
        echo "port = $port"
        echo "fsync = off"
        echo "max_connections = 200"
    } >>"$data/postgresql.conf"

    if ! strata_pg_as_owner "$STRATA_PG_BIN/pg_ctl" -D "$data" -l "$_strata_pg_dir/postgres.log" \
        -w -t 30 start >/dev/null; then
        _strata_pg_fail_start "the server did not start within 30 s"
        return 1
    fi
    _strata_pg_pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)
    end=$((SECONDS + 30))
    until "$STRATA_PG_BIN/pg_isready" -q -h "$_strata_pg_dir" -p "$port" -U strata \
        -d postgres -t 1; do
        if [ "$SECONDS" -ge "$end" ]; then
            _strata_pg_fail_start "the server does not accept connections after 30 s"
            return 1
        fi
        sleep 0.1
    done
    STRATA_PG_DIR=$_strata_pg_dir
    STRATA_PG_DATA=$data
    STRATA_PG_PORT=$port
    STRATA_PG_PID=$_strata_pg_pid
    STRATA_TEST_PG_URL="host=$_strata_pg_dir port=$port user=strata dbname=postgres"
    export STRATA_TEST_PG_URL STRATA_PG_DIR STRATA_PG_DATA STRATA_PG_PORT STRATA_PG_PID
    _strata_pg_log "PostgreSQL $("$STRATA_PG_BIN/postgres" -V | awk '{print $3}')" \
        "ready: $STRATA_TEST_PG_URL"
    return 0
}

# _strata_pg_running PID DATA: whether PID is still the postmaster of DATA
# (not exited, not a zombie that nobody reaped yet, not a reused id).
_strata_pg_running() {
    kill -0 "$1" 2>/dev/null || return 1
    [ -r "/proc/$1/stat" ] || return 0 # no /proc: kill -0 is all we know
    [ "$(sed 's/^.*) \(.\).*$/\1/' "/proc/$1/stat" 2>/dev/null)" != Z ] || return 1
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$2"
}

# strata_pg_stop: stops the cluster that strata_pg_start started in this
# shell (a fast shutdown, then an immediate one, then SIGKILL to its
# postmaster; each wait bounded) and removes its directory. Does nothing
# when none runs.
strata_pg_stop() {
    local data pid i
    [ -n "$_strata_pg_dir" ] || return 0
    data=$_strata_pg_dir/data
    pid=$_strata_pg_pid
    if [ -f "$data/postmaster.pid" ]; then
        # The postmaster now (a restart by pg_ctl changes it).
        pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)
        [ -n "$pid" ] || pid=$_strata_pg_pid
        strata_pg_as_owner "$STRATA_PG_BIN/pg_ctl" -D "$data" -m fast -w -t 30 stop \
            >/dev/null 2>&1 ||
            strata_pg_as_owner "$STRATA_PG_BIN/pg_ctl" -D "$data" -m immediate -w -t 10 stop \
                >/dev/null 2>&1 || true
    fi
    if [ -n "$pid" ] && _strata_pg_running "$pid" "$data"; then
        _strata_pg_log "postmaster $pid did not stop: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for i in $(seq 1 100); do
            _strata_pg_running "$pid" "$data" || break
            sleep 0.1
        done
    fi
    rm -rf "$_strata_pg_dir"
    _strata_pg_dir=
    _strata_pg_pid=
    unset STRATA_TEST_PG_URL STRATA_PG_DIR STRATA_PG_DATA STRATA_PG_PID
    return 0
}

# As a command: the command, in the background so that a signal's trap runs
# at once; on a signal the command gets SIGTERM (SIGKILL after 10 s), then
# the EXIT trap stops the cluster.
_strata_pg_child=
_strata_pg_interrupted() {
    local i
    if [ -n "$_strata_pg_child" ]; then
        kill -TERM "$_strata_pg_child" 2>/dev/null || true
        for i in $(seq 1 100); do
            kill -0 "$_strata_pg_child" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$_strata_pg_child" 2>/dev/null; then
            kill -KILL "$_strata_pg_child" 2>/dev/null || true
        fi
        wait "$_strata_pg_child" 2>/dev/null || true
    fi
    exit "$1"
}

_strata_pg_main() {
    set -euo pipefail
    if [ $# -eq 0 ]; then
        echo "usage: with_postgres.sh COMMAND [ARG...]" >&2
        exit 2
    fi
    local status=0
    trap 'strata_pg_stop' EXIT
    trap '_strata_pg_interrupted 130' INT
    trap '_strata_pg_interrupted 143' TERM
    trap '_strata_pg_interrupted 129' HUP
    strata_pg_start || exit 1
    "$@" <&0 & # standard input stays the script's
    _strata_pg_child=$!
    wait "$_strata_pg_child" || status=$?
    _strata_pg_child=
    exit "$status"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    _strata_pg_main "$@"
fi
