#!/usr/bin/env bash
# Crash and outage resilience with real processes on loopback: a coordinator
# and 3 clients (mlp, legacy policy at 5%, 4 rounds).
#  1. The coordinator is killed (SIGKILL) in round 1 after 2 of its 3 uploads
#     were acknowledged (the third client is held with SIGSTOP so the round
#     cannot close), stays down for ~5 s, and is restarted on the same port
#     with the same state directory: the acknowledged uploads are replayed and
#     counted exactly once (participants, /metrics, stored files).
#  2. Meanwhile the clients retry with backoff ("retrying") and carry on.
#  3. A client is killed (SIGKILL) after its round-2 upload and restarted with
#     its state directory: same identity, residuals kept, run completes.
# Finally every receipt in the clients' receipts.log is the one the
# coordinator returns for a re-upload of the stored payload, and the receipts
# per round equal the round's participants.
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
CLIENT="$BUILD/strata-client"
for x in "$SERVER" "$CLIENT"; do [ -x "$x" ] || fail "no $x"; done
command -v curl >/dev/null || fail "curl is required"
export OMP_WAIT_POLICY=passive
T_START=$SECONDS
DEADLINE=$((SECONDS + 85)) # every wait below also stops here
ROUNDS=4
NC=3
STATE="$WORK/state"

cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        kill -KILL "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

dump() {
    local f
    for f in "$WORK"/*.out "$WORK"/*.err "$WORK"/c*.log; do
        [ -f "$f" ] && { echo "==== $f" && tail -n 15 "$f"; } >&2
    done
    return 0
}
die() {
    dump
    fail "$*"
}


C=(curl -sS --max-time 5)
round_field() { json_field "$(get "/v1/rounds/$1")" "$2"; }
has_receipt() { [ -f "$WORK/c$1/receipts.log" ] && grep -q "^$2 " "$WORK/c$1/receipts.log"; }
round_is() { [ "$(round_field "$1" state)" = "$2" ] && [ "$(round_field "$1" participants)" = "$3" ]; }

SPID=""
start_server() { # start_server PORT TAG
    "$SERVER" --state-dir "$STATE" --model mlp --data "$DATA" --port "$1" --rounds $ROUNDS \
        --min-clients $NC --clients-per-round $NC --policy legacy --density 0.05 \
        --round-deadline 120 --enrolment-secret resilience-s3cret \
        >"$WORK/server$2.out" 2>"$WORK/server$2.err" &
    SPID=$!
    PIDS+=("$SPID")
    wait_until 30 "server $2 listening" server_ready "$2"
    URL=$(sed -n 's/^strata-server: listening on //p' "$WORK/server$2.out" | head -n 1)
    [ -n "$URL" ] || die "no listening line"
}
server_ready() {
    alive "$SPID" || die "server $1 exited: $(cat "$WORK/server$1.err")"
    grep -q "listening on" "$WORK/server$1.out" 2>/dev/null
}

CPID=()
start_client() { # start_client INDEX
    "$CLIENT" --server "$URL" --state-dir "$WORK/c$1" --data "$DATA" --partition iid \
        --num-clients $NC --client-index "$1" --threads 1 --poll-wait 5 --name "edge-$1" \
        --enrolment-secret resilience-s3cret \
        >>"$WORK/c$1.log" 2>&1 &
    CPID[$1]=$!
    PIDS+=("${CPID[$1]}")
}

# ---- start-up ---------------------------------------------------------------
start_server 0 1
PORT=${URL##*:}
for i in 0 1 2; do start_client $i; done

# c2 is frozen right after its round-0 upload, so round 1 cannot close.
wait_until 60 "client 2's round-0 receipt" has_receipt 2 0
kill -STOP "${CPID[2]}"
has_receipt 2 1 && die "client 2 uploaded round 1 before it could be stopped"

# ---- 1. coordinator crash mid-round -------------------------------------------
wait_until 60 "round 1 open with 2 acknowledged uploads" round_is 1 open 2
wait_until 10 "client 0's round-1 receipt" has_receipt 0 1
wait_until 10 "client 1's round-1 receipt" has_receipt 1 1
[ "$(metric strata_updates_accepted_total)" = 5 ] || die "accepted before the crash: $(metric strata_updates_accepted_total)"
retries_before=$(cat "$WORK/c0.log" "$WORK/c1.log" | grep -c retrying || true)
kill -KILL "$SPID"
reap "$SPID"
t_kill=$SECONDS

# ---- 2. the coordinator is unreachable; the clients back off ------------------
"${C[@]}" -o /dev/null "$URL/healthz" 2>/dev/null && die "the coordinator still answers"
count_retries() { [ "$(cat "$WORK/c0.log" "$WORK/c1.log" | grep -c retrying || true)" -ge $((retries_before + 2)) ]; }
wait_until 20 "clients 0 and 1 retrying" count_retries
for i in 0 1; do alive "${CPID[$i]}" || die "client $i exited during the outage"; done
while [ $((SECONDS - t_kill)) -lt 5 ]; do sleep 0.2; done # the outage lasts ~5 s

start_server "$PORT" 2
[ "$URL" = "http://127.0.0.1:$PORT" ] || die "restarted on $URL, not port $PORT"
round_is 1 open 2 || die "round 1 after the restart: $(get /v1/rounds/1)"
[ "$(metric strata_updates_accepted_total)" = 5 ] || die "accepted after the restart: $(metric strata_updates_accepted_total)"
kill -CONT "${CPID[2]}"
round_closed() { [ "$(round_field "$1" state)" = closed ]; }
wait_until 60 "round 1 closed" round_closed 1
[ "$(round_field 1 participants)" = 3 ] || die "round 1: $(get /v1/rounds/1)"

# ---- 3. a client killed and restarted -----------------------------------------
wait_until 60 "client 1's round-2 receipt" has_receipt 1 2
kill -KILL "${CPID[1]}"
reap "${CPID[1]}"
has_receipt 1 3 && die "client 1 uploaded round 3 before it could be killed"
RES="$WORK/c1/residual.safetensors"
[ -s "$RES" ] || die "client 1 lost its residuals"
head -c 4096 "$RES" | tr -d '\000' | grep -c '"strata.ef.last_round":"2"' >/dev/null ||
    die "client 1's residual is not from round 2"
cp "$RES" "$WORK/res-before"
ID1=$(sed -n 's/.*registered as client \([0-9]*\).*/\1/p' "$WORK/c1.log" | head -n 1)
[ -n "$ID1" ] || die "client 1 never registered"
start_client 1
wait_until 20 "client 1 resuming" grep -q "resuming as client $ID1\$" "$WORK/c1.log"

# ---- the run completes ---------------------------------------------------------
all_exited() { exited "${CPID[0]}" && exited "${CPID[1]}" && exited "${CPID[2]}"; }
wait_until 60 "every client to exit" all_exited
for i in 0 1 2; do
    reap "${CPID[$i]}"
    [ "$REAPED_RC" -eq 0 ] || die "client $i exit status $REAPED_RC"
    grep -q "the federation has finished" "$WORK/c$i.log" || die "client $i did not see the end"
done
[ "$(grep -c "registered as client" "$WORK/c1.log")" = 1 ] || die "client 1 registered twice"
cmp -s "$RES" "$WORK/res-before" && die "client 1's residual did not move on after the restart"
head -c 4096 "$RES" | tr -d '\000' | grep -c "\"strata.ef.last_round\":\"$((ROUNDS - 1))\"" >/dev/null ||
    die "client 1's residual does not reach the last round"

st=$(get /v1/status)
[ "$(json_field "$st" state)" = finished ] || die "status: $st"
[ "$(metric strata_rounds_completed_total)" = $ROUNDS ] || die "rounds completed: $(metric strata_rounds_completed_total)"
[ "$(metric strata_updates_accepted_total)" = $((ROUNDS * NC)) ] ||
    die "accepted $(metric strata_updates_accepted_total), expected $((ROUNDS * NC))"
[ "$(metric strata_registered_clients)" = $NC ] || die "registered: $(metric strata_registered_clients)"
for ((r = 0; r < ROUNDS; r++)); do
    s=$(get "/v1/rounds/$r")
    [ "$(json_field "$s" state)" = closed ] || die "round $r: $s"
    [ "$(json_field "$s" selected)" = $NC ] || die "round $r: $s"
    [ "$(json_field "$s" participants)" = $NC ] || die "round $r counted more or fewer: $s"
    n=$(cat "$WORK"/c*/receipts.log | grep -c "^$r " || true)
    [ "$n" = "$(json_field "$s" participants)" ] || die "round $r: $n receipts, participants $s"
    [ "$(stored_count "$STATE" "$r")" = $NC ] || die "round $r: stored updates"
done

# Every receipt is the coordinator's: re-uploading the stored payload returns
# it as a duplicate (and counts nothing).
for i in 0 1 2; do
    id=$(json_field "$(cat "$WORK/c$i/identity.json")" client_id)
    tok=$(json_field "$(cat "$WORK/c$i/identity.json")" token)
    rounds=$(cut -d' ' -f1 "$WORK/c$i/receipts.log" | tr '\n' ' ')
    [ "$rounds" = "0 1 2 3 " ] || die "client $i receipts for rounds '$rounds'"
    while read -r r receipt; do
        stored_payload "$STATE" "$r" "$id" "$WORK/resend.bin" || die "client $i round $r: no payload"
        body=$("${C[@]}" -H "Authorization: Bearer $tok" -H "Content-Type: application/octet-stream" \
            --data-binary @"$WORK/resend.bin" "$URL/v1/rounds/$r/updates")
        [ "$(json_field "$body" receipt)" = "$receipt" ] || die "client $i round $r: $body vs $receipt"
        [ "$(json_field "$body" duplicate)" = true ] || die "client $i round $r: $body"
    done <"$WORK/c$i/receipts.log"
done
[ "$(metric strata_updates_accepted_total)" = $((ROUNDS * NC)) ] || die "re-uploads were counted"

kill -TERM "$SPID"
wait_until 20 "the server to stop on SIGTERM" exited "$SPID"
reap "$SPID"
[ "$REAPED_RC" -eq 0 ] || die "server exit status $REAPED_RC after SIGTERM"
echo "PASS test_resilience ($((SECONDS - T_START)) s)"
