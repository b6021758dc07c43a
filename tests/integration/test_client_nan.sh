#!/usr/bin/env bash
# A client whose local update is not finite (here: training diverges under a
# learning rate of 1e6) tells the coordinator it cannot contribute
# (POST /v1/rounds/{round}/skip), starts its residuals afresh and goes on:
# every round closes at once as failed (too_few_updates, the model
# unchanged) instead of waiting for its 120 s deadline, and the run ends
# with every client exiting 0. (That a skipping client contributes again to
# the next round is checked in unit.test_server_round.)
source "$(dirname "$0")/lib.sh"

SPID="" CPIDS=""
cleanup() {
    for p in $CPIDS $SPID; do
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
ROUNDS=2
"$BUILD/strata-server" --state-dir "$WORK/state" --model mlp --data "$DATA" --port 0 \
    --rounds "$ROUNDS" --min-clients 2 --round-deadline 120 --lr 1000000 --max-steps 20 \
    --enrolment-secret nan-s3cret >"$WORK/server.out" 2>"$WORK/server.err" &
SPID=$!
wait_listening "$SPID" "$WORK/server.out" "$WORK/server.err"
START=$SECONDS
for i in 0 1; do
    "$BUILD/strata-client" --server "$URL" --state-dir "$WORK/c$i" --data "$DATA" \
        --num-clients 2 --client-index "$i" --enrolment-secret nan-s3cret --poll-wait 1 \
        >"$WORK/c$i.log" 2>&1 &
    CPIDS="$CPIDS $!"
done
for p in $CPIDS; do
    wait "$p" || { cat "$WORK"/c*.log >&2; fail "a client exited with status $?"; }
done
CPIDS=""
ELAPSED=$((SECONDS - START))
[ "$ELAPSED" -lt 100 ] || fail "the run took ${ELAPSED} s: rounds waited for their deadline"
for i in 0 1; do
    grep -q "round 0: the local update is not finite" "$WORK/c$i.log" ||
        fail "client $i did not notice its update: $(tail -n 5 "$WORK/c$i.log")"
    grep -q "the federation has finished" "$WORK/c$i.log" || fail "client $i did not finish"
    [ ! -e "$WORK/c$i/residual.safetensors" ] || fail "client $i kept residuals"
done
C=(curl -sS --max-time 10)
m=$("${C[@]}" "$URL/metrics")
[ "$(echo "$m" | awk '$1 == "strata_updates_skipped_total" { print $2 }')" = $((2 * ROUNDS)) ] ||
    fail "skips: $(echo "$m" | grep skipped)"
[ "$(echo "$m" | awk '$1 == "strata_rounds_failed_total" { print $2 }')" = "$ROUNDS" ] ||
    fail "failed rounds: $(echo "$m" | grep failed)"
body=$("${C[@]}" "$URL/v1/rounds/0")
[ "$(json_field "$body" failed)" = too_few_updates ] || fail "round 0: $body"
[ "$(json_field "$("${C[@]}" "$URL/v1/status")" model_version)" = 0 ] || fail "the model moved"

# The simulator's report of this state: no round was evaluated, so no
# accuracy anywhere (not a 0 that a study would average in).
kill -TERM "$SPID"
wait "$SPID" || fail "server exit status $? after SIGTERM"
SPID=""
"$BUILD/strata-sim" --report-from "$WORK/state" --out "$WORK/report" --rounds "$ROUNDS" \
    --json >"$WORK/report.out" 2>"$WORK/report.err" || fail "report: $(cat "$WORK/report.err")"
[ "$(json_field "$(tail -n 1 "$WORK/report.out")" final_accuracy)" = null ] ||
    fail "final accuracy of a run never evaluated: $(tail -n 1 "$WORK/report.out")"
[ "$(awk -F, 'NR > 1 && $3 == "" && $4 == ""' "$WORK/report/report.csv" | wc -l)" = "$ROUNDS" ] ||
    fail "report.csv should leave accuracy and loss empty: $(cat "$WORK/report/report.csv")"
grep -q "^$ROUNDS rounds (–) had no evaluation" "$WORK/report/report.md" ||
    fail "report.md does not say the rounds were not evaluated"
grep -q "final accuracy none" "$WORK/report/report.md" || fail "report.md: final accuracy"
grep -q "clients (all per round), $ROUNDS rounds" "$WORK/report/report.md" &&
    ! grep -q "(null)" "$WORK/report/report.md" || fail "report.md header: $(sed -n 3p "$WORK/report/report.md")"
echo "PASS: clients with non-finite updates skip (${ELAPSED} s)"
