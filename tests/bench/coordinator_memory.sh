#!/usr/bin/env bash
# Coordinator memory benchmark (issue 4, must-show 6): peak RSS (VmHWM) of
# strata-server running one round of FedAvg (mlp) with 10 and with 200
# synthetic clients, each registered over curl and uploading one update built
# by strata-tool compress (the same delta, the downloaded model itself, with
# each client's id in the header). Streaming aggregation keeps one
# accumulator per layer, so peak(200) / peak(10) should stay below 2.
#
# Usage: tests/bench/coordinator_memory.sh BUILD_DIR [POLICY[:DENSITY] ...]
#   default policies: none uniform:0.01
# Env: STRATA_DATA_DIR (data set), MEM_CLIENTS ("10 200"), MEM_JOBS (4
# concurrent client uploads). Loopback only; every process started here is
# killed by PID on exit; every wait is bounded. Exits 1 when a ratio is 2 or
# more, 2 on a failure.
set -euo pipefail
BUILD=${1:?usage: coordinator_memory.sh BUILD_DIR [POLICY[:DENSITY] ...]}
shift
POLICIES=("$@")
[ ${#POLICIES[@]} -gt 0 ] || POLICIES=(none uniform:0.01)
DATA=${STRATA_DATA_DIR:-/usr/share/datasets/fashion-mnist}
CLIENTS=${MEM_CLIENTS:-10 200}
JOBS=${MEM_JOBS:-4}
SERVER="$BUILD/strata-server"
TOOL="$BUILD/strata-tool"
if [ ! -x "$SERVER" ] || [ ! -x "$TOOL" ]; then
    echo "no $SERVER or $TOOL" >&2
    exit 2
fi
command -v curl >/dev/null || { echo "curl is required" >&2; exit 2; }

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
json_field() {
    printf '%s' "$1" | grep -o "\"$2\":[^,}]*" | head -n 1 | cut -d: -f2- | tr -d '"'
}
hwm_kb() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"; }
C=(curl -sS --max-time 30)

# One client: task, compress (own client id), upload, remove the payload.
# Args: URL ID TOKEN POLICY DENSITY DIR
client() {
    local url=$1 id=$2 token=$3 policy=$4 density=$5 dir=$6 task mv code
    task=$("${C[@]}" -f -H "Authorization: Bearer $token" "$url/v1/tasks/next?wait=10") ||
        fail "task for client $id"
    mv=$(json_field "$task" model_version)
    "$TOOL" compress --in "$dir/model.safetensors" --policy "$policy" --density "$density" \
        --round 0 --rounds 1 --out "$dir/up$id.bin" --client-id "$id" --model-version "$mv" \
        --samples $((100 + id)) >/dev/null || fail "compress for client $id"
    code=$("${C[@]}" -o "$dir/r$id" -w '%{http_code}' -X POST -H "Authorization: Bearer $token" \
        -H 'Content-Type: application/octet-stream' --data-binary @"$dir/up$id.bin" \
        "$url/v1/rounds/0/updates") || fail "upload for client $id"
    [ "$code" = 200 ] || fail "upload for client $id: HTTP $code $(cat "$dir/r$id")"
    stat -c %s "$dir/up$id.bin" >>"$dir/bytes"
    rm -f "$dir/up$id.bin" "$dir/r$id"
}
export -f client json_field fail
export TOOL
export C_ARGS="curl -sS --max-time 30"

# run POLICY DENSITY N: writes "N start_kb peak_kb uplink_bytes seconds" to
# $WORK/result (runs in this shell, so the EXIT trap sees the server's PID).
run() {
    local policy=$1 density=$2 n=$3
    local dir="$WORK/$policy-$n"
    mkdir -p "$dir"
    "$SERVER" --state-dir "$dir/state" --model mlp --data "$DATA" --port 0 --rounds 1 \
        --min-clients "$n" --clients-per-round "$n" --policy "$policy" --density "$density" \
        --round-deadline 300 --enrolment-secret mem-s3cret >"$dir/server.out" 2>"$dir/server.err" &
    SPID=$!
    for _ in $(seq 1 300); do
        grep -q "listening on" "$dir/server.out" 2>/dev/null && break
        kill -0 "$SPID" 2>/dev/null || fail "server exited: $(cat "$dir/server.err")"
        sleep 0.1
    done
    local url
    url=$(head -n 1 "$dir/server.out" | sed -n 's/^strata-server: listening on //p')
    [ -n "$url" ] || fail "no listening line"
    local start_kb t0 i body
    start_kb=$(hwm_kb "$SPID")
    t0=$(date +%s.%N)
    : >"$dir/clients"
    for i in $(seq 1 "$n"); do
        body=$("${C[@]}" -f -X POST -H 'Content-Type: application/json' \
            -d "{\"name\":\"mem-$i\",\"enrolment_secret\":\"mem-s3cret\"}" "$url/v1/clients") || fail "register $i"
        echo "$(json_field "$body" client_id) $(json_field "$body" token)" >>"$dir/clients"
    done
    "${C[@]}" -f -H "Authorization: Bearer $(head -n 1 "$dir/clients" | cut -d' ' -f2)" \
        -o "$dir/model.safetensors" "$url/v1/models/0" || fail "model 0"
    : >"$dir/bytes"
    # Bounded concurrency; each worker exits 2 on failure, which xargs reports.
    C_URL=$url C_POLICY=$policy C_DENSITY=$density C_DIR=$dir \
        timeout 240 xargs -P "$JOBS" -L 1 bash -c \
        'C=($C_ARGS); client "$C_URL" "$0" "$1" "$C_POLICY" "$C_DENSITY" "$C_DIR"' \
        <"$dir/clients" || fail "client uploads ($policy, $n clients)"
    local state=""
    for _ in $(seq 1 600); do
        body=$("${C[@]}" "$url/v1/rounds/0") || true
        state=$(json_field "$body" state)
        [ "$state" = closed ] && break
        sleep 0.2
    done
    [ "$state" = closed ] || fail "round did not close ($policy, $n clients): $body"
    [ "$(json_field "$body" participants)" = "$n" ] || fail "participants: $body"
    local peak_kb secs bytes
    peak_kb=$(hwm_kb "$SPID")
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    bytes=$(awk '{ s += $1 } END { print s + 0 }' "$dir/bytes")
    kill -TERM "$SPID"
    wait "$SPID" || fail "server exit status $?"
    SPID=""
    rm -rf "$dir"
    echo "$n $start_kb $peak_kb $bytes $secs" >"$WORK/result"
}

status=0
printf '%-14s %8s %14s %14s %16s %8s\n' policy clients "start RSS MB" "peak RSS MB" \
    "uplink bytes" seconds
for spec in "${POLICIES[@]}"; do
    policy=${spec%%:*}
    density=1
    [ "$spec" != "$policy" ] && density=${spec#*:}
    first=""
    last=""
    for n in $CLIENTS; do
        run "$policy" "$density" "$n"
        read -r cn start_kb peak_kb bytes secs <"$WORK/result"
        printf '%-14s %8s %14.1f %14.1f %16s %8s\n' "$spec" "$cn" "$(awk -v k="$start_kb" 'BEGIN { print k / 1024 }')" \
            "$(awk -v k="$peak_kb" 'BEGIN { print k / 1024 }')" "$bytes" "$secs"
        [ -n "$first" ] || first=$peak_kb
        last=$peak_kb
    done
    ratio=$(awk -v a="$last" -v b="$first" 'BEGIN { printf "%.2f", a / b }')
    verdict="met"
    awk -v r="$ratio" 'BEGIN { exit !(r < 2) }' || { verdict="NOT met"; status=1; }
    echo "$spec: peak($last kB) / peak($first kB) = $ratio (target < 2: $verdict)"
done
exit $status
