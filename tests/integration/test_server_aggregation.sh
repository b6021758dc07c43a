#!/usr/bin/env bash
# Aggregation through a real strata-server equals the aggregate computed
# directly (issue 4, must-show 2). For each case a coordinator on a loopback
# port 0 runs one round with three (or five) clients registered over curl;
# each uploads a different synthetic delta (built by agg_check, compressed by
# strata-tool with the task's policy) with a different sample count; after
# the round closes, model version 1 is downloaded and agg_check verifies
#   w1 == server_step(w0, sum_i n_i * decode(update_i) / sum_i n_i)
# within 1e-6 (max abs error), where server_step is computed by hand: plain
# (w0 + lr * mean) for dense and sparse (top-k) updates, and the first step of
# FedAvgM, FedAdam and FedYogi with their default hyperparameters.
#
# The robust aggregators (--aggregator trimmed-mean|median, --trim-fraction,
# --clip-norm) are checked the same way against agg_check's own
# implementation: each update clipped to L2 norm <= C first, then the
# unweighted coordinate-wise median or trimmed mean (coordinates a sparse
# update did not send count as 0), or the weighted mean of the clipped
# updates for fedavg. In the attack cases one client uploads its delta times
# 1000; agg_check then also requires that the attack moved the coordinator's
# result by at most 1/100 of what it moved the plain weighted mean. Those
# cases turn the norm screening off (--screen-factor 0) to check the rules
# alone; with the default screening (the case dense-fedavg-screened) the
# attacker's update is quarantined, listed in the round summary, and the
# result is exactly the weighted mean of the honest updates.
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
SAMPLES=(100 300 1600 700 40)

# run_case NAME POLICY DENSITY OPT LR [KEY=VALUE...]: one server run, one
# round, one upload per client. Keys: clients=N (3, at most 5), agg=fedavg|
# trimmed-mean|median (fedavg), trim=F (server default 0.1), clip=C (0 = off),
# attacker=I (none): client I uploads its delta scaled by 1000, screen=F
# (server default 10): --screen-factor, quarantine=1: the attacker's update
# must be quarantined and the result is checked without it, values=F
# (fp32): the values format (--values of the server and strata-tool),
# final=X: --server-lr-final X, which in this one-round run is the rate of
# the only step (the check uses X, not LR).
run_case() {
    local name=$1 policy=$2 density=$3 opt=$4 lr=$5
    shift 5
    local n=3 agg=fedavg trim=0.1 clip=0 attacker=-1 screen="" quarantine=0 values=fp32 kv
    local final=""
    for kv in "$@"; do
        case $kv in
        clients=*) n=${kv#*=} ;;
        agg=*) agg=${kv#*=} ;;
        trim=*) trim=${kv#*=} ;;
        clip=*) clip=${kv#*=} ;;
        attacker=*) attacker=${kv#*=} ;;
        screen=*) screen=${kv#*=} ;;
        quarantine=*) quarantine=${kv#*=} ;;
        values=*) values=${kv#*=} ;;
        final=*) final=${kv#*=} ;;
        *) fail "run_case: unknown option $kv" ;;
        esac
    done
    local dir="$WORK/$name" extra=()
    [ "$agg" = fedavg ] || extra+=(--aggregator "$agg" --trim-fraction "$trim")
    [ "$clip" = 0 ] || extra+=(--clip-norm "$clip")
    [ -z "$screen" ] || extra+=(--screen-factor "$screen")
    [ -z "$final" ] || extra+=(--server-lr-final "$final")
    mkdir -p "$dir"
    "$SERVER" --state-dir "$dir/state" --model mlp --data "$DATA" --port 0 --rounds 1 \
        --min-clients "$n" --clients-per-round "$n" --policy "$policy" --density "$density" \
        --server-opt "$opt" --server-lr "$lr" --round-deadline 60 --enrolment-secret agg-s3cret \
        --values "$values" \
        "${extra[@]}" >"$dir/server.out" 2>"$dir/server.err" &
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
    for ((i = 0; i < n; i++)); do
        body=$("${C[@]}" -f -X POST -H 'Content-Type: application/json' \
            -d "{\"name\":\"agg-$i\",\"enrolment_secret\":\"agg-s3cret\"}" "$url/v1/clients") || fail "$name: register $i"
        ids[i]=$(json_field "$body" client_id)
        tokens[i]=$(json_field "$body" token)
    done
    local task round mv scale payloads=()
    for ((i = 0; i < n; i++)); do
        task=$("${C[@]}" -f -H "Authorization: Bearer ${tokens[i]}" \
            "$url/v1/tasks/next?wait=10") || fail "$name: task for client $i"
        round=$(json_field "$task" round)
        mv=$(json_field "$task" model_version)
        [ "$round" = 0 ] && [ "$mv" = 0 ] || fail "$name: task $task"
        # The compressed layers use the policy's compressor (topk for
        # uniform) in the values format asked for.
        local comp=${policy%%:*}
        [ "$comp" = uniform ] && comp=topk
        if [ "$policy" = none ]; then
            echo "$task" | grep -q '"compressor":"topk"' && fail "$name: sparse budgets: $task"
        else
            echo "$task" | grep -q "\"compressor\":\"$comp\"" || fail "$name: no $comp budget: $task"
        fi
        case $comp in topk | randk | none | powersgd)
            echo "$task" | grep -q "\"values\":\"$values\"" || fail "$name: no $values values: $task" ;;
        esac
        if [ "$i" = 0 ]; then
            "${C[@]}" -f -H "Authorization: Bearer ${tokens[i]}" -o "$dir/w0.safetensors" \
                "$url/v1/models/0" || fail "$name: model 0"
        fi
        # Client i's honest delta is (i + 1) * 0.01 * N(0, 1) (seed i + 11);
        # the attacker uploads the same delta times 1000 and agg_check gets
        # the honest one too, to measure how far the attack moved the result.
        local kinds=(up) k
        [ "$i" = "$attacker" ] && kinds=(up honest)
        for k in "${kinds[@]}"; do
            scale="0.0$((i + 1))"
            [ "$k" = up ] && [ "$i" = "$attacker" ] && scale="$((i + 1))0"
            "$CHECK" delta --like "$dir/w0.safetensors" --seed $((i + 11)) \
                --scale "$scale" --out "$dir/delta$i.$k.safetensors" || fail "$name: delta $i"
            "$TOOL" compress --in "$dir/delta$i.$k.safetensors" --policy "$policy" \
                --density "$density" --round 0 --rounds 1 --out "$dir/$k$i.bin" \
                --client-id "${ids[i]}" --model-version "$mv" --samples "${SAMPLES[i]}" \
                --values "$values" \
                >/dev/null || fail "$name: compress $i"
        done
        payloads[i]="$dir/up$i.bin"
    done
    for ((i = 0; i < n; i++)); do
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
    [ "$(json_field "$body" participants)" = "$n" ] || fail "$name: round 0: $body"
    if [ "$quarantine" = 1 ]; then
        echo "$body" | grep -q "\"quarantined\":\[{\"client_id\":${ids[attacker]},\"reason\":\"norm\"" ||
            fail "$name: the attacker's update is not quarantined: $body"
    else
        echo "$body" | grep -q '"quarantined"' && fail "$name: quarantined updates: $body"
    fi
    "${C[@]}" -f -H "Authorization: Bearer ${tokens[0]}" -o "$dir/w1.safetensors" \
        "$url/v1/models/1" || fail "$name: model 1"
    # With a schedule the progress line names the rate of the step.
    if [ -n "$final" ]; then
        grep -q "^round 0/1: .*, server lr $final\$" "$dir/server.out" ||
            fail "$name: no 'server lr $final' in the progress line: $(cat "$dir/server.out")"
    else
        grep -q "server lr" "$dir/server.out" && fail "$name: server lr without a schedule"
    fi
    kill -TERM "$SPID"
    wait "$SPID" || fail "$name: server exit status $?: $(tail -n 5 "$dir/server.err")"
    SPID=""

    local out rule=$agg check=() used=() samples=()
    [ "$agg" = fedavg ] && rule=mean
    check=(--rule "$rule" --trim "$trim" --clip "$clip")
    for ((i = 0; i < n; i++)); do
        # A quarantined update is left out of the aggregate.
        [ "$quarantine" = 1 ] && [ "$i" = "$attacker" ] && continue
        used+=("${payloads[i]}")
        samples+=("${SAMPLES[i]}")
    done
    [ "$attacker" -ge 0 ] && [ "$quarantine" = 0 ] &&
        check+=(--attacker "$attacker" --honest "$dir/honest$attacker.bin")
    if ! out=$("$CHECK" verify --w0 "$dir/w0.safetensors" --w1 "$dir/w1.safetensors" \
        --opt "$opt" --lr "${final:-$lr}" --tol 1e-6 "${check[@]}" "${used[@]}"); then
        fail "$name: aggregate differs from the $rule computed directly: $out"
    fi
    echo "$name: $out"
    local weights
    weights=$(IFS=,; echo "${samples[*]}")
    echo "$out" | grep -qF "\"weights\":[$weights]" || fail "$name: sample counts $out"
    local sparse
    sparse=$(json_field "$out" sparse_layers)
    if [ "$policy" = none ]; then
        [ "$sparse" = 0 ] || fail "$name: dense run with sparse layers: $out"
    elif [ "$policy" = uniform ]; then
        [ "$sparse" -gt 0 ] || fail "$name: sparse run without top-k layers: $out"
    fi
}

run_case dense-plain none 1 plain 1
run_case sparse-plain uniform 0.05 plain 1
run_case sparse-fedavgm uniform 0.05 fedavgm 0.5
run_case dense-fedadam none 1 fedadam 0.1
# --server-lr-final: a one-round run's only step is the last, at the final rate.
run_case sparse-fedavgm-lr-final uniform 0.05 fedavgm 4 final=0.5
run_case sparse-fedyogi uniform 0.05 fedyogi 0.1
# Every compressor and values format (issue: budgets that adapt).
run_case topk-fp16 uniform 0.05 plain 1 values=fp16
run_case topk-bf16 uniform 0.05 plain 1 values=bf16
run_case topk-int8 uniform 0.05 plain 1 values=int8
run_case topk-ternary uniform 0.05 plain 1 values=ternary
run_case randk-fp32 randk 0.05 plain 1
run_case randk-int8 randk 0.05 plain 1 values=int8
run_case qsgd qsgd:4 1 plain 1
run_case sign sign 1 plain 1
run_case powersgd powersgd:2 1 plain 1
run_case powersgd-fp16 powersgd:2 1 plain 1 values=fp16
run_case dense-fp16 fp16 1 plain 1
run_case dense-bf16 bf16 1 plain 1
# Robust aggregation (--aggregator, --trim-fraction, --clip-norm): unweighted
# coordinate-wise rules, clipping before the rule.
run_case dense-median none 1 plain 1 agg=median
run_case sparse-trimmed-5 uniform 0.05 plain 1 clients=5 agg=trimmed-mean trim=0.2 clip=6
run_case dense-fedavg-clip-attack none 1 plain 1 clip=11 attacker=1 screen=0
run_case dense-median-attack none 1 plain 1 agg=median attacker=2 screen=0
run_case sparse-median-attack uniform 0.05 plain 1 agg=median attacker=2 screen=0
# Norm screening (default --screen-factor 10): the attacker's update is
# quarantined and the result is the honest clients' weighted mean.
run_case dense-fedavg-screened none 1 plain 1 attacker=1 quarantine=1
run_case sparse-median-screened uniform 0.05 plain 1 clients=5 agg=median attacker=3 quarantine=1
echo "PASS test_server_aggregation"
