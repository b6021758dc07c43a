#!/usr/bin/env bash
# A client killed while its upload is in flight (staged, not yet answered)
# re-sends the staged update at its next start: the coordinator counts it
# once, the client records its receipt and installs the residual of that
# round, and the run completes.
source "$(dirname "$0")/lib.sh"

SPID="" CPID=""
cleanup() {
    for p in $CPID $SPID; do
        kill -CONT "$p" 2>/dev/null || true
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

wait_for() { # seconds command...
    local limit=$1
    shift
    for _ in $(seq 1 $((limit * 10))); do
        if "$@"; then return 0; fi
        sleep 0.1
    done
    return 1
}

export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
"$BUILD/strata-server" --state-dir "$WORK/state" --model mlp --data "$DATA" --port 0 --rounds 2 \
    --min-clients 1 --clients-per-round 1 --policy uniform --density 0.05 \
    --enrolment-secret pending-s3cret >"$WORK/server.out" 2>"$WORK/server.err" &
SPID=$!
wait_for 60 grep -q "listening on" "$WORK/server.out" || fail "coordinator did not start"
URL=$(head -n 1 "$WORK/server.out" | sed -n 's/^strata-server: listening on //p')

start_client() {
    "$BUILD/strata-client" --server "$URL" --state-dir "$WORK/client" --data "$DATA" \
        --enrolment-secret pending-s3cret --poll-wait 1 >>"$WORK/client.log" 2>&1 &
    CPID=$!
}
start_client
# Freeze the coordinator once the client holds the round-0 model (it caches
# it before training on all 60,000 images, which takes a second or more): its
# upload then hangs with the update staged.
wait_for 60 test -e "$WORK/client/model.safetensors" || fail "client did not get the model"
kill -STOP "$SPID"
wait_for 60 test -e "$WORK/client/pending.json" || fail "no staged upload"
kill -KILL "$CPID"
wait "$CPID" 2>/dev/null || true
CPID=""
[ ! -e "$WORK/client/residual.safetensors" ] || fail "residual installed before the answer"
kill -CONT "$SPID"

start_client
wait_for 120 grep -q "the federation has finished" "$WORK/client.log" ||
    { cat "$WORK/client.log" >&2; fail "the run did not complete"; }
wait "$CPID" || fail "client exit status"
CPID=""
grep -q "re-sending the staged update of round 0" "$WORK/client.log" || fail "staged update not re-sent"
[ "$(cut -d' ' -f1 "$WORK/client/receipts.log" | tr '\n' ' ')" = "0 1 " ] ||
    fail "receipts: $(cat "$WORK/client/receipts.log")"
[ ! -e "$WORK/client/pending.json" ] || fail "stage left behind"
for r in 0 1; do
    s=$(curl -sf --max-time 5 "$URL/v1/rounds/$r")
    [ "$(json_field "$s" participants)" = 1 ] || fail "round $r: $s"
done
m=$(curl -sf --max-time 5 "$URL/metrics")
grep -q '^strata_updates_accepted_total 2$' <<<"$m" || fail "accepted counter: $(printf '%s\n' "$m" | grep accepted)"
echo "PASS: staged upload survives a client kill"

# A coordinator whose state was reset no longer knows the client's token: the
# client registers again, drops that run's residuals and receipts, and takes
# part in the new run.
PORT=${URL##*:}
kill -TERM "$SPID"
wait "$SPID" 2>/dev/null || true
SPID=""
"$BUILD/strata-server" --state-dir "$WORK/state2" --model mlp --data "$DATA" --port "$PORT" \
    --rounds 1 --min-clients 1 --clients-per-round 1 --policy uniform --density 0.05 \
    --enrolment-secret pending-s3cret >"$WORK/server2.out" 2>"$WORK/server2.err" &
SPID=$!
wait_for 60 grep -q "listening on" "$WORK/server2.out" || fail "second coordinator did not start"
: >"$WORK/client.log"
start_client
wait_for 120 grep -q "the federation has finished" "$WORK/client.log" ||
    { cat "$WORK/client.log" >&2; fail "the client did not join the new run"; }
wait "$CPID" || fail "client exit status in the new run"
CPID=""
grep -q "registering again" "$WORK/client.log" || fail "no re-registration"
[ "$(cut -d' ' -f1 "$WORK/client/receipts.log" | tr '\n' ' ')" = "0 " ] ||
    fail "receipts of the new run: $(cat "$WORK/client/receipts.log")"
[ -s "$WORK/client/receipts.log.old" ] || fail "the old run's receipts were not kept aside"
echo "PASS: a client rejoins a coordinator whose state was reset"
