#!/usr/bin/env bash
# One client must not poison or halt a federation, through the real
# coordinator on loopback: 4 honest strata-client processes and 1 attacker
# (driven by curl here) in a 3-round run (mlp, dense updates). Every round
# the attacker uploads a well-formed update whose values are about 1e30
# (finite). With the default norm screening (--screen-factor 10) the
# coordinator quarantines it every round: the run completes all rounds with a
# finite model (no failed round, no 410 before the end), each round's summary
# lists the attacker as quarantined for its norm, /metrics counts the
# quarantined updates, and the honest clients finish with exit status 0.
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
CLIENT="$BUILD/strata-client"
CHECK="$BUILD/agg_check"
for x in "$SERVER" "$CLIENT" "$CHECK" "$TOOL"; do [ -x "$x" ] || fail "no $x"; done
command -v curl >/dev/null || fail "curl is required"
export OMP_WAIT_POLICY=passive
T_START=$SECONDS
DEADLINE=$((SECONDS + 55)) # every wait below also stops here
ROUNDS=3
NC=5 # 4 honest clients and the attacker
SECRET=attacker-s3cret

PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
die() {
    local f
    for f in "$WORK"/*.out "$WORK"/*.err "$WORK"/c*.log; do
        [ -f "$f" ] && { echo "==== $f" && tail -n 15 "$f"; } >&2
    done
    fail "$*"
}

"$SERVER" --state-dir "$WORK/state" --model mlp --data "$DATA" --port 0 --rounds $ROUNDS \
    --min-clients $NC --clients-per-round $NC --policy none --max-steps 20 \
    --round-deadline 60 --enrolment-secret $SECRET >"$WORK/server.out" 2>"$WORK/server.err" &
SPID=$!
PIDS+=("$SPID")
wait_listening "$SPID" "$WORK/server.out" "$WORK/server.err"
C=(curl -sS --max-time 20)

# The attacker registers first, then the honest clients start.
body=$("${C[@]}" -f -X POST -H 'Content-Type: application/json' \
    -d "{\"name\":\"attacker\",\"enrolment_secret\":\"$SECRET\"}" "$URL/v1/clients") ||
    die "attacker registration"
AID=$(json_field "$body" client_id)
ATOKEN=$(json_field "$body" token)
[ -n "$AID" ] && [ -n "$ATOKEN" ] || die "attacker registration: $body"
CPID=()
for i in 0 1 2 3; do
    "$CLIENT" --server "$URL" --state-dir "$WORK/c$i" --data "$DATA" --partition iid \
        --num-clients 4 --client-index "$i" --threads 1 --poll-wait 5 --name "edge-$i" \
        --enrolment-secret $SECRET >"$WORK/c$i.log" 2>&1 &
    CPID[i]=$!
    PIDS+=("${CPID[i]}")
done

# The attacker: every round, a delta of 1e30 * N(0, 1) trained on nothing.
for ((r = 0; r < ROUNDS; r++)); do
    task=""
    while [ "$SECONDS" -lt "$DEADLINE" ]; do
        task=$("${C[@]}" -H "Authorization: Bearer $ATOKEN" "$URL/v1/tasks/next?wait=5" \
            -w '\n%{http_code}') || die "attacker's task request failed"
        code=${task##*$'\n'}
        task=${task%$'\n'*}
        [ "$code" = 410 ] && die "round $r: the federation ended early: $task"
        [ "$code" = 200 ] && [ "$(json_field "$task" round)" = "$r" ] && break
        kill -0 "$SPID" 2>/dev/null || die "the coordinator exited"
    done
    [ "$(json_field "$task" round)" = "$r" ] || die "no task for round $r: $task"
    mv=$(json_field "$task" model_version)
    [ "$mv" = "$r" ] || die "round $r trains model version $mv (a round failed?)"
    if [ "$r" = 0 ]; then
        "${C[@]}" -f -H "Authorization: Bearer $ATOKEN" -o "$WORK/w0.safetensors" \
            "$URL/v1/models/0" || die "model 0"
    fi
    "$CHECK" delta --like "$WORK/w0.safetensors" --seed $((r + 7)) --scale 1e30 \
        --out "$WORK/attack$r.safetensors" || die "attack delta $r"
    "$TOOL" compress --in "$WORK/attack$r.safetensors" --policy none --density 1 \
        --out "$WORK/attack$r.bin" --client-id "$AID" --model-version "$mv" --samples 500 \
        --round "$r" --rounds $ROUNDS >/dev/null || die "attack payload $r"
    body=$("${C[@]}" -X POST -H "Authorization: Bearer $ATOKEN" \
        -H 'Content-Type: application/octet-stream' --data-binary @"$WORK/attack$r.bin" \
        -w ' %{http_code}' "$URL/v1/rounds/$r/updates")
    [ "${body##* }" = 200 ] || die "round $r: the attacker's upload was refused: $body"
done

# The run completes: every honest client exits 0 once the coordinator says
# the federation has finished.
for i in 0 1 2 3; do
    while kill -0 "${CPID[i]}" 2>/dev/null && [ "$SECONDS" -lt "$DEADLINE" ]; do sleep 0.2; done
    kill -0 "${CPID[i]}" 2>/dev/null && die "client $i still running after the deadline"
    rc=0
    wait "${CPID[i]}" || rc=$?
    [ "$rc" = 0 ] || die "client $i exited with status $rc"
done
grep -q "^strata-server: finished $ROUNDS rounds" "$WORK/server.out" || die "the run did not finish"

for ((r = 0; r < ROUNDS; r++)); do
    s=$("${C[@]}" -f "$URL/v1/rounds/$r") || die "round $r summary"
    [ "$(json_field "$s" state)" = closed ] || die "round $r: $s"
    [ "$(json_field "$s" participants)" = $NC ] || die "round $r: participants: $s"
    echo "$s" | grep -q '"failed"' && die "round $r failed: $s"
    echo "$s" | grep -q "\"quarantined\":\\[{\"client_id\":$AID,\"reason\":\"norm\",\"norm\":[0-9.e+]*}\\]" ||
        die "round $r: the attacker is not (the only one) quarantined: $s"
    loss=$(json_field "$s" loss)
    acc=$(json_field "$s" accuracy)
    [ "$loss" != null ] && [ "$acc" != null ] || die "round $r: non-finite model: $s"
    assert_gt "$acc" 0.3 "round $r: accuracy with the attacker quarantined"
    echo "round $r: accuracy $acc, loss $loss, quarantined client $AID"
done
metrics=$("${C[@]}" -f "$URL/metrics") || die "metrics"
m() { printf '%s\n' "$metrics" | sed -n "s/^$1 //p"; }
[ "$(m 'strata_updates_quarantined_total{reason="norm"}')" = $ROUNDS ] ||
    die "quarantined (norm) counter: $(m 'strata_updates_quarantined_total{reason="norm"}')"
[ "$(m 'strata_updates_quarantined_total{reason="non_finite"}')" = 0 ] || die "non_finite counter"
[ "$(m strata_rounds_completed_total)" = $ROUNDS ] || die "rounds completed: $(m strata_rounds_completed_total)"
[ "$(m strata_rounds_failed_total)" = 0 ] || die "rounds failed"
[ "$(m strata_updates_accepted_total)" = $((ROUNDS * NC)) ] || die "updates accepted"
[ "$(m strata_model_version)" = $ROUNDS ] || die "model version $(m strata_model_version)"
[ "$(grep -c 'quarantined (norm)' "$WORK/server.err")" = $ROUNDS ] || die "quarantine log lines"
grep -q '1 quarantined$' "$WORK/server.out" || die "no progress line counts the quarantined update"
# The attacker's stored updates are kept.
for ((r = 0; r < ROUNDS; r++)); do
    [ -s "$WORK/state/updates/$r/$AID.bin" ] || die "round $r: the attacker's update is not stored"
done
kill -TERM "$SPID"
wait "$SPID" || die "coordinator exit status $?"
PIDS=()
echo "PASS test_resilience_attacker ($((SECONDS - T_START)) s)"
