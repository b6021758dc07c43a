#!/usr/bin/env bash
# Aggregation through a real strata-server equals the sample-weighted mean
# computed directly (issue 4, must-show 2). For each case a coordinator on a
# loopback port 0 runs one round with three clients registered over curl;
# each uploads a different synthetic delta (built by agg_check, compressed by
# strata-tool with the task's policy) with a different sample count; after
# the round closes, model version 1 is downloaded and agg_check verifies
#   w1 == server_step(w0, sum_i n_i * decode(update_i) / sum_i n_i)
# within 1e-6 (max abs error), where server_step is computed by hand: plain
# (w0 + lr * mean) for dense and sparse (top-k) updates, and the first step of
# FedAvgM, FedAdam and FedYogi with their default hyperparameters.
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
CHECK="$BUILD/agg_check"
[ -x "$SERVER" ] || fail "no $SERVER"
[ -x "$CHECK" ] || fail "no $CHECK"
command -v curl >/dev/null || fail "curl is required"

SPID=""
cleanup() {
    if [ -n "$SPID" ]; then
        kill "$SPID" 2>/dev/null || true
        wait "$SPID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

C=(curl -sS --max-time 20)
SAMPLES=(100 300 1600)

# run_case NAME POLICY DENSITY OPT LR: one server run, one round, 3 uploads.
run_case() {
    local name=$1 policy=$2 density=$3 opt=$4 lr=$5
    local dir="$WORK/$name"
    mkdir -p "$dir"
    "$SERVER" --state-dir "$dir/state" --model mlp --data "$DATA" --port 0 --rounds 1 \
        --min-clients 3 --clients-per-round 3 --policy "$policy" --density "$density" \
        --server-opt "$opt" --server-lr "$lr" --round-deadline 60 --enrolment-secret agg-s3cret \
        >"$dir/server.out" 2>"$dir/server.err" &
    SPID=$!
    for _ in $(seq 1 200); do
        grep -q "listening on" "$dir/server.out" 2>/dev/null && break
        kill -0 "$SPID" 2>/dev/null || fail "$name: server exited: $(cat "$dir/server.err")"
        sleep 0.1
    done
    local url
    url=$(head -n 1 "$dir/server.out" | sed -n 's/^strata-server: listening on //p')
    [ -n "$url" ] || fail "$name: no listening line"

    local ids=() tokens=() i body
    for i in 0 1 2; do
        body=$("${C[@]}" -f -X POST -H 'Content-Type: application/json' \
            -d "{\"name\":\"agg-$i\",\"enrolment_secret\":\"agg-s3cret\"}" "$url/v1/clients") || fail "$name: register $i"
        ids[i]=$(json_field "$body" client_id)
        tokens[i]=$(json_field "$body" token)
    done
    local task round mv payloads=()
    for i in 0 1 2; do
        task=$("${C[@]}" -f -H "Authorization: Bearer ${tokens[i]}" \
            "$url/v1/tasks/next?wait=10") || fail "$name: task for client $i"
        round=$(json_field "$task" round)
        mv=$(json_field "$task" model_version)
        [ "$round" = 0 ] && [ "$mv" = 0 ] || fail "$name: task $task"
        if [ "$policy" = none ]; then
            echo "$task" | grep -q '"compressor":"topk"' && fail "$name: sparse budgets: $task"
        else
            echo "$task" | grep -q '"compressor":"topk"' || fail "$name: no topk budget: $task"
        fi
        if [ "$i" = 0 ]; then
            "${C[@]}" -f -H "Authorization: Bearer ${tokens[i]}" -o "$dir/w0.safetensors" \
                "$url/v1/models/0" || fail "$name: model 0"
        fi
        "$CHECK" delta --like "$dir/w0.safetensors" --seed $((i + 11)) \
            --scale "0.0$((i + 1))" --out "$dir/delta$i.safetensors" || fail "$name: delta $i"
        "$TOOL" compress --in "$dir/delta$i.safetensors" --policy "$policy" --density "$density" \
            --round 0 --rounds 1 --out "$dir/up$i.bin" --client-id "${ids[i]}" \
            --model-version "$mv" --samples "${SAMPLES[i]}" >/dev/null ||
            fail "$name: compress $i"
        payloads[i]="$dir/up$i.bin"
    done
    for i in 0 1 2; do
        body=$("${C[@]}" -X POST -H "Authorization: Bearer ${tokens[i]}" \
            -H 'Content-Type: application/octet-stream' --data-binary @"${payloads[i]}" \
            -w ' %{http_code}' "$url/v1/rounds/0/updates")
        [ "${body##* }" = 200 ] || fail "$name: upload $i: $body"
    done
    local state=""
    for _ in $(seq 1 150); do
        body=$("${C[@]}" "$url/v1/rounds/0") || true
        state=$(json_field "$body" state)
        [ "$state" = closed ] && break
        sleep 0.2
    done
    [ "$state" = closed ] || fail "$name: round 0 did not close: $body"
    [ "$(json_field "$body" participants)" = 3 ] || fail "$name: round 0: $body"
    "${C[@]}" -f -H "Authorization: Bearer ${tokens[0]}" -o "$dir/w1.safetensors" \
        "$url/v1/models/1" || fail "$name: model 1"
    kill -TERM "$SPID"
    wait "$SPID" || fail "$name: server exit status $?: $(tail -n 5 "$dir/server.err")"
    SPID=""

    local out
    if ! out=$("$CHECK" verify --w0 "$dir/w0.safetensors" --w1 "$dir/w1.safetensors" \
        --opt "$opt" --lr "$lr" --tol 1e-6 "${payloads[@]}"); then
        fail "$name: aggregate differs from the weighted mean: $out"
    fi
    echo "$name: $out"
    echo "$out" | grep -qF "\"weights\":[${SAMPLES[0]},${SAMPLES[1]},${SAMPLES[2]}]" ||
        fail "$name: sample counts $out"
    local sparse
    sparse=$(json_field "$out" sparse_layers)
    if [ "$policy" = none ]; then
        [ "$sparse" = 0 ] || fail "$name: dense run with sparse layers: $out"
    else
        [ "$sparse" -gt 0 ] || fail "$name: sparse run without top-k layers: $out"
    fi
}

run_case dense-plain none 1 plain 1
run_case sparse-plain uniform 0.05 plain 1
run_case sparse-fedavgm uniform 0.05 fedavgm 0.5
run_case dense-fedadam none 1 fedadam 0.1
run_case sparse-fedyogi uniform 0.05 fedyogi 0.1
echo "PASS test_server_aggregation"
