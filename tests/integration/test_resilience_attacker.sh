#!/usr/bin/env bash
# One client of five must not poison or halt a federation, under every
# aggregator, through the real coordinator on loopback. Each case is a
# 3-round run (mlp, dense updates, --max-steps 20, the same --seed 1, so the
# honest clients do the same work in every case):
#   baseline         4 honest strata-client processes, no attacker, FedAvg
#                    with the default settings;
#   then 4 honest clients and 1 attacker (driven by curl here), which every
#   round uploads a well-formed update whose values are about 1e30 (finite),
#   under
#   fedavg           plain FedAvg, the default settings;
#   trimmed-mean     --aggregator trimmed-mean --trim-fraction 0.25: trims one
#                    value per coordinate at each end of 5 updates, and of the
#                    4 the rule sees once the screening quarantined the
#                    attacker's (so here it gives the same result as the
#                    median; 0.2 would trim none of 4: plain unweighted mean);
#   median           --aggregator median;
#   fedavg-clip      FedAvg with --clip-norm 0.7: the median L2 norm of the
#                    baseline's 12 honest updates (0.86-0.89 in round 0,
#                    0.68-0.72 in round 1, 0.46-0.48 in round 2), so honest
#                    updates are clipped too; checked: the round-0 median norm
#                    the coordinator logs (of 5 updates, the attacker's the
#                    largest) is above it, so at least 2 honest updates were
#                    clipped there.
# Every case keeps the default norm screening (--screen-factor 10). In each
# attacked case: every round completes (no failed round, no 410 before the
# end), every honest client exits 0, each round's summary lists the attacker
# (and only it) as quarantined for its norm, /metrics counts one quarantined
# update per round (strata_updates_quarantined_total{reason="norm"}), the
# attacker's stored updates are kept, and the final accuracy (round 2's
# summary) is within 0.02 of the baseline's; the baseline gets the same
# checks with no update quarantined. One line per case is printed: aggregator,
# final accuracy, baseline accuracy, quarantined count. Each case takes about
# 2 s (at most 30 s: every wait stops there), the test about 10 s.
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
CLIENT="$BUILD/strata-client"
CHECK="$BUILD/agg_check"
for x in "$SERVER" "$CLIENT" "$CHECK" "$TOOL"; do [ -x "$x" ] || fail "no $x"; done
command -v curl >/dev/null || fail "curl is required"
export OMP_WAIT_POLICY=passive
T_START=$SECONDS
ROUNDS=3
SEED=1
HONEST=4
SECRET=attacker-s3cret
CLIP=0.7        # --clip-norm of the fedavg-clip case: the honest updates' median norm
MARGIN=0.02     # the final accuracy must be within this of the baseline's
CASE_SECONDS=30 # every wait of a case stops at this
C=(curl -sS --max-time 20)

PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
CASE=""
CDIR=""
die() {
    local f
    for f in "$CDIR"/*.out "$CDIR"/*.err "$CDIR"/c*.log; do
        [ -f "$f" ] && { echo "==== $f" && tail -n 15 "$f"; } >&2
    done
    fail "${CASE:+$CASE: }$*"
}

BASELINE=""
# run_case NAME ATTACKER [SERVER OPTIONS...]: one 3-round run with the 4
# honest clients, plus the attacker when ATTACKER is 1. Checks the run as
# described above; sets ACC (the final accuracy), QUARANTINED (the
# quarantined-update count from /metrics) and MEDIANS (the round median
# norms the coordinator logged when it quarantined, space separated).
run_case() {
    CASE=$1
    local attack=$2
    shift 2
    CDIR="$WORK/$CASE"
    mkdir -p "$CDIR"
    local deadline=$((SECONDS + CASE_SECONDS)) nc=$HONEST
    [ "$attack" = 1 ] && nc=$((HONEST + 1))
    "$SERVER" --state-dir "$CDIR/state" --model mlp --data "$DATA" --port 0 --rounds $ROUNDS \
        --min-clients $nc --clients-per-round $nc --policy none --max-steps 20 --seed $SEED \
        --round-deadline 60 --enrolment-secret $SECRET "$@" \
        >"$CDIR/server.out" 2>"$CDIR/server.err" &
    local spid=$!
    PIDS=("$spid")
    wait_listening "$spid" "$CDIR/server.out" "$CDIR/server.err"

    # The attacker registers first, then the honest clients start.
    local body aid="" atoken=""
    if [ "$attack" = 1 ]; then
        body=$("${C[@]}" -f -X POST -H 'Content-Type: application/json' \
            -d "{\"name\":\"attacker\",\"enrolment_secret\":\"$SECRET\"}" "$URL/v1/clients") ||
            die "attacker registration"
        aid=$(json_field "$body" client_id)
        atoken=$(json_field "$body" token)
        [ -n "$aid" ] && [ -n "$atoken" ] || die "attacker registration: $body"
    fi
    local cpid=() i r
    for ((i = 0; i < HONEST; i++)); do
        "$CLIENT" --server "$URL" --state-dir "$CDIR/c$i" --data "$DATA" --partition iid \
            --num-clients $HONEST --client-index "$i" --seed $SEED --threads 1 --poll-wait 5 \
            --name "edge-$i" --enrolment-secret $SECRET >"$CDIR/c$i.log" 2>&1 &
        cpid[i]=$!
        PIDS+=("${cpid[i]}")
    done

    # The attacker: every round, a delta of 1e30 * N(0, 1) trained on nothing.
    local task code mv
    for ((r = 0; attack == 1 && r < ROUNDS; r++)); do
        task=""
        while [ "$SECONDS" -lt "$deadline" ]; do
            task=$("${C[@]}" -H "Authorization: Bearer $atoken" "$URL/v1/tasks/next?wait=5" \
                -w '\n%{http_code}') || die "attacker's task request failed"
            code=${task##*$'\n'}
            task=${task%$'\n'*}
            [ "$code" = 410 ] && die "round $r: the federation ended early: $task"
            [ "$code" = 200 ] && [ "$(json_field "$task" round)" = "$r" ] && break
            kill -0 "$spid" 2>/dev/null || die "the coordinator exited"
        done
        [ "$(json_field "$task" round)" = "$r" ] || die "no task for round $r: $task"
        mv=$(json_field "$task" model_version)
        [ "$mv" = "$r" ] || die "round $r trains model version $mv (a round failed?)"
        if [ "$r" = 0 ]; then
            "${C[@]}" -f -H "Authorization: Bearer $atoken" -o "$CDIR/w0.safetensors" \
                "$URL/v1/models/0" || die "model 0"
        fi
        "$CHECK" delta --like "$CDIR/w0.safetensors" --seed $((r + 7)) --scale 1e30 \
            --out "$CDIR/attack$r.safetensors" || die "attack delta $r"
        "$TOOL" compress --in "$CDIR/attack$r.safetensors" --policy none --density 1 \
            --out "$CDIR/attack$r.bin" --client-id "$aid" --model-version "$mv" --samples 500 \
            --round "$r" --rounds $ROUNDS >/dev/null || die "attack payload $r"
        body=$("${C[@]}" -X POST -H "Authorization: Bearer $atoken" \
            -H 'Content-Type: application/octet-stream' --data-binary @"$CDIR/attack$r.bin" \
            -w ' %{http_code}' "$URL/v1/rounds/$r/updates")
        [ "${body##* }" = 200 ] || die "round $r: the attacker's upload was refused: $body"
    done

    # The run completes: every honest client exits 0 once the coordinator
    # says the federation has finished.
    local rc
    for ((i = 0; i < HONEST; i++)); do
        while kill -0 "${cpid[i]}" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
        kill -0 "${cpid[i]}" 2>/dev/null && die "client $i still running after $CASE_SECONDS s"
        rc=0
        wait "${cpid[i]}" || rc=$?
        [ "$rc" = 0 ] || die "client $i exited with status $rc"
    done
    grep -q "^strata-server: finished $ROUNDS rounds" "$CDIR/server.out" || die "the run did not finish"

    local s loss
    for ((r = 0; r < ROUNDS; r++)); do
        s=$("${C[@]}" -f "$URL/v1/rounds/$r") || die "round $r summary"
        [ "$(json_field "$s" state)" = closed ] || die "round $r: $s"
        [ "$(json_field "$s" participants)" = $nc ] || die "round $r: participants: $s"
        echo "$s" | grep -q '"failed"' && die "round $r failed: $s"
        if [ "$attack" = 1 ]; then
            echo "$s" | grep -q "\"quarantined\":\\[{\"client_id\":$aid,\"reason\":\"norm\",\"norm\":[0-9.e+]*}\\]" ||
                die "round $r: the attacker is not (the only one) quarantined: $s"
        else
            echo "$s" | grep -q '"quarantined"' && die "round $r: an honest update was quarantined: $s"
        fi
        loss=$(json_field "$s" loss)
        ACC=$(json_field "$s" accuracy)
        [ "$loss" != null ] && [ "$ACC" != null ] && [ -n "$ACC" ] || die "round $r: non-finite model: $s"
    done
    local metrics
    metrics=$("${C[@]}" -f "$URL/metrics") || die "metrics"
    m() { printf '%s\n' "$metrics" | sed -n "s/^$1 //p"; }
    QUARANTINED=$(m 'strata_updates_quarantined_total{reason="norm"}')
    [ "$QUARANTINED" = $((attack * ROUNDS)) ] || die "quarantined (norm) counter: $QUARANTINED"
    [ "$(m 'strata_updates_quarantined_total{reason="non_finite"}')" = 0 ] || die "non_finite counter"
    [ "$(m strata_rounds_completed_total)" = $ROUNDS ] || die "rounds completed: $(m strata_rounds_completed_total)"
    [ "$(m strata_rounds_failed_total)" = 0 ] || die "rounds failed: $(m strata_rounds_failed_total)"
    [ "$(m strata_updates_accepted_total)" = $((ROUNDS * nc)) ] || die "updates accepted"
    [ "$(m strata_model_version)" = $ROUNDS ] || die "model version $(m strata_model_version)"
    [ "$(grep -c 'quarantined (norm)' "$CDIR/server.err" || true)" = $((attack * ROUNDS)) ] ||
        die "quarantine log lines"
    MEDIANS=$(sed -n "s/.*quarantined (norm): .* the round's median norm \([0-9.e+-]*\).*/\1/p" \
        "$CDIR/server.err" | tr '\n' ' ')
    if [ "$attack" = 1 ]; then
        grep -q '1 quarantined$' "$CDIR/server.out" || die "no progress line counts the quarantined update"
        # The attacker's stored updates are kept.
        for ((r = 0; r < ROUNDS; r++)); do
            stored_payload "$CDIR/state" "$r" "$aid" "$CDIR/attacker.bin" ||
                die "round $r: the attacker's update is not stored"
        done
    fi
    kill -TERM "$spid"
    wait "$spid" || die "coordinator exit status $?"
    PIDS=()
}

# report NAME AGGREGATOR: the case's line, and its accuracy against the
# baseline's.
report() {
    printf '%-13s aggregator %-24s final accuracy %.4f  baseline %.4f  quarantined %s\n' \
        "$1" "$2" "$ACC" "$BASELINE" "$QUARANTINED"
    awk -v a="$ACC" -v b="$BASELINE" -v m=$MARGIN 'BEGIN { d = a - b; exit !(d <= m && -d <= m) }' ||
        fail "$1: final accuracy $ACC is not within $MARGIN of the baseline's $BASELINE"
}

run_case baseline 0
BASELINE=$ACC
assert_gt "$BASELINE" 0.5 "baseline: final accuracy"
report baseline "fedavg (no attacker)"

run_case fedavg 1
report fedavg "fedavg (defaults)"

run_case trimmed-mean 1 --aggregator trimmed-mean --trim-fraction 0.25
report trimmed-mean "trimmed-mean, trim 0.25"

run_case median 1 --aggregator median
report median "median"

run_case fedavg-clip 1 --clip-norm $CLIP
# Honest updates were clipped too: round 0's median norm (the second largest
# honest one; the attacker's is the largest) is above the bound.
set -- $MEDIANS
[ $# = $ROUNDS ] || fail "fedavg-clip: median norms logged: '$MEDIANS'"
assert_gt "$1" $CLIP "fedavg-clip: round 0's median norm against --clip-norm"
echo "fedavg-clip: the rounds' median norms $MEDIANS (--clip-norm $CLIP)"
report fedavg-clip "fedavg, clip-norm $CLIP"

echo "PASS test_resilience_attacker ($((SECONDS - T_START)) s)"
