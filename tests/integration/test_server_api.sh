#!/usr/bin/env bash
# strata-server's REST API against a real server process on port 0: every
# endpoint, the error statuses, and one full round with a real payload.
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
FORGE="$BUILD/payload_forge"
[ -x "$SERVER" ] || fail "no $SERVER"
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

# Config file + overrides; unknown keys are start-up errors (exit 2).
echo '{"min_clients": 1, "bogus_key": 3}' >"$WORK/bad.json"
set +e
"$SERVER" --state-dir "$WORK/s0" --model mlp --data "$DATA" --config "$WORK/bad.json" \
    2>"$WORK/bad.err"
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "unknown config key: exit $rc, expected 2"
grep -q bogus_key "$WORK/bad.err" || fail "the error does not name the key"

# A start that fails (bad data set, bad model) leaves nothing behind: no
# state directory it made, nothing new in one the operator made.
for args in "--data $WORK/no-such-data --model mlp" "--data $DATA --model no-such-model"; do
    # shellcheck disable=SC2086
    if "$SERVER" --state-dir "$WORK/failed" $args --enrolment-secret s3cret \
        >/dev/null 2>"$WORK/failed.err"; then
        fail "start with $args succeeded"
    fi
    [ ! -e "$WORK/failed" ] || fail "a failed start ($args) left $(ls -A "$WORK/failed")"
    mkdir "$WORK/failed"
    # shellcheck disable=SC2086
    "$SERVER" --state-dir "$WORK/failed" $args --enrolment-secret s3cret >/dev/null 2>&1 &&
        fail "start with $args succeeded"
    [ -z "$(ls -A "$WORK/failed")" ] || fail "a failed start ($args) left $(ls -A "$WORK/failed")"
    rmdir "$WORK/failed"
done

cat >"$WORK/cfg.json" <<'JSON'
{"min_clients": 1, "clients_per_round": 1, "rounds": 3, "round_deadline": 30,
 "policy": "uniform", "density": 0.05, "enrolment_secret": "s3cret", "eval_samples": 400}
JSON
# The state directory is made by the operator under a permissive umask; the
# coordinator's files in it must still be private (checked at the end).
umask 022
mkdir "$WORK/state"
"$SERVER" --config "$WORK/cfg.json" --state-dir "$WORK/state" --model mlp --data "$DATA" \
    --port 0 --rounds 2 >"$WORK/server.out" 2>"$WORK/server.err" &
SPID=$!
wait_listening "$SPID" "$WORK/server.out" "$WORK/server.err"
# Its port is busy now: a second coordinator cannot listen there and leaves
# no state directory behind.
if "$SERVER" --state-dir "$WORK/busy" --model mlp --data "$DATA" --enrolment-secret s3cret \
    --port "${URL##*:}" >/dev/null 2>"$WORK/busy.err"; then
    fail "a second coordinator listened on a busy port"
fi
grep -q "cannot listen" "$WORK/busy.err" || fail "busy port: $(cat "$WORK/busy.err")"
[ ! -e "$WORK/busy" ] || fail "a failed start (busy port) left $(ls -A "$WORK/busy")"

C=(curl -sS --max-time 20)
# req METHOD PATH [curl args...]: sets CODE and BODY.
req() {
    local m=$1 p=$2
    shift 2
    CODE=$("${C[@]}" -X "$m" -o "$WORK/body" -w '%{http_code}' "$@" "$URL$p")
    BODY=$(tr -d '\000' <"$WORK/body")
}
expect() { [ "$CODE" = "$1" ] || fail "$2: HTTP $CODE, expected $1 ($BODY)"; }

req GET /healthz
expect 200 healthz
[ "$BODY" = "ok" ] || fail "healthz body '$BODY'"
req GET /v1/status
expect 200 status
[ "$(json_field "$BODY" state)" = waiting ] || fail "status: $BODY"
[ "$(json_field "$BODY" total_rounds)" = 2 ] || fail "CLI does not override the file: $BODY"
req GET /nope
expect 404 "unknown path"
echo "$BODY" | grep -q '"code":"not_found"' || fail "404 body: $BODY"
req DELETE /v1/status
expect 405 "wrong method"

# Registration.
J=(-H 'Content-Type: application/json')
B=(-H "Content-Type: application/octet-stream")
req POST /v1/clients "${J[@]}" -d '{"name":"edge-1"}'
expect 400 "missing secret"
echo "$BODY" | grep -q enrolment_secret || fail "400 body: $BODY"
req POST /v1/clients "${J[@]}" -d '{"name":"edge-1","enrolment_secret":"s3creT"}'
expect 401 "wrong secret"
echo "$BODY" | grep -q bad_secret || fail "401 body: $BODY"
req POST /v1/clients "${J[@]}" -d '{"name":"edge-1"'
expect 400 "malformed JSON"
req POST /v1/clients "${J[@]}" -d '{"name":"edge-1","colour":"red","enrolment_secret":"s3cret"}'
expect 400 "unknown key"
req POST /v1/clients "${J[@]}" -d '{"name":"a","name":"b","enrolment_secret":"s3cret"}'
expect 400 "duplicate key"
req POST /v1/clients "${J[@]}" -d '{"name":7,"enrolment_secret":"s3cret"}'
expect 400 "bad name"
req POST /v1/clients "${J[@]}" -d '{"name":"edge-1","enrolment_secret":"s3cret"}'
expect 201 register
TOKEN=$(json_field "$BODY" token)
CID=$(json_field "$BODY" client_id)
[ ${#TOKEN} -eq 64 ] || fail "token '$TOKEN'"
A=(-H "Authorization: Bearer $TOKEN")

# Authentication.
req GET /v1/tasks/next
expect 401 "no token"
req GET /v1/tasks/next -H "Authorization: Bearer $(printf '%064d' 0)"
expect 401 "bad token"

# The round opens (min_clients 1): long-poll for the task.
req GET '/v1/tasks/next?wait=10' "${A[@]}"
expect 200 task
TASK=$BODY
[ "$(json_field "$TASK" round)" = 0 ] || fail "task: $TASK"
[ "$(json_field "$TASK" model_version)" = 0 ] || fail "task: $TASK"
echo "$TASK" | grep -q '"compressor":"topk"' || fail "task budgets: $TASK"
req GET '/v1/tasks/next?wait=99' "${A[@]}"
expect 400 "wait out of range"

# Model download, ETag, zstd, unknown version.
curl -sS --max-time 20 -D "$WORK/h" -o "$WORK/model.safetensors" "${A[@]}" "$URL/v1/models/0"
grep -qi '^etag: "m0"' "$WORK/h" || fail "no ETag: $(cat "$WORK/h")"
req GET /v1/models/0 "${A[@]}" -H 'If-None-Match: "m0"'
expect 304 "If-None-Match"
curl -sS --max-time 20 -D "$WORK/hz" -o "$WORK/model.zst" "${A[@]}" -H 'Accept-Encoding: zstd' \
    "$URL/v1/models/0"
grep -qi '^content-encoding: zstd' "$WORK/hz" || fail "no zstd encoding"
[ "$(stat -c %s "$WORK/model.zst")" -lt "$(stat -c %s "$WORK/model.safetensors")" ] ||
    fail "zstd body not smaller"
req GET /v1/models/7 "${A[@]}"
expect 404 "unknown model version"

# Uploads: garbage, then a real payload built from the model itself.
head -c 100 /dev/urandom >"$WORK/garbage.bin"
req POST /v1/rounds/0/updates "${A[@]}" "${B[@]}" --data-binary @"$WORK/garbage.bin" \
    -H 'Content-Type: application/octet-stream'
expect 400 "garbage upload"
echo "$BODY" | grep -q bad_payload || fail "garbage body: $BODY"
"$TOOL" compress --in "$WORK/model.safetensors" --policy uniform --density 0.05 --round 0 \
    --rounds 2 --out "$WORK/wrong.bin" --client-id "$CID" --samples 0 >/dev/null
req POST /v1/rounds/0/updates "${A[@]}" "${B[@]}" --data-binary @"$WORK/wrong.bin"
expect 422 "sample_count 0"
echo "$BODY" | grep -q invalid_update || fail "422 body: $BODY"
"$TOOL" compress --in "$WORK/model.safetensors" --policy uniform --density 0.05 --round 0 \
    --rounds 2 --out "$WORK/up.bin" --client-id "$CID" --model-version 0 --samples 100 >/dev/null
# Paused, the coordinator closes round 0 but opens no next round.
ADM=(-H "Authorization: Bearer $(head -n 1 "$WORK/state/admin.token")")
req POST /v1/admin/pause "${ADM[@]}"
expect 200 "admin pause"
req POST /v1/rounds/0/updates "${A[@]}" "${B[@]}" --data-binary @"$WORK/up.bin"
expect 200 upload
RECEIPT=$(json_field "$BODY" receipt)
[ "$(json_field "$BODY" duplicate)" = false ] || fail "first upload: $BODY"
req POST /v1/rounds/0/updates "${A[@]}" "${B[@]}" --data-binary @"$WORK/up.bin"
expect 200 "repeated upload"
[ "$(json_field "$BODY" receipt)" = "$RECEIPT" ] || fail "repeat receipt: $BODY"
[ "$(json_field "$BODY" duplicate)" = true ] || fail "repeat: $BODY"

# The round closes (every selected client reported).
for _ in $(seq 1 100); do
    req GET /v1/rounds/0
    [ "$(json_field "$BODY" state)" = closed ] && break
    sleep 0.2
done
expect 200 "round 0"
[ "$(json_field "$BODY" state)" = closed ] || fail "round 0 did not close: $BODY"
[ "$(json_field "$BODY" participants)" = 1 ] || fail "round 0: $BODY"
[ "$(json_field "$BODY" eval_samples)" = 400 ] || fail "round 0's eval_samples: $BODY"
[ "$(json_field "$BODY" uplink_bytes)" = "$(stat -c %s "$WORK/up.bin")" ] || fail "uplink: $BODY"
# Downlink: the two bodies of version 0 (raw and zstd) went out during round 0.
[ "$(json_field "$BODY" downlink_bytes)" = $(($(stat -c %s "$WORK/model.safetensors") + $(stat -c %s "$WORK/model.zst"))) ] ||
    fail "round 0's downlink: $BODY"
grep -q '^round 0/2: 1 updates, accuracy' "$WORK/server.out" || fail "no round log line"
req GET /v1/rounds
expect 200 rounds
echo "$BODY" | grep -q '"round":0' || fail "rounds list: $BODY"
req GET /v1/rounds/99
expect 404 "unknown round"
req POST /v1/rounds/0/updates "${A[@]}" "${B[@]}" --data-binary @"$WORK/up.bin"
expect 200 "repeat after close"
[ "$(json_field "$BODY" duplicate)" = true ] || fail "repeat after close: $BODY"
# A repeat with other content is a conflict (the stored update stays), and
# every path validates the payload first: a bad sample count for a closed
# round, a repeat, or a round that never opened is 422, never 500.
"$TOOL" compress --in "$WORK/model.safetensors" --policy uniform --density 0.05 --round 0 \
    --rounds 2 --out "$WORK/other.bin" --client-id "$CID" --model-version 0 --samples 101 >/dev/null
req POST /v1/rounds/0/updates "${A[@]}" "${B[@]}" --data-binary @"$WORK/other.bin"
expect 409 "repeat with other content"
echo "$BODY" | grep -q '"code":"conflict"' || fail "409 body: $BODY"
for r in 0 5; do
    "$TOOL" compress --in "$WORK/model.safetensors" --policy uniform --density 0.05 \
        --round "$r" --rounds 6 --out "$WORK/zero.bin" --client-id "$CID" --model-version 0 \
        --samples 0 >/dev/null
    "$TOOL" compress --in "$WORK/model.safetensors" --policy uniform --density 0.05 \
        --round "$r" --rounds 6 --out "$WORK/ok.bin" --client-id "$CID" --model-version 0 \
        --samples 7 >/dev/null
    "$FORGE" --in "$WORK/ok.bin" --out "$WORK/huge.bin" --huge-samples || fail "payload_forge"
    for bad in zero huge; do
        req POST "/v1/rounds/$r/updates" "${A[@]}" "${B[@]}" --data-binary @"$WORK/$bad.bin"
        expect 422 "$bad sample_count for round $r"
        echo "$BODY" | grep -q invalid_update || fail "422 body: $BODY"
    done
done
"$TOOL" compress --in "$WORK/model.safetensors" --policy uniform --density 0.05 --round 5 \
    --rounds 6 --out "$WORK/up1.bin" --client-id "$CID" --model-version 1 --samples 10 \
    >/dev/null
req POST /v1/rounds/5/updates "${A[@]}" "${B[@]}" --data-binary @"$WORK/up1.bin"
expect 409 "round never opened"
echo "$BODY" | grep -q round_not_open || fail "409 body: $BODY"
# Version 1, fetched between rounds (round 0 closed, round 1 not open while
# paused), counts in round 1's downlink (checked when it closes).
req GET /v1/status
[ "$(json_field "$BODY" state)" = paused ] || fail "status while paused: $BODY"
req GET /v1/rounds/1
expect 404 "round 1 while paused"
CODE=$("${C[@]}" -o "$WORK/model1.safetensors" -w '%{http_code}' "${A[@]}" "$URL/v1/models/1")
BODY="(the body of version 1, $(stat -c %s "$WORK/model1.safetensors") bytes)"
expect 200 "model version 1"
req POST /v1/admin/resume "${ADM[@]}"
expect 200 "admin resume"
# Round 1 opens for the one client registered so far.
for _ in $(seq 1 100); do
    req GET /v1/rounds/1
    [ "$(json_field "$BODY" state)" = open ] && break
    sleep 0.1
done
[ "$(json_field "$BODY" state)" = open ] || fail "round 1 did not open: $BODY"

# A second client registered now is not selected for round 1 (1 per round)
# unless sampled; a different client's upload for round 0 is round_closed.
req POST /v1/clients "${J[@]}" -d '{"enrolment_secret":"s3cret"}'
expect 201 "second register"
T2=$(json_field "$BODY" token)
C2=$(json_field "$BODY" client_id)
"$TOOL" compress --in "$WORK/model.safetensors" --policy uniform --density 0.05 --round 0 \
    --rounds 2 --out "$WORK/late.bin" --client-id "$C2" --samples 10 >/dev/null
req POST /v1/rounds/0/updates -H "Authorization: Bearer $T2" "${B[@]}" --data-binary @"$WORK/late.bin"
expect 409 "upload for a closed round"
echo "$BODY" | grep -q round_closed || fail "409 body: $BODY"
# ... and it was registered after round 1 opened, so it is not selected: 403.
"$TOOL" compress --in "$WORK/model.safetensors" --policy uniform --density 0.05 --round 1 \
    --rounds 2 --out "$WORK/late1.bin" --client-id "$C2" --model-version 1 --samples 10 >/dev/null
req POST /v1/rounds/1/updates -H "Authorization: Bearer $T2" "${B[@]}" --data-binary @"$WORK/late1.bin"
expect 403 "client not selected"
echo "$BODY" | grep -q not_selected || fail "403 body: $BODY"

# Oversize body: 413 before the body is read.
req POST /v1/clients "${J[@]}" --data-binary @<(head -c 70000 /dev/zero | tr '\0' ' ')
expect 413 "oversize JSON body"

req GET /metrics
expect 200 metrics
for m in strata_rounds_completed_total strata_updates_accepted_total \
    'strata_updates_rejected_total{reason="bad_payload"}' strata_bytes_received_total \
    strata_bytes_sent_total strata_aggregation_seconds strata_round_duration_seconds \
    strata_accuracy strata_registered_clients; do
    grep -qF "$m" <<<"$BODY" || fail "metrics lack $m"
done
# Round 0 of 0..1 was evaluated on the 400 test images of eval_samples.
grep -q '^strata_eval_samples 400$' <<<"$BODY" || fail "eval samples gauge: $BODY"
grep -q '^strata_rounds_completed_total 1$' <<<"$BODY" || fail "rounds counter: $BODY"
grep -q '^strata_updates_accepted_total 1$' <<<"$BODY" || fail "accepted counter: $BODY"

# The last round (1 of 0..1) completes; then tasks answer 410 finished.
"$TOOL" compress --in "$WORK/model.safetensors" --policy uniform --density 0.05 --round 1 \
    --rounds 2 --out "$WORK/up1.bin" --client-id "$CID" --model-version 1 --samples 10 >/dev/null
req POST /v1/rounds/1/updates "${A[@]}" "${B[@]}" --data-binary @"$WORK/up1.bin"
expect 200 "round 1 upload"
for _ in $(seq 1 100); do
    req GET /v1/status
    [ "$(json_field "$BODY" state)" = finished ] && break
    sleep 0.2
done
[ "$(json_field "$BODY" state)" = finished ] || fail "not finished: $BODY"
req GET /v1/rounds/1
[ "$(json_field "$BODY" downlink_bytes)" = "$(stat -c %s "$WORK/model1.safetensors")" ] ||
    fail "round 1's downlink: $BODY"
# The last round is evaluated on the whole test set.
req GET /metrics
grep -q '^strata_eval_samples 10000$' <<<"$BODY" || fail "last round's eval samples: $BODY"
req GET /v1/tasks/next "${A[@]}"
expect 410 "tasks after the last round"
echo "$BODY" | grep -q finished || fail "410 body: $BODY"

# Guessing the enrolment secret is limited per address (--enrolment-rate,
# 10 a minute by default): after the bucket is empty every registration from
# this address, even with the right secret, gets 429 with Retry-After,
# counted, and registers nobody. The bucket refills a token every 6 s, so
# the right secret can land just after a refill (and register): then the
# bucket is emptied again and the right secret tried once more, at most 3
# times, with the registration and every 429 accounted for.
req GET /v1/status
CLIENTS=$(json_field "$BODY" registered_clients)
LIMITED0=$("${C[@]}" "$URL/metrics" | awk '$1 == "strata_requests_rejected_total{reason=\"rate_limited\"}" { print $2 }')
LIMITS=0 RA=""
for attempt in 1 2 3; do
    wrong=0
    for _ in $(seq 1 15); do
        req POST /v1/clients "${J[@]}" -d '{"enrolment_secret":"guess"}'
        [ "$CODE" = 401 ] || break
        wrong=$((wrong + 1))
    done
    expect 429 "a wrong secret after $wrong others"
    LIMITS=$((LIMITS + 1))
    if [ "$attempt" = 1 ]; then
        [ "$wrong" -ge 1 ] && [ "$wrong" -le 10 ] || fail "$wrong wrong secrets before the limit"
    else
        [ "$wrong" -le 1 ] || fail "$wrong wrong secrets after a refill"
    fi
    echo "$BODY" | grep -q '"code":"rate_limited"' || fail "429 body: $BODY"
    RCODE=$("${C[@]}" -D "$WORK/ra.h" -o /dev/null -w '%{http_code}' "${J[@]}" \
        -d '{"enrolment_secret":"s3cret"}' "$URL/v1/clients")
    RA=$(tr -d '\r' <"$WORK/ra.h" | awk -F': ' 'tolower($1) == "retry-after" { print $2 }')
    [ "$RCODE" = 429 ] && LIMITS=$((LIMITS + 1)) && break
    [ "$RCODE" = 201 ] || fail "the right secret while limited: HTTP $RCODE"
    CLIENTS=$((CLIENTS + 1)) # a token came back between the two requests
done
[ "$RCODE" = 429 ] || fail "the right secret registered 3 times while limited"
[ -n "$RA" ] && [ "$RA" -ge 1 ] || fail "no Retry-After for the right secret while limited"
req GET /v1/status
[ "$(json_field "$BODY" registered_clients)" = "$CLIENTS" ] || fail "a limited address registered"
LIMITED1=$("${C[@]}" "$URL/metrics" | awk '$1 == "strata_requests_rejected_total{reason=\"rate_limited\"}" { print $2 }')
[ "$LIMITED1" = $((${LIMITED0:-0} + LIMITS)) ] || fail "rate_limited counted $LIMITED0 -> $LIMITED1 ($LIMITS 429s)"

# Clean stop on SIGTERM, then a restart resumes from the state directory.
kill -TERM "$SPID"
for _ in $(seq 1 100); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$SPID" 2>/dev/null && fail "server ignored SIGTERM"
wait "$SPID" || fail "server exit status $? after SIGTERM: $(tail -n 20 "$WORK/server.err")"
SPID=""
"$SERVER" --config "$WORK/cfg.json" --state-dir "$WORK/state" --model mlp --data "$DATA" \
    --port 0 --rounds 2 >"$WORK/server2.out" 2>"$WORK/server2.err" &
SPID=$!
wait_listening "$SPID" "$WORK/server2.out" "$WORK/server2.err"
req GET /v1/status
[ "$(json_field "$BODY" model_version)" = 2 ] || fail "restart: $BODY"
[ "$(json_field "$BODY" registered_clients)" = 2 ] || fail "restart: $BODY"
# The gauges of the last evaluation come back with the state: round 1's.
req GET /v1/rounds/1
ACC1=$(json_field "$BODY" accuracy)
[ -n "$ACC1" ] && [ "$ACC1" != null ] || fail "round 1 has no accuracy: $BODY"
req GET /metrics
grep -q '^strata_eval_samples 10000$' <<<"$BODY" || fail "eval samples after a restart: $BODY"
ACCM=$(awk '$1 == "strata_accuracy" { print $2 }' <<<"$BODY")
awk -v a="$ACC1" -v m="$ACCM" 'BEGIN { d = a - m; exit !(m > 0 && d < 1e-6 && d > -1e-6) }' ||
    fail "strata_accuracy after a restart is $ACCM, round 1's accuracy $ACC1"
# A client's long-poll is pending while the server stops: it still exits 0.
"${C[@]}" -o /dev/null "${A[@]}" "$URL/v1/tasks/next?wait=5" &
POLL=$!
sleep 0.3
kill -TERM "$SPID"
wait "$SPID" || fail "restarted server exit status $?: $(tail -n 20 "$WORK/server2.err")"
SPID=""
wait "$POLL" || true
# Every file the coordinator made is 0600 and every directory 0700, whatever
# the umask (state.db and its -wal/-shm hold token hashes).
[ -e "$WORK/state/state.db" ] && [ -e "$WORK/state/admin.token" ] || fail "no state.db or admin.token"
bad=$(find "$WORK/state" -mindepth 1 \( -type f ! -perm 0600 \) -o \( -type d ! -perm 0700 \) |
    while read -r p; do echo "$p $(stat -c %a "$p")"; done)
[ -z "$bad" ] || fail "state files readable by others: $bad"
[ "$(stored_count "$WORK/state")" -gt 0 ] || fail "no stored updates"
[ -n "$(find "$WORK/state/checkpoints" -name '*.safetensors')" ] || fail "no checkpoints to check"
echo "PASS test_server_api"
