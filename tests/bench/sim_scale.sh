#!/usr/bin/env bash
# strata-sim at scale: 100 clients, 10 per round, MODEL (default mlp),
# Dirichlet 0.5, uniform 1% (ROUNDS rounds, default 20), REPEATS times
# (default 3), with any further strata-sim options after MODEL. Per run:
# wall time and strata-sim's peak RSS (GNU time, which takes the largest of
# strata-sim and the processes it waited for; or /proc when it is missing),
# and the peak RSS (VmHWM of /proc/PID/status, sampled every 0.2 s)
# of the coordinator, of the largest client that trained, and of the largest
# client that was never selected (idle); then the medians.
# Usage: tests/bench/sim_scale.sh BUILD_DIR [ROUNDS] [REPEATS] [MODEL [OPTION...]]
set -euo pipefail
BUILD=${1:?usage: sim_scale.sh BUILD_DIR [ROUNDS] [REPEATS] [MODEL [OPTION...]]}
ROUNDS=${2:-20}
REPEATS=${3:-3}
MODEL=${4:-mlp}
shift $(($# < 4 ? $# : 4))
EXTRA=("$@")
DATA=${STRATA_DATA_DIR:-/usr/share/datasets/fashion-mnist}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# sample OUT SIM: "KIND INDEX VmHWM" lines for the processes of the run in
# OUT while SIM runs (the coordinator and the clients name OUT/ on their
# command lines).
sample() {
    local out=$1 sim=$2 pid cmd hwm
    while kill -0 "$sim" 2>/dev/null; do
        for pid in $(pgrep -f -- "$out/" 2>/dev/null || true); do
            cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || continue
            hwm=$(awk '/^VmHWM/ { print $2 }' 2>/dev/null <"/proc/$pid/status") || continue
            [ -n "$hwm" ] || continue
            case "$cmd" in
            *strata-server*) echo "server 0 $hwm" ;;
            *strata-client*) echo "client $(echo "$cmd" | grep -o -- '--client-index [0-9]*' |
                cut -d' ' -f2) $hwm" ;;
            esac
        done
        sleep 0.2
    done
}

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

printf '%-4s %8s %10s %12s %14s %12s %10s\n' run wall_s sim_kB server_kB trained_max_kB \
    idle_max_kB accuracy
for k in $(seq 1 "$REPEATS"); do
    out="$WORK/run$k"
    start=$(date +%s.%N)
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -f "%M" -o "$WORK/time$k" "$BUILD/strata-sim" --clients 100 \
            --clients-per-round 10 --rounds "$ROUNDS" --model "$MODEL" --partition dirichlet:0.5 \
            --policy uniform --density 0.01 --data "$DATA" --out "$out" --json "${EXTRA[@]}" \
            >"$WORK/out$k" 2>"$WORK/err$k" &
    else
        "$BUILD/strata-sim" --clients 100 --clients-per-round 10 --rounds "$ROUNDS" \
            --model "$MODEL" --partition dirichlet:0.5 --policy uniform --density 0.01 \
            --data "$DATA" --out "$out" --json "${EXTRA[@]}" >"$WORK/out$k" 2>"$WORK/err$k" &
    fi
    sim=$!
    sample "$out" "$sim" >"$WORK/rss$k"
    wait "$sim" || { tail -n 5 "$WORK/err$k" >&2; exit 1; }
    wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
    simkb=$(cat "$WORK/time$k" 2>/dev/null || echo "-")
    server=$(awk '$1 == "server" && $3 > m { m = $3 } END { print m + 0 }' "$WORK/rss$k")
    trained=0 idle=0
    for i in $(seq 0 99); do
        m=$(awk -v i="$i" '$1 == "client" && $2 == i && $3 > m { m = $3 } END { print m + 0 }' \
            "$WORK/rss$k")
        if [ -f "$out/clients/$i/receipts.log" ]; then
            [ "$m" -gt "$trained" ] && trained=$m
        else
            [ "$m" -gt "$idle" ] && idle=$m
        fi
    done
    acc=$(tail -n 1 "$WORK/out$k" | grep -o '"final_accuracy":[0-9.]*' | cut -d: -f2)
    printf '%-4s %8s %10s %12s %14s %12s %10.4f\n' "$k" "$wall" "$simkb" "$server" "$trained" \
        "$idle" "$acc" | tee -a "$WORK/table"
done
printf '%-4s %8s %10s %12s %14s %12s %10s\n' median \
    "$(awk '{ print $2 }' "$WORK/table" | median)" "$(awk '{ print $3 }' "$WORK/table" | median)" \
    "$(awk '{ print $4 }' "$WORK/table" | median)" "$(awk '{ print $5 }' "$WORK/table" | median)" \
    "$(awk '{ print $6 }' "$WORK/table" | median)" "$(awk '{ print $7 }' "$WORK/table" | median)"
