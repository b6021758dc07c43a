# Helpers for the integration tests (sourced; not a test itself).
set -euo pipefail
BUILD=${1:?usage: test.sh BUILD_DIR}
DATA=${STRATA_DATA_DIR:-/usr/share/datasets/fashion-mnist}
TOOL="$BUILD/strata-tool"
WORK=$(mktemp -d)
export WORK
# The default cleanup: every process still in PIDS stopped, WORK removed.
# A test with more to undo sets its own EXIT trap and calls stop_all there.
trap 'stop_all; rm -rf "$WORK"' EXIT

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# json_field JSON KEY: the number or string value of a top-level key.
json_field() {
    printf '%s' "$1" | grep -o "\"$2\":[^,}]*" | head -n 1 | cut -d: -f2- | tr -d '"'
}

# assert_gt A B MESSAGE: floating-point A > B; both must be numbers (an
# empty value or null fails).
assert_gt() {
    awk -v a="$1" -v b="$2" 'BEGIN {
        num = "^[-+]?[0-9]*\\.?[0-9]+([eE][-+]?[0-9]+)?$"
        exit !(a ~ num && b ~ num && a + 0 > b + 0) }' || fail "$3 ($1 is not > $2)"
}

# wait_until SECONDS DESCRIPTION COMMAND...: polls COMMAND every WAIT_POLL
# seconds (0.1 unless the test sets it) until it succeeds. After SECONDS, or
# at DEADLINE when the test sets one (its whole run's limit, in $SECONDS),
# it gives up through the test's die when it defines one (to dump its
# logs first), else fail.
wait_until() {
    local limit=$1 what=$2 end
    shift 2
    end=$((SECONDS + limit))
    [ -z "${DEADLINE:-}" ] || [ "$end" -le "$DEADLINE" ] || end=$DEADLINE
    until "$@"; do
        if [ "$SECONDS" -ge "$end" ]; then
            declare -F die >/dev/null && die "timed out after ${limit}s waiting for: $what"
            fail "timed out after ${limit}s waiting for: $what"
        fi
        sleep "${WAIT_POLL:-0.1}"
    done
}

# wait_listening PID OUT ERR: waits (at most 30 s) until the coordinator PID
# has printed its listening line to OUT and sets URL from it; fails with
# ERR's text when PID exits first.
wait_listening() {
    local _
    for _ in $(seq 1 300); do
        URL=$(sed -n 's/^strata-server: listening on //p' "$2" 2>/dev/null | head -n 1)
        [ -n "$URL" ] && return 0
        kill -0 "$1" 2>/dev/null || fail "coordinator exited: $(cat "$3" 2>/dev/null)"
        sleep 0.1
    done
    fail "coordinator not listening after 30 s: $(cat "$3" 2>/dev/null)"
}

# Processes a test started and has not reaped (tests append to PIDS):
# forget PID drops one (reaped, never to be signalled again); reap PID waits
# for it (its exit status in REAPED_RC) and forgets it.
PIDS=()
forget() { # forget PID: reaped, never to be signalled again
    local p keep=()
    for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}
reap() { # reap PID: wait for it (status in REAPED_RC) and forget it
    REAPED_RC=0
    wait "$1" 2>/dev/null || REAPED_RC=$?
    forget "$1"
}
stop_all() { # SIGTERM to every process in PIDS, then wait for each
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}

# HTTP and process helpers: get PATH fetches $URL$PATH with the test's curl
# command C (an array the test sets), metric NAME reads one value of
# /metrics; alive/exited PID.
get() { "${C[@]}" "$URL$1" 2>/dev/null | tr -d '\000'; }
metric() { get /metrics | sed -n "s/^$1 //p"; }
alive() { kill -0 "$1" 2>/dev/null; }
exited() { ! alive "$1"; }

# The store the tests read: SQLite in STATE/state.db, or, with
# STRATA_TEST_DATABASE (a libpq connection string; see
# tests/integration/test_kill_load_postgres.sh), that PostgreSQL database.
# STORE_ARGS are the coordinator's options that choose it.
STORE_ARGS=()
[ -z "${STRATA_TEST_DATABASE:-}" ] || STORE_ARGS=(--database "$STRATA_TEST_DATABASE")

# store_query STATE SQL: the rows of SQL, columns separated by one space.
# Read-only, so it may run while the coordinator does.
store_query() {
    if [ -n "${STRATA_TEST_DATABASE:-}" ]; then
        psql "$STRATA_TEST_DATABASE" -X -A -t -q -F ' ' -v ON_ERROR_STOP=1 -c "$2"
    else
        sqlite3 -readonly -batch -noheader -separator ' ' "$1/state.db" "$2"
    fi
}

# stored_payloads STATE DIR [ROUND CLIENT]: writes every stored payload (or
# CLIENT's of ROUND) to DIR/ROUND-CLIENT.bin, in one process (thousands of
# updates).
stored_payloads() {
    local where=""
    [ -z "${3:-}" ] || where=" WHERE u.round = $3 AND u.client_id = $4"
    if [ -n "${STRATA_TEST_DATABASE:-}" ]; then
        store_query "$1" "SELECT u.round, u.client_id, encode(p.body, 'hex') FROM updates u
            JOIN payloads p ON p.seq = u.seq$where" |
            python3 -c 'import sys
for line in sys.stdin:
    r, c, h = line.split()
    with open("%s/%s-%s.bin" % (sys.argv[1], r, c), "wb") as f:
        f.write(bytes.fromhex(h))' "$2"
    else
        sqlite3 -readonly -batch "$1/state.db" \
            "SELECT writefile('$2/' || u.round || '-' || u.client_id || '.bin', p.body)
             FROM updates u JOIN payloads p ON p.seq = u.seq$where" >/dev/null
    fi
}

# stored_payload STATE ROUND CLIENT OUT: writes the payload the coordinator
# stored for CLIENT's update of ROUND to OUT; fails when there is none.
stored_payload() {
    rm -f "$4"
    local d
    d=$(mktemp -d) || return 1
    stored_payloads "$1" "$d" "$2" "$3" && [ -s "$d/$2-$3.bin" ] && mv "$d/$2-$3.bin" "$4"
    local rc=$?
    rm -rf "$d"
    return $rc
}

# stored_count STATE [ROUND]: the number of stored payloads (of ROUND).
stored_count() {
    store_query "$1" "SELECT count(*) FROM updates u JOIN payloads p ON p.seq = u.seq${2:+ WHERE u.round = $2}"
}

# haproxy_coordinators LOG FRONT_PORT PORT...: starts HAProxy (appended to
# PIDS; LOG its log, the config beside it) on 127.0.0.1:FRONT_PORT, sending
# requests round robin to every coordinator on 127.0.0.1:PORT whose GET
# /v1/health answers 200 (checked every 200 ms; one failed check takes it
# out, one passed check puts it back).
haproxy_coordinators() {
    local log=$1 front=$2 port i=0
    shift 2
    {
        printf '%s\n' "defaults" "    mode http" "    timeout connect 1s" "    timeout client 60s" \
            "    timeout server 60s" "    timeout check 1s" "    retries 3" "    option redispatch" \
            "frontend coordinators" "    bind 127.0.0.1:$front" "    default_backend coordinators" \
            "backend coordinators" "    balance roundrobin" "    option httpchk GET /v1/health" \
            "    http-check expect status 200" "    default-server inter 200ms fall 1 rise 1"
        for port in "$@"; do
            i=$((i + 1))
            echo "    server c$i 127.0.0.1:$port check"
        done
    } >"$log.cfg"
    haproxy -f "$log.cfg" -db >"$log" 2>&1 &
    PIDS+=($!)
}
