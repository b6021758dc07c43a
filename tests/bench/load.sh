#!/usr/bin/env bash
# Coordinator load benchmark (issue 6, must-show 6): LOAD_CLIENTS concurrent
# lightweight synthetic clients (build/bench_load: one thread and one
# keep-alive connection each, synthetic top-k updates of the mlp, 199,210
# parameters, at 1% density) against one strata-server on loopback, for
# LOAD_ROUNDS rounds. Reports uploads per second over each round's upload
# window, p50/p99 upload latency, errors (must be 0) and the coordinator's
# peak RSS (VmHWM of /proc/PID/status after the run), once per repetition
# and as the median of LOAD_RUNS repetitions with the spread.
#
# Usage: tests/bench/load.sh BUILD_DIR
# Env: STRATA_DATA_DIR (data set), STRATA_SERVER_BIN (default
# BUILD_DIR/strata-server), LOAD_CLIENTS (500), LOAD_ROUNDS (3), LOAD_RUNS
# (3), LOAD_SERVER_THREADS (2, the server's --threads), LOAD_HTTP_THREADS
# (unset: the server's default --http-threads), LOAD_GOAL (1000 uploads/s). The server runs with OMP_WAIT_POLICY=passive. Loopback only;
# every process started here is killed by PID on exit; every wait is bounded.
# Exits 0 when every run had 0 errors and the median met the goal, 1 when
# the goal was missed, 2 on an error.
set -euo pipefail
BUILD=${1:?usage: load.sh BUILD_DIR}
DATA=${STRATA_DATA_DIR:-/usr/share/datasets/fashion-mnist}
SERVER=${STRATA_SERVER_BIN:-$BUILD/strata-server}
BENCH="$BUILD/bench_load"
CLIENTS=${LOAD_CLIENTS:-500}
ROUNDS=${LOAD_ROUNDS:-3}
RUNS=${LOAD_RUNS:-3}
THREADS=${LOAD_SERVER_THREADS:-2}
GOAL=${LOAD_GOAL:-1000}
HTTP=()
[ -z "${LOAD_HTTP_THREADS:-}" ] || HTTP=(--http-threads "$LOAD_HTTP_THREADS")
SECRET=load-bench-secret
if [ ! -x "$SERVER" ] || [ ! -x "$BENCH" ]; then
    echo "no $SERVER or $BENCH" >&2
    exit 2
fi

WORK=$(mktemp -d)
SPID=""
cleanup() {
    if [ -n "$SPID" ]; then
        kill "$SPID" 2>/dev/null || true
        wait "$SPID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 2' INT TERM
fail() {
    echo "FAIL: $*" >&2
    exit 2
}
# jnum JSON KEY: a top-level number of bench_load's summary.
jnum() { printf '%s' "$1" | grep -o "\"$2\":[-0-9.eE+]*" | head -n 1 | cut -d: -f2; }

# run I: one coordinator, one bench_load; appends "rate p50 p99 errors
# hwm_kb per_round_rates" to $WORK/results.
run() {
    local i=$1 dir="$WORK/run$1"
    mkdir -p "$dir"
    OMP_WAIT_POLICY=passive "$SERVER" --state-dir "$dir/state" --model mlp --data "$DATA" \
        --port 0 --rounds "$ROUNDS" --min-clients "$CLIENTS" --round-deadline 600 \
        --policy uniform --density 0.01 --enrolment-secret "$SECRET" --threads "$THREADS" \
        ${HTTP[@]+"${HTTP[@]}"} >"$dir/server.out" 2>"$dir/server.err" &
    SPID=$!
    for _ in $(seq 1 300); do
        grep -q "listening on" "$dir/server.out" 2>/dev/null && break
        kill -0 "$SPID" 2>/dev/null || fail "server exited: $(cat "$dir/server.err")"
        sleep 0.1
    done
    local url
    url=$(sed -n 's/^strata-server: listening on //p' "$dir/server.out" | head -n 1)
    [ -n "$url" ] || fail "no listening line"
    local start_kb
    start_kb=$(awk '/^VmHWM:/ { print $2 }' "/proc/$SPID/status")
    set +e
    timeout 900 "$BENCH" --server "$url" --clients "$CLIENTS" --rounds "$ROUNDS" \
        --secret "$SECRET" --seed "$i" --json >"$dir/bench.out" 2>"$dir/bench.err"
    local brc=$?
    set -e
    local hwm_kb
    hwm_kb=$(awk '/^VmHWM:/ { print $2 }' "/proc/$SPID/status")
    kill -TERM "$SPID"
    wait "$SPID" || fail "server exit status $?"
    SPID=""
    sed -n '1,/^clients/p' "$dir/bench.out" | sed "s/^/  run $i: /"
    local j
    j=$(tail -n 1 "$dir/bench.out")
    [ "${j:0:1}" = "{" ] || fail "bench_load (exit $brc): $(tail -n 5 "$dir/bench.err")"
    local rates
    rates=$(printf '%s' "$j" | grep -o '"uploads_per_second":[-0-9.eE+]*' | tail -n +2 |
        cut -d: -f2 | awk '{ printf "%s%.0f", (NR > 1 ? "/" : ""), $1 }')
    echo "$(jnum "$j" uploads_per_second) $(jnum "$j" latency_p50_ms)" \
        "$(jnum "$j" latency_p99_ms) $(jnum "$j" errors) $hwm_kb $start_kb $rates" \
        >>"$WORK/results"
    rm -rf "$dir"
}

echo "== coordinator load: $CLIENTS clients x $ROUNDS rounds, mlp, uniform 1%, $RUNS runs"
: >"$WORK/results"
for i in $(seq 1 "$RUNS"); do
    run "$i"
done

printf '%-5s %12s %10s %10s %8s %14s %14s  %s\n' run "uploads/s" "p50 ms" "p99 ms" errors \
    "start RSS MB" "peak RSS MB" "per round uploads/s"
awk '{ printf "%-5d %12.0f %10.1f %10.1f %8d %14.1f %14.1f  %s\n", NR, $1, $2, $3, $4, $6 / 1024, $5 / 1024, $7 }' \
    "$WORK/results"
# Median (middle value; the lower middle for an even count) and spread.
med() { cut -d' ' -f"$1" "$WORK/results" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
lo() { cut -d' ' -f"$1" "$WORK/results" | sort -g | head -n 1; }
hi() { cut -d' ' -f"$1" "$WORK/results" | sort -g | tail -n 1; }
errors=$(awk '{ s += $4 } END { print s + 0 }' "$WORK/results")
printf '%-5s %12.0f %10.1f %10.1f %8d %14s %14.1f\n' median "$(med 1)" "$(med 2)" "$(med 3)" \
    "$errors" "" "$(awk -v k="$(med 5)" 'BEGIN { print k / 1024 }')"
printf 'spread: uploads/s %.0f-%.0f, p50 %.1f-%.1f ms, p99 %.1f-%.1f ms, peak RSS %.1f-%.1f MB\n' \
    "$(lo 1)" "$(hi 1)" "$(lo 2)" "$(hi 2)" "$(lo 3)" "$(hi 3)" \
    "$(awk -v k="$(lo 5)" 'BEGIN { print k / 1024 }')" "$(awk -v k="$(hi 5)" 'BEGIN { print k / 1024 }')"
[ "$errors" -eq 0 ] || fail "$errors errors"
if awk -v r="$(med 1)" -v g="$GOAL" 'BEGIN { exit !(r >= g) }'; then
    echo "goal >= $GOAL uploads/s: met"
else
    echo "goal >= $GOAL uploads/s: NOT met (median $(printf '%.0f' "$(med 1)"))"
    exit 1
fi
