#!/usr/bin/env bash
# Admin controls through the real coordinator: pause keeps a new round from
# opening (and survives a restart), resume opens it, stop ends the federation
# (the open round is closed unaggregated, clients get 410, uploads 409) and
# survives a restart; the admin config shows what the public status hides.
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
command -v curl >/dev/null || fail "curl is required"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
STATE="$WORK/state"
SPID=""
cleanup() {
    [ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

start() { # start TAG
    "$SERVER" --state-dir "$STATE" --model mlp --data "$DATA" --port 0 --rounds 3 \
        --min-clients 1 --clients-per-round 1 --enrolment-secret adm-s3cret \
        >"$WORK/server$1.out" 2>"$WORK/server$1.err" &
    SPID=$!
    wait_listening "$SPID" "$WORK/server$1.out" "$WORK/server$1.err"
    ADMIN=(-H "Authorization: Bearer $(head -n 1 "$STATE/admin.token")")
}
stop_server() {
    kill -TERM "$SPID"
    wait "$SPID" || fail "coordinator exit status $?"
    SPID=""
}
C=(curl -sS --max-time 20)
J=(-H 'Content-Type: application/json')
state() { json_field "$("${C[@]}" "$URL/v1/status")" state; }
admin() { # admin ACTION: POSTs it and checks the answer's state
    local body
    body=$("${C[@]}" -X POST "${ADMIN[@]}" "${J[@]}" -d "{\"reason\":\"test $1\"}" \
        -w ' %{http_code}' "$URL/v1/admin/$1")
    [ "${body##* }" = 200 ] || fail "admin $1: $body"
    ADMIN_STATE=$(json_field "${body% *}" state)
}

start 1
admin pause
[ "$ADMIN_STATE" = paused ] || fail "pause answered state $ADMIN_STATE"
BODY=$("${C[@]}" -X POST "${J[@]}" -d '{"name":"a","enrolment_secret":"adm-s3cret"}' \
    "$URL/v1/clients")
TOKEN=$(json_field "$BODY" token)
CID=$(json_field "$BODY" client_id)
A=(-H "Authorization: Bearer $TOKEN")
code=$("${C[@]}" -o /dev/null -w '%{http_code}' "${A[@]}" "$URL/v1/tasks/next?wait=2")
[ "$code" = 204 ] || fail "a task while paused: HTTP $code"
[ "$(state)" = paused ] || fail "status while paused: $(state)"
grep -q "admin pause: test pause" "$WORK/server1.err" || fail "the reason was not logged"

# The public status hides paths; the admin config shows them.
# (Fetched whole first: grep -q closing the pipe early would fail curl.)
PUBLIC=$("${C[@]}" "$URL/v1/status")
echo "$PUBLIC" | grep -q state_dir && fail "/v1/status shows state_dir"
CONFIG=$("${C[@]}" "${ADMIN[@]}" "$URL/v1/admin/config")
echo "$CONFIG" | grep -q "\"state_dir\":\"$STATE\"" ||
    fail "admin config lacks state_dir"

stop_server
start 2
[ "$(state)" = paused ] || fail "pause did not survive a restart: $(state)"
admin resume
TASK=$("${C[@]}" "${A[@]}" "$URL/v1/tasks/next?wait=10")
[ "$(json_field "$TASK" round)" = 0 ] || fail "no task after resume: $TASK"
[ "$(state)" = running ] || fail "status after resume: $(state)"

admin stop
[ "$ADMIN_STATE" = stopped ] || fail "stop answered state $ADMIN_STATE"
code=$("${C[@]}" -o "$WORK/t.json" -w '%{http_code}' "${A[@]}" "$URL/v1/tasks/next")
[ "$code" = 410 ] || fail "a task after stop: HTTP $code"
grep -q "stopped by its operator" "$WORK/t.json" || fail "410 body: $(cat "$WORK/t.json")"
ROUND=$("${C[@]}" "$URL/v1/rounds/0")
[ "$(json_field "$ROUND" state)" = closed ] && echo "$ROUND" | grep -q '"stopped":true' ||
    fail "round 0 after stop: $ROUND"
"${C[@]}" "${A[@]}" -o "$WORK/m.safetensors" "$URL/v1/models/0"
"$TOOL" compress --in "$WORK/m.safetensors" --policy uniform --density 0.01 --round 0 \
    --rounds 3 --out "$WORK/up.bin" --client-id "$CID" --model-version 0 --samples 10 >/dev/null
code=$("${C[@]}" -o "$WORK/u.json" -w '%{http_code}' "${A[@]}" \
    -H 'Content-Type: application/octet-stream' --data-binary @"$WORK/up.bin" \
    "$URL/v1/rounds/0/updates")
[ "$code" = 409 ] || fail "an upload after stop: HTTP $code $(cat "$WORK/u.json")"
M=$("${C[@]}" "$URL/metrics")
grep -q '^strata_rounds_completed_total 0$' <<<"$M" || fail "a stopped round was counted"

stop_server
start 3
[ "$(state)" = stopped ] || fail "stop did not survive a restart: $(state)"
code=$("${C[@]}" -o /dev/null -w '%{http_code}' "${A[@]}" "$URL/v1/tasks/next")
[ "$code" = 410 ] || fail "a task after restart: HTTP $code"
M=$("${C[@]}" "$URL/metrics")
grep -q '^strata_rounds_completed_total 0$' <<<"$M" ||
    fail "a stopped round was counted after a restart"
echo "PASS: admin pause, resume and stop (persistent)"
