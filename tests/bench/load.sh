#!/usr/bin/env bash
# Coordinator load benchmark: LOAD_CLIENTS simulated clients (BUILD_DIR/bench_load:
# one event loop, one keep-alive connection per client, synthetic updates
# that match each task exactly) against one strata-server on loopback
# (LOAD_MODEL, uniform policy at LOAD_DENSITY), for LOAD_ROUNDS rounds.
# Each run reports uploads per second over the rounds' upload windows,
# upload latency p50/p99/p99.9, errors (must be 0), the coordinator's CPU
# time per acknowledged upload and its peak RSS (bench_load --server-pid);
# the summary gives the median and the spread (min-max) of LOAD_RUNS runs.
#
# With LOAD_BASELINE_REV (a git revision, e.g. the landed head before a
# change), that revision's strata-server is built first (Release, the
# strata-server target only, in a git worktree in a temporary directory that
# is removed at the end), and every repetition runs the baseline and the
# current server in turn (the order alternates between repetitions) with the
# same bench_load and the same settings; the summary adds the ratio new/old
# of the medians.
#
# With LOAD_RATES ("1000 2000 4000 ..."), an open-loop sweep follows: one
# run per offered rate (and binary), uploads started at that rate whatever
# the answers, and a table of offered vs achieved rate and p50/p99; the knee
# is the highest offered rate whose p99 stays below LOAD_KNEE_MS (100 ms)
# without errors.
#
# Usage: tests/bench/load.sh BUILD_DIR
# Env: STRATA_DATA_DIR (data set), STRATA_SERVER_BIN (the current server;
# default BUILD_DIR/strata-server), LOAD_BASELINE_REV (unset: no baseline),
# LOAD_MODEL (mlp), LOAD_DENSITY (0.01), LOAD_CLIENTS (1000), LOAD_ROUNDS
# (3), LOAD_RUNS (3), LOAD_MODE (closed, or open at LOAD_RATE, default
# 2000/s), LOAD_PREBUILD (1: the closed loop's uploads of a round start once
# its payloads are built, bench_load --prebuild, so that building them, the
# clients' work, takes no CPU from the coordinator inside the upload window;
# 0: each upload starts as soon as its payload is built), LOAD_RATES
# (unset: no sweep), LOAD_SWEEP_ROUNDS (LOAD_ROUNDS),
# LOAD_KNEE_MS (100), LOAD_SERVER_THREADS (2, the server's --threads),
# LOAD_HTTP_THREADS (unset: the server's default --http-threads), LOAD_GOAL
# (1000 uploads/s), LOAD_BENCH_TIMEOUT (600 s per bench run),
# LOAD_BUILD_JOBS (nproc, for the baseline build), LOAD_DATABASE (unset:
# SQLite in the run's state directory; a libpq key=value connection string:
# the current server keeps its store in PostgreSQL, in a schema
# strata_load made afresh for each run; run it inside
# tests/unit/with_postgres.sh for a throw-away cluster). The servers run with
# OMP_WAIT_POLICY=passive. Loopback only; every process started here is
# stopped by PID on exit; every wait is bounded.
# Exits 0 when every run had 0 errors and the current server's median met
# the goal, 1 when the goal was missed, 2 on an error.
set -euo pipefail
BUILD=${1:?usage: load.sh BUILD_DIR}
DATA=${STRATA_DATA_DIR:-/usr/share/datasets/fashion-mnist}
SERVER=${STRATA_SERVER_BIN:-$BUILD/strata-server}
BENCH="$BUILD/bench_load"
MODEL=${LOAD_MODEL:-mlp}
DENSITY=${LOAD_DENSITY:-0.01}
CLIENTS=${LOAD_CLIENTS:-1000}
ROUNDS=${LOAD_ROUNDS:-3}
RUNS=${LOAD_RUNS:-3}
MODE=${LOAD_MODE:-closed}
PREBUILD=${LOAD_PREBUILD:-1}
RATE=${LOAD_RATE:-2000}
RATES=${LOAD_RATES:-}
SWEEP_ROUNDS=${LOAD_SWEEP_ROUNDS:-$ROUNDS}
KNEE_MS=${LOAD_KNEE_MS:-100}
THREADS=${LOAD_SERVER_THREADS:-2}
GOAL=${LOAD_GOAL:-1000}
BENCH_TIMEOUT=${LOAD_BENCH_TIMEOUT:-600}
JOBS=${LOAD_BUILD_JOBS:-$(nproc)}
HTTP=()
[ -z "${LOAD_HTTP_THREADS:-}" ] || HTTP=(--http-threads "$LOAD_HTTP_THREADS")
SECRET=load-bench-secret
# Room for every client's connection however the server's threads share
# them out (its connection limit is split between them).
MAXCONN=$((CLIENTS * 4 + 256))
[ "$MAXCONN" -le 65536 ] || MAXCONN=65536
case $PREBUILD in 0 | 1) ;; *)
    echo "LOAD_PREBUILD must be 0 or 1" >&2
    exit 2
    ;;
esac
case $MODE in closed | open) ;; *)
    echo "LOAD_MODE must be closed or open" >&2
    exit 2
    ;;
esac
if [ ! -x "$SERVER" ] || [ ! -x "$BENCH" ]; then
    echo "no $SERVER or $BENCH" >&2
    exit 2
fi
REPO=$(cd "$(dirname "$0")/../.." && pwd)
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true # a descriptor per connection, both ends

WORK=$(mktemp -d)
SPID=""
BASE_TREE=""
cleanup() {
    if [ -n "$SPID" ]; then
        kill -KILL "$SPID" 2>/dev/null || true
        wait "$SPID" 2>/dev/null || true
    fi
    if [ -n "$BASE_TREE" ]; then
        git -C "$REPO" worktree remove --force "$BASE_TREE" 2>/dev/null || true
        git -C "$REPO" worktree prune 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 2' INT TERM
fail() {
    echo "FAIL: $*" >&2
    exit 2
}
# jnum JSON KEY: a top-level number of bench_load's summary ("" when null).
jnum() { printf '%s' "$1" | grep -o "\"$2\":[-0-9.eE+]*" | head -n 1 | cut -d: -f2; }

# ---- the baseline server ------------------------------------------------------
BASE_SERVER=""
if [ -n "${LOAD_BASELINE_REV:-}" ]; then
    rev=$(git -C "$REPO" rev-parse --verify "${LOAD_BASELINE_REV}^{commit}") ||
        fail "LOAD_BASELINE_REV=$LOAD_BASELINE_REV is not a commit"
    BASE_TREE="$WORK/baseline"
    git -C "$REPO" worktree add --detach "$BASE_TREE" "$rev" >/dev/null 2>"$WORK/worktree.err" ||
        fail "git worktree add: $(cat "$WORK/worktree.err")"
    echo "== building the baseline strata-server at ${rev:0:12} ($LOAD_BASELINE_REV)"
    timeout 1800 cmake -S "$BASE_TREE" -B "$BASE_TREE/build" -DCMAKE_BUILD_TYPE=Release \
        >"$WORK/base-build.log" 2>&1 &&
        timeout 1800 cmake --build "$BASE_TREE/build" -j"$JOBS" --target strata-server \
            >>"$WORK/base-build.log" 2>&1 ||
        fail "baseline build: $(tail -n 20 "$WORK/base-build.log")"
    BASE_SERVER="$BASE_TREE/build/strata-server"
fi

# ---- one run: one coordinator, one bench_load ------------------------------------

start_server() { # start_server BIN DIR ROUNDS: sets SPID and URL
    local db=()
    if [ -n "${LOAD_DATABASE:-}" ] && [ "$1" = "$SERVER" ]; then
        psql "$LOAD_DATABASE" -X -q -v ON_ERROR_STOP=1 -c "SET client_min_messages = warning" \
            -c "DROP SCHEMA IF EXISTS strata_load CASCADE" -c "CREATE SCHEMA strata_load" ||
            fail "cannot make the schema strata_load in LOAD_DATABASE"
        db=(--database "$LOAD_DATABASE options='-c search_path=strata_load'")
    fi
    OMP_WAIT_POLICY=passive "$1" --state-dir "$2/state" ${db[@]+"${db[@]}"} --model "$MODEL" --data "$DATA" \
        --port 0 --rounds "$3" --min-clients "$CLIENTS" --round-deadline 600 --policy uniform \
        --density "$DENSITY" --enrolment-secret "$SECRET" --threads "$THREADS" \
        --max-connections "$MAXCONN" ${HTTP[@]+"${HTTP[@]}"} >"$2/server.out" 2>"$2/server.err" &
    SPID=$!
    URL=""
    for _ in $(seq 1 600); do
        URL=$(sed -n 's/^strata-server: listening on //p' "$2/server.out" 2>/dev/null | head -n 1)
        [ -n "$URL" ] && return 0
        kill -0 "$SPID" 2>/dev/null || fail "server exited: $(tail -n 5 "$2/server.err")"
        sleep 0.1
    done
    fail "server not listening after 60 s: $(tail -n 5 "$2/server.err")"
}

stop_server() { # SIGTERM, at most 30 s, then SIGKILL
    kill -TERM "$SPID" 2>/dev/null || true
    for _ in $(seq 1 300); do
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$SPID" 2>/dev/null || true
    wait "$SPID" 2>/dev/null || true
    SPID=""
}

# run LABEL BIN SEED ROUNDS RATE OUT: appends "label uploads/s p50_ms p99_ms
# p999_ms errors cpu_us rss_mb offered" to OUT (RATE 0: closed loop).
run() {
    local label=$1 bin=$2 seed=$3 rounds=$4 rate=$5 out=$6 dir="$WORK/run"
    rm -rf "$dir"
    mkdir -p "$dir"
    start_server "$bin" "$dir" "$rounds"
    local args=(--server "$URL" --clients "$CLIENTS" --rounds "$rounds" --secret "$SECRET"
        --seed "$seed" --server-pid "$SPID" --timeout "$BENCH_TIMEOUT" --json)
    if [ "$rate" != 0 ]; then
        args+=(--mode open --rate "$rate")
    elif [ "$PREBUILD" = 1 ]; then
        args+=(--prebuild)
    fi
    set +e
    timeout $((BENCH_TIMEOUT + 60)) "$BENCH" "${args[@]}" >"$dir/bench.out" 2>"$dir/bench.err"
    local brc=$?
    set -e
    stop_server
    local j
    j=$(tail -n 1 "$dir/bench.out")
    [ "${j:0:1}" = "{" ] || fail "$label: bench_load (exit $brc): $(tail -n 5 "$dir/bench.err")"
    grep '^clients ' "$dir/bench.out" | sed "s/^/  $label seed $seed: /"
    awk -v l="$label" -v r="$(jnum "$j" uploads_per_second)" -v p50="$(jnum "$j" p50_s)" \
        -v p99="$(jnum "$j" p99_s)" -v p999="$(jnum "$j" p999_s)" -v e="$(jnum "$j" errors)" \
        -v cpu="$(jnum "$j" coordinator_cpu_us_per_upload)" \
        -v rss="$(jnum "$j" coordinator_peak_rss_bytes)" -v o="$rate" 'BEGIN {
        printf "%s %.1f %.2f %.2f %.2f %d %.1f %.1f %s\n", l, r, p50 * 1e3, p99 * 1e3,
            p999 * 1e3, e, cpu, rss / 1048576, o }' >>"$out"
    rm -rf "$dir"
}

# summary FILE: per binary the median [min-max] of each column, then the
# ratio new/old of the medians when both binaries ran.
summary() {
    awk '
    function med(a, n,   i, j, t) {
        for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
            t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    function cell(l, c,   n, i, a, lo, hi) {
        n = cnt[l]
        for (i = 1; i <= n; i++) a[i] = v[l, i, c]
        m[l, c] = med(a, n); lo = a[1]; hi = a[n]
        return sprintf(c == 2 ? "%.0f [%.0f-%.0f]" : "%.1f [%.1f-%.1f]", m[l, c], lo, hi) }
    { l = $1; n = ++cnt[l]; for (c = 2; c <= 8; c++) v[l, n, c] = $c; err[l] += $6
      if (!(l in seen)) { seen[l] = 1; order[++nl] = l } }
    function w(c) { return 22 }
    function ratio(c) { return m["baseline", c] > 0 ? sprintf("%.3f", m["current", c] / m["baseline", c]) : "-" }
    END {
        printf "%-9s %4s %-22s %-22s %-22s %-22s %-22s %-22s %6s\n", "binary", "runs",
            "uploads/s", "p50 ms", "p99 ms", "p99.9 ms", "cpu us/upload", "peak RSS MB", "errors"
        for (k = 1; k <= nl; k++) {
            l = order[k]; line = sprintf("%-9s %4d", l, cnt[l])
            for (c = 2; c <= 8; c++) if (c != 6) line = line sprintf(" %-" w(c) "s", cell(l, c))
            printf "%s %6d\n", line, err[l] }
        if (("baseline" in seen) && ("current" in seen)) {
            line = sprintf("%-9s %4s", "new/old", "")
            for (c = 2; c <= 8; c++) if (c != 6) line = line sprintf(" %-" w(c) "s", ratio(c))
            print line }
        printf "(median [min-max] over the runs; latencies from the upload start (closed loop) or its scheduled start (open loop) to the answer; cpu: the coordinator'"'"'s CPU time from the first poll to the end per acknowledged upload)\n"
    }' "$1"
}

# ---- the runs ----------------------------------------------------------------------
LABELS=(current)
[ -z "$BASE_SERVER" ] || LABELS=(baseline current)
bin_of() { if [ "$1" = baseline ]; then echo "$BASE_SERVER"; else echo "$SERVER"; fi; }
main_rate=0
[ "$MODE" = closed ] || main_rate=$RATE
echo "== coordinator load: $CLIENTS clients x $ROUNDS rounds, $MODEL, uniform $DENSITY," \
    "$MODE loop$([ "$MODE" = closed ] || echo " at $RATE/s"), $RUNS runs of: ${LABELS[*]}"
: >"$WORK/results"
for i in $(seq 1 "$RUNS"); do
    order=("${LABELS[@]}")
    # The order alternates, so that a drift of the machine favours neither.
    [ $((i % 2)) = 1 ] || [ ${#LABELS[@]} = 1 ] || order=(current baseline)
    for l in "${order[@]}"; do
        run "$l" "$(bin_of "$l")" "$i" "$ROUNDS" "$main_rate" "$WORK/results"
    done
done
summary "$WORK/results"

if [ -n "$RATES" ]; then
    echo "== open-loop sweep: $CLIENTS clients x $SWEEP_ROUNDS rounds, evenly spaced starts"
    : >"$WORK/sweep"
    for r in $RATES; do
        for l in "${LABELS[@]}"; do
            run "$l" "$(bin_of "$l")" 1 "$SWEEP_ROUNDS" "$r" "$WORK/sweep"
        done
    done
    printf '%-9s %10s %12s %10s %10s %10s %8s\n' binary "offered/s" "achieved/s" "p50 ms" \
        "p99 ms" "p99.9 ms" errors
    sort -k1,1 -k9,9n "$WORK/sweep" |
        awk '{ printf "%-9s %10.0f %12.0f %10.1f %10.1f %10.1f %8d\n", $1, $9, $2, $3, $4, $5, $6 }'
    for l in "${LABELS[@]}"; do
        knee=$(awk -v l="$l" -v k="$KNEE_MS" '$1 == l && $4 < k && $6 == 0 && $9 > best { best = $9 }
            END { print best + 0 }' "$WORK/sweep")
        echo "knee ($l): $( [ "$knee" = 0 ] && echo "none" || echo "$knee/s") (the highest offered" \
            "rate with p99 < $KNEE_MS ms and no error)"
    done
fi

errors=$({ cat "$WORK/results" && { cat "$WORK/sweep" 2>/dev/null || true; }; } |
    awk '{ s += $6 } END { print s + 0 }')
[ "$errors" -eq 0 ] || fail "$errors errors"
cur=$(awk '$1 == "current" { print $2 }' "$WORK/results" | sort -g |
    awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
if awk -v r="$cur" -v g="$GOAL" 'BEGIN { exit !(r >= g) }'; then
    echo "goal >= $GOAL uploads/s: met (current median $(printf '%.0f' "$cur"))"
else
    echo "goal >= $GOAL uploads/s: NOT met (current median $(printf '%.0f' "$cur"))"
    exit 1
fi
