#!/usr/bin/env bash
# Replica benchmark: uploads a second through HAProxy to three coordinators
# on one PostgreSQL store, against one coordinator on SQLite, in the same
# run. REP_CLIENTS simulated clients (BUILD_DIR/bench_load, closed loop with
# --prebuild, mlp at 1%) upload for REP_ROUNDS rounds; each repetition runs
# the SQLite coordinator, then the three replicas (A leads, B and C follow;
# HAProxy round robin over all three, health-checked on GET /v1/health),
# with the same bench_load settings; REP_RUNS repetitions. Reported per
# setting: the median and the spread (min-max) of uploads per second and
# p99, errors (must be 0); for the replicas also the CPU time of each
# process (from /proc, over the bench run) per upload it took (a
# follower's: its strata_updates_accepted_total; the leader's: every
# upload of the run, since it adopts the followers' too) and HAProxy's and
# PostgreSQL's CPU per upload.
#
# Usage: tests/bench/replicas.sh BUILD_DIR (it starts a throw-away
# PostgreSQL cluster itself, tests/unit/with_postgres.sh).
# Env: STRATA_DATA_DIR, REP_CLIENTS (1000), REP_ROUNDS (4), REP_RUNS (3),
# REP_THREADS (1: each coordinator's --threads). Loopback only; every
# process started here is stopped on exit.
set -euo pipefail
BUILD=${1:?usage: replicas.sh BUILD_DIR}
if [ -z "${STRATA_TEST_PG_URL:-}" ]; then
    exec bash "$(dirname "$0")/../unit/with_postgres.sh" bash "$0" "$@"
fi
DATA=${STRATA_DATA_DIR:-/usr/share/datasets/fashion-mnist}
SERVER="$BUILD/strata-server"
BENCH="$BUILD/bench_load"
CLIENTS=${REP_CLIENTS:-1000}
ROUNDS=${REP_ROUNDS:-4}
RUNS=${REP_RUNS:-3}
THREADS=${REP_THREADS:-1}
SECRET="replicas-bench-$$"
DB=$STRATA_TEST_PG_URL
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
    echo "replicas.sh: $*" >&2
    exit 2
}
for x in "$SERVER" "$BENCH"; do [ -x "$x" ] || fail "no $x (build first)"; done
command -v haproxy >/dev/null || fail "haproxy is required (scripts/setup.sh installs it)"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
pg_ticks() { # the cluster's postmaster and its children (the sessions' backends)
    local pm t p
    pm=$(head -n 1 "$STRATA_PG_DATA/postmaster.pid")
    t=$(cpu_ticks "$pm")
    for p in $(pgrep -P "$pm" || true); do t=$((t + $(cpu_ticks "$p"))); done
    echo $t
}
TCK=$(getconf CLK_TCK)
jnum() { python3 -c 'import json, sys; v = json.loads(sys.argv[1]).get(sys.argv[2]); print("" if v is None else v)' "$1" "$2"; }
metric() { curl -s --max-time 5 "$1/metrics" | sed -n "s/^$2 //p"; }

# coordinator NAME PORT [ARGS...]: starts it; sets CPID.
coordinator() {
    local name=$1 port=$2
    shift 2
    OMP_WAIT_POLICY=passive "$SERVER" --state-dir "$WORK/$name/state" "$@" --model mlp \
        --data "$DATA" --port "$port" --rounds "$ROUNDS" --min-clients "$CLIENTS" \
        --round-deadline 600 --policy uniform --density 0.01 --enrolment-secret "$SECRET" \
        --threads "$THREADS" --max-connections 4096 >"$WORK/$name.out" 2>"$WORK/$name.err" &
    CPID=$!
    PIDS+=("$CPID")
    local _
    for _ in $(seq 1 600); do
        curl -s --max-time 1 "http://127.0.0.1:$port/v1/health" 2>/dev/null | grep -q '"ready":true' &&
            return 0
        kill -0 "$CPID" 2>/dev/null || fail "$name exited: $(tail -n 3 "$WORK/$name.err")"
        sleep 0.1
    done
    fail "$name not ready after 60 s"
}
stop() { kill -TERM "$@" 2>/dev/null || true; for p in "$@"; do wait "$p" 2>/dev/null || true; done; }
bench() { # bench URL OUT: one bench_load run, its JSON summary into OUT
    "$BENCH" --server "$1" --clients "$CLIENTS" --rounds "$ROUNDS" --secret "$SECRET" --prebuild \
        --timeout 600 --json >"$2.log" 2>"$2.err" || true
    tail -n 1 "$2.log" >"$2"
}

for ((run = 1; run <= RUNS; run++)); do
    # One coordinator on SQLite.
    rm -rf "$WORK/single" && mkdir -p "$WORK/single"
    P=$(free_port)
    coordinator single "$P"
    S=$CPID
    bench "http://127.0.0.1:$P" "$WORK/single-$run.json"
    stop "$S"
    # Three on PostgreSQL behind HAProxy, in a fresh schema.
    psql "$DB" -X -q -v ON_ERROR_STOP=1 -c "SET client_min_messages = warning" \
        -c "DROP SCHEMA IF EXISTS strata_rep CASCADE" -c "CREATE SCHEMA strata_rep"
    URLDB="$DB options='-c search_path=strata_rep'"
    declare -A PORT CP
    for n in A B C; do
        rm -rf "$WORK/$n" && mkdir -p "$WORK/$n"
        PORT[$n]=$(free_port)
        coordinator "$n" "${PORT[$n]}" --database "$URLDB" --coordinator-name "$n"
        CP[$n]=$CPID
    done
    PF=$(free_port)
    cat >"$WORK/haproxy.cfg" <<EOF
global
    maxconn 8192
defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout check 1s
frontend coordinators
    bind 127.0.0.1:$PF
    default_backend coordinators
backend coordinators
    balance roundrobin
    option httpchk GET /v1/health
    http-check expect status 200
    default-server inter 1s fall 2 rise 1 maxconn 4096
    server a 127.0.0.1:${PORT[A]} check
    server b 127.0.0.1:${PORT[B]} check
    server c 127.0.0.1:${PORT[C]} check
EOF
    haproxy -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 &
    H=$!
    PIDS+=("$H")
    sleep 1
    declare -A T0 A0
    for n in A B C; do
        T0[$n]=$(cpu_ticks "${CP[$n]}")
        A0[$n]=$(metric "http://127.0.0.1:${PORT[$n]}" strata_updates_accepted_total)
    done
    H0=$(cpu_ticks "$H")
    G0=$(pg_ticks)
    bench "http://127.0.0.1:$PF" "$WORK/replicas-$run.json"
    acked=$(jnum "$(cat "$WORK/replicas-$run.json")" acknowledged)
    for n in A B C; do
        t=$(($(cpu_ticks "${CP[$n]}") - T0[$n]))
        a=$(($(metric "http://127.0.0.1:${PORT[$n]}" strata_updates_accepted_total) - A0[$n]))
        [ "$n" = A ] && a=$acked # the leader adopts every upload
        echo "$n $t $a" >>"$WORK/cpu-$run.txt"
    done
    echo "haproxy $(($(cpu_ticks "$H") - H0)) $acked" >>"$WORK/cpu-$run.txt"
    echo "postgres $(($(pg_ticks) - G0)) $acked" >>"$WORK/cpu-$run.txt"
    stop "$H" "${CP[A]}" "${CP[B]}" "${CP[C]}"
    for f in single replicas; do
        j=$(cat "$WORK/$f-$run.json")
        echo "run $run $f: $(jnum "$j" uploads_per_second) uploads/s, p99 $(jnum "$j" p99_s) s, errors $(jnum "$j" errors), acknowledged $(jnum "$j" acknowledged)"
    done
done

python3 - "$WORK" "$RUNS" "$TCK" <<'EOF'
import json, statistics, sys
work, runs, tck = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(f, r):
    return json.loads(open("%s/%s-%d.json" % (work, f, r)).read())
res = {}
for f in ("single", "replicas"):
    ups = [load(f, r)["uploads_per_second"] for r in range(1, runs + 1)]
    p99 = [load(f, r)["p99_s"] for r in range(1, runs + 1)]
    err = sum(load(f, r)["errors"] for r in range(1, runs + 1))
    res[f] = statistics.median(ups)
    print("%-9s median %.0f uploads/s [%.0f-%.0f], p99 median %.3f s, errors %d"
          % (f, statistics.median(ups), min(ups), max(ups), statistics.median(p99), err))
cpu = {}
for r in range(1, runs + 1):
    for line in open("%s/cpu-%d.txt" % (work, r)):
        n, t, a = line.split()
        cpu.setdefault(n, []).append(int(t) / tck * 1e6 / max(int(a), 1))
for n, v in cpu.items():
    role = {"A": "leader", "B": "follower", "C": "follower"}.get(n, "")
    print("CPU per upload %-8s %-8s median %.0f us [%.0f-%.0f]"
          % (n, role, statistics.median(v), min(v), max(v)))
print("ratio replicas/single: %.2f" % (res["replicas"] / res["single"]))
EOF
