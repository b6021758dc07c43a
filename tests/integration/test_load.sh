#!/usr/bin/env bash
# Concurrency smoke test of the coordinator: 64 synthetic clients (bench_load:
# one event loop with one keep-alive connection per client, real payloads matching each
# task) upload in 2 rounds against a real strata-server on port 0. Every
# upload must be acknowledged without an error, /metrics must count exactly
# 128 accepted updates and each round exactly 64 participants.
# STRATA_SERVER_BIN overrides the coordinator binary (e.g. a ThreadSanitizer
# build); it defaults to BUILD/strata-server.
. "$(dirname "$0")/lib.sh"
SERVER=${STRATA_SERVER_BIN:-$BUILD/strata-server}
BENCH="$BUILD/bench_load"
CLIENTS=64
ROUNDS=2
SECRET=load-test-secret
[ -x "$SERVER" ] || fail "no $SERVER"
[ -x "$BENCH" ] || fail "no $BENCH"
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

OMP_WAIT_POLICY=passive "$SERVER" --state-dir "$WORK/state" --model mlp --data "$DATA" --port 0 \
    --rounds "$ROUNDS" --min-clients "$CLIENTS" --round-deadline 120 --policy uniform \
    --density 0.01 --enrolment-secret "$SECRET" --threads 2 \
    >"$WORK/server.out" 2>"$WORK/server.err" &
SPID=$!
wait_listening "$SPID" "$WORK/server.out" "$WORK/server.err"

set +e
timeout 50 "$BENCH" --server "$URL" --clients "$CLIENTS" --rounds "$ROUNDS" --secret "$SECRET" \
    --timeout 45 --json >"$WORK/bench.out" 2>"$WORK/bench.err"
rc=$?
set -e
cat "$WORK/bench.out"
SUMMARY=$(tail -n 1 "$WORK/bench.out")
[ "$rc" -eq 0 ] || fail "bench_load exit $rc: $(tail -n 20 "$WORK/bench.err")"
[ "$(json_field "$SUMMARY" errors)" = 0 ] || fail "errors: $SUMMARY"
[ "$(json_field "$SUMMARY" uploads)" = $((CLIENTS * ROUNDS)) ] || fail "uploads: $SUMMARY"
[ "$(json_field "$SUMMARY" duplicates)" = 0 ] || fail "duplicates: $SUMMARY"

C=(curl -sS --max-time 10)
# The last round closes (aggregation, evaluation) after its last upload.
last=$((ROUNDS - 1))
state=""
for _ in $(seq 1 200); do
    body=$("${C[@]}" "$URL/v1/rounds/$last") || true
    state=$(json_field "$body" state)
    [ "$state" = closed ] && break
    sleep 0.1
done
[ "$state" = closed ] || fail "round $last did not close: $body"
for r in $(seq 0 "$last"); do
    body=$("${C[@]}" -f "$URL/v1/rounds/$r") || fail "GET /v1/rounds/$r"
    [ "$(json_field "$body" participants)" = "$CLIENTS" ] || fail "round $r: $body"
    [ "$(json_field "$body" state)" = closed ] || fail "round $r not closed: $body"
done
metrics=$("${C[@]}" -f "$URL/metrics") || fail "GET /metrics"
accepted=$(printf '%s\n' "$metrics" | sed -n 's/^strata_updates_accepted_total //p')
[ "$accepted" = $((CLIENTS * ROUNDS)) ] || fail "strata_updates_accepted_total '$accepted'"
stored=$(stored_count "$WORK/state")
[ "$stored" -eq $((CLIENTS * ROUNDS)) ] || fail "$stored payloads stored"

kill -TERM "$SPID"
wait "$SPID" || fail "server exit status $?"
SPID=""
echo "PASS: $CLIENTS clients x $ROUNDS rounds, 0 errors, $accepted updates accepted"
