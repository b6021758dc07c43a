#!/usr/bin/env bash
# Slow clients are cut off while the federation carries on: with
# --request-timeout 4, three connections that trickle one byte a second (one
# in the request headers, one in a JSON body, one in the update body of a
# registered, selected client) and one that sends nothing are closed by the
# coordinator after about 4 seconds, while two real clients register, train,
# upload and finish the round (it closes at its deadline with 2 of 3 updates).
# Then the connection limit: a second coordinator with --max-connections 4
# holds 4 silent connections and serves no fifth until the request deadline
# has cut the silent ones.
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
CLIENT="$BUILD/strata-client"
command -v curl >/dev/null || fail "curl is required"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
SECRET=slow-s3cret
TIMEOUT=4

"$SERVER" --state-dir "$WORK/state" --model mlp --data "$DATA" --port 0 --rounds 1 \
    --min-clients 3 --clients-per-round 3 --min-updates 2 --max-steps 30 --round-deadline 15 \
    --enrolment-secret "$SECRET" --request-timeout $TIMEOUT --connection-timeout 30 \
    >"$WORK/server.out" 2>"$WORK/server.err" &
SPID=$!
PIDS+=("$SPID")
wait_listening "$SPID" "$WORK/server.out" "$WORK/server.err"
PORT=${URL##*:}
REG=$(curl -sS --max-time 10 -X POST -H 'Content-Type: application/json' \
    -d "{\"name\":\"slow\",\"enrolment_secret\":\"$SECRET\"}" "$URL/v1/clients")
SLOW_TOKEN=$(json_field "$REG" token)
[ ${#SLOW_TOKEN} -eq 64 ] || fail "register: $REG"

# trickle NAME PREFIX: opens a connection, sends PREFIX, then one byte a
# second for up to 40 s; writes "cut SECONDS" when the coordinator closes
# the connection, or "open" when it never did.
trickle() {
    local name=$1 prefix=$2 start=$SECONDS st
    trap '' PIPE
    exec 3<>"/dev/tcp/127.0.0.1/$PORT" || { echo "noconnect" >"$WORK/$name.res"; return; }
    printf '%b' "$prefix" >&3
    while [ $((SECONDS - start)) -lt 40 ]; do
        # read returns 1 at end of file, > 128 on its timeout.
        st=0
        IFS= read -r -t 1 -u 3 _ || st=$?
        if [ $st -ne 0 ] && [ $st -le 128 ]; then
            echo "cut $((SECONDS - start))" >"$WORK/$name.res"
            return
        fi
        if [ "$name" != idle ]; then printf 'a' >&3 2>/dev/null || true; fi
    done
    echo "open" >"$WORK/$name.res"
}
trickle headers "POST /v1/clients HTTP/1.1\r\nHost: x\r\nX-Slow: " &
PIDS+=($!)
trickle json "POST /v1/clients HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"name\":\"" &
PIDS+=($!)
trickle update "POST /v1/rounds/0/updates HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer $SLOW_TOKEN\r\nContent-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\n" &
PIDS+=($!)
trickle idle "" &
PIDS+=($!)

# Two real clients do their round meanwhile.
for i in 0 1; do
    "$CLIENT" --server "$URL" --state-dir "$WORK/c$i" --data "$DATA" --num-clients 2 \
        --client-index $i --enrolment-secret "$SECRET" --poll-wait 2 >"$WORK/c$i.log" 2>&1 &
    CPID[i]=$!
    PIDS+=("${CPID[i]}")
done
T0=$SECONDS
for i in 0 1; do
    while kill -0 "${CPID[i]}" 2>/dev/null; do
        [ $((SECONDS - T0)) -lt 120 ] || fail "client $i did not finish: $(tail -n 5 "$WORK/c$i.log")"
        sleep 0.5
    done
    wait "${CPID[i]}" || fail "client $i failed: $(tail -n 5 "$WORK/c$i.log")"
done
for name in headers json update idle; do
    for _ in $(seq 1 100); do
        [ -s "$WORK/$name.res" ] && break
        sleep 0.5
    done
    res=$(cat "$WORK/$name.res" 2>/dev/null || echo none)
    set -- $res
    [ "${1:-}" = cut ] || fail "$name: the slow connection was not cut ($res)"
    [ "$2" -ge $((TIMEOUT - 1)) ] && [ "$2" -le $((TIMEOUT + 4)) ] ||
        fail "$name: cut after $2 s, expected about $TIMEOUT s"
    echo "$name: cut after $2 s"
done
STATUS=$(curl -sS --max-time 10 "$URL/v1/status")
[ "$(json_field "$STATUS" state)" = finished ] || fail "not finished: $STATUS"
[ "$(json_field "$STATUS" registered_clients)" = 3 ] || fail "registered: $STATUS"
ROUND=$(curl -sS --max-time 10 "$URL/v1/rounds/0")
[ "$(json_field "$ROUND" participants)" = 2 ] || fail "round 0: $ROUND"
cut=$(curl -sS --max-time 10 "$URL/metrics" |
    sed -n 's/^strata_requests_rejected_total{reason="request_timeout"} //p')
[ "${cut:-0}" -ge 4 ] || fail "request_timeout counted ${cut:-0} times, expected at least 4"
kill "$SPID" && wait "$SPID" 2>/dev/null || true

"$SERVER" --state-dir "$WORK/state2" --model mlp --data "$DATA" --port 0 --rounds 1 \
    --enrolment-secret "$SECRET" --request-timeout $TIMEOUT --max-connections 4 \
    >"$WORK/server2.out" 2>"$WORK/server2.err" &
SPID=$!
PIDS+=("$SPID")
wait_listening "$SPID" "$WORK/server2.out" "$WORK/server2.err"
URL2=$URL
PORT2=${URL2##*:}
[ "$(curl -sS --max-time 5 "$URL2/healthz")" = ok ] || fail "coordinator 2 does not answer"
T1=$SECONDS
exec 4<>"/dev/tcp/127.0.0.1/$PORT2" 5<>"/dev/tcp/127.0.0.1/$PORT2" \
    6<>"/dev/tcp/127.0.0.1/$PORT2" 7<>"/dev/tcp/127.0.0.1/$PORT2"
sleep 0.5
if out=$(curl -sS --max-time 2 "$URL2/healthz" 2>&1); then
    fail "a fifth connection was served with 4 held open (limit 4): $out"
fi
echo "fifth connection not served while 4 are held: $out"
ok=""
while [ $((SECONDS - T1)) -lt $((TIMEOUT + 8)) ]; do
    if [ "$(curl -s --max-time 2 "$URL2/healthz" 2>/dev/null)" = ok ]; then
        ok=$((SECONDS - T1))
        break
    fi
    sleep 0.5
done
exec 4>&- 5>&- 6>&- 7>&-
[ -n "$ok" ] || fail "the coordinator did not serve again after the silent connections were cut"
echo "served again after ${ok} s"
echo "PASS: slow connections cut after ~${TIMEOUT} s; both clients finished the round;" \
    "connection limit enforced"
