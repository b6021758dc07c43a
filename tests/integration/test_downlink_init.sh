#!/usr/bin/env bash
# Version 0 from its seed, and chains instead of snapshots, with real
# processes on loopback: a coordinator with --downlink topk:0.1 (mlp,
# uniform 5% uplink, 5 steps a round), restarted on the same state
# directory between phases:
#  1. clients A and B start with no model: both build version 0 from its
#     recipe (GET /v1/models/0/init); round 0 serves no snapshot (its
#     downlink bytes are exactly the two recipes), and every model they use
#     has the coordinator's digest;
#  2. a fresh client C joining at version 4 builds version 0 and takes the
#     chain 0..4, which ends with a base (no snapshot);
#  3. a chain is served exactly when it is smaller than the snapshot, for
#     every starting version, as its delta files or, smaller, as deltas and
#     a base; the chain from 0 grows past it and is refused;
#  4. through a proxy that raises the recipe's init_seed, a fresh client D
#     builds a model whose digest is not version 0's: it falls back to a
#     snapshot; hostile requests to the recipe endpoint are refused; the
#     coordinator carries on;
#  5. restarted with another --seed, version 0 is not that seed's
#     initialisation: no recipe (404), and a fresh client E takes a
#     snapshot;
#  6. with --downlink-keep 0 (the default) the deltas that no chain
#     smaller than the snapshot can use are removed after a round, and the
#     recipe with them.
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
CLIENT="$BUILD/strata-client"
for x in "$SERVER" "$CLIENT"; do [ -x "$x" ] || fail "no $x"; done
command -v curl >/dev/null || fail "curl is required"
export OMP_WAIT_POLICY=passive
T_START=$SECONDS
DEADLINE=$((SECONDS + 200))
STATE="$WORK/state"
SECRET=init-s3cret
SEED=11

cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
dump() {
    local f
    for f in "$WORK"/*.out "$WORK"/*.err "$WORK"/*.log; do
        [ -f "$f" ] && { echo "==== $f" && tail -n 25 "$f"; } >&2
    done
    return 0
}
die() {
    dump
    fail "$*"
}
C=(curl -sS --max-time 10)
version() { json_field "$(get /v1/status)" model_version; }
finished() { [ "$(json_field "$(get /v1/status)" state)" = finished ]; }

# Registered clients stay registered: a phase waits for its new client
# (MIN_CLIENTS counts every registration), selects everyone and closes a
# round on the updates of the two clients it runs.
start_server() { # start_server ROUNDS MIN_CLIENTS [extra options]
    local rounds=$1 minc=$2
    shift 2
    "$SERVER" --state-dir "$STATE" --model mlp --data "$DATA" --port 0 --rounds "$rounds" \
        --min-clients "$minc" --clients-per-round 2 --over-select 10 --min-updates 2 \
        --round-deadline 60 --policy uniform --density 0.05 --max-steps 5 \
        --downlink topk:0.1 --downlink-keep "${KEEP:-0}" --enrolment-secret $SECRET "$@" \
        >>"$WORK/server.out" 2>>"$WORK/server.err" &
    SPID=$!
    PIDS+=("$SPID")
    STARTS=$((${STARTS:-0} + 1))
    for _ in $(seq 1 300); do
        [ "$(grep -c "^strata-server: listening on " "$WORK/server.out" 2>/dev/null || true)" -ge $STARTS ] && break
        alive "$SPID" || die "the coordinator exited: $(tail -n 5 "$WORK/server.err")"
        sleep 0.1
    done
    URL=$(sed -n 's/^strata-server: listening on //p' "$WORK/server.out" | tail -n 1)
    [ -n "$URL" ] || die "the coordinator is not listening"
}
stop_server() {
    kill -TERM "$SPID"
    wait_until 20 "the server to stop" exited "$SPID"
    reap "$SPID"
}
start_client() { # start_client NAME INDEX [extra options]
    local name=$1 idx=$2
    shift 2
    "$CLIENT" --server "${CURL_OVERRIDE:-$URL}" --state-dir "$WORK/$name" --data "$DATA" \
        --partition iid --num-clients 5 --client-index "$idx" --threads 1 --poll-wait 5 \
        --enrolment-secret $SECRET "$@" >>"$WORK/$name.log" 2>&1 &
    LAST=$!
    PIDS+=("$LAST")
}
wait_clients() { # wait_clients PID...: each exits 0
    local p
    for p in "$@"; do
        wait_until 90 "client $p to finish" exited "$p"
        reap "$p"
        [ "$REAPED_RC" -eq 0 ] || die "client exit status $REAPED_RC"
    done
}
data_sha() { # the SHA-256 of a safetensors file's data section
    local hl
    hl=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    tail -c +$((8 + hl + 1)) "$1" | sha256sum | cut -d' ' -f1
}
check_digests() { # check_digests NAME...: every model used is the coordinator's x̂
    local n v dg used
    for n in "$@"; do
        used=0
        while read -r v dg; do
            [ "$(data_sha "$STATE/checkpoints/model-$v.safetensors")" = "$dg" ] ||
                die "client $n used model $v with digest $dg, not the coordinator's"
            used=$((used + 1))
        done < <(sed -n 's/.*model \([0-9]*\): .*digest \([0-9a-f]*\) matches.*/\1 \2/p' "$WORK/$n.log")
        [ "$used" -gt 0 ] || die "client $n checked no model"
    done
}
snapshots() { grep -Ec "model [0-9]+: snapshot" "$WORK/$1.log" || true; }

# 1. A and B build version 0 from its recipe.
start_server 4 2 --seed $SEED
grep -q "version 0 is the initialisation from --seed $SEED" "$WORK/server.err" ||
    die "the coordinator did not publish version 0's recipe"
start_client A 0
APID=$LAST
start_client B 1
BPID=$LAST
wait_clients "$APID" "$BPID"
wait_until 30 "the federation to finish" finished
for n in A B; do
    grep -q "model 0: built from its recipe" "$WORK/$n.log" || die "$n did not build version 0"
    [ "$(snapshots $n)" = 0 ] || die "$n downloaded a snapshot"
done
check_digests A B
TOK=$(json_field "$(cat "$WORK/A/identity.json")" token)
AUTH=(-H "Authorization: Bearer $TOK")
RLEN=$("${C[@]}" -o "$WORK/recipe.json" -w '%{size_download}' "${AUTH[@]}" "$URL/v1/models/0/init")
[ "$RLEN" -gt 0 ] || die "no recipe"
grep -q "\"init_seed\":$SEED," "$WORK/recipe.json" || die "recipe: $(cat "$WORK/recipe.json")"
grep -q "\"digest\":\"$(data_sha "$STATE/checkpoints/model-0.safetensors")\"" "$WORK/recipe.json" ||
    die "the recipe's digest is not version 0's"
d0=$(json_field "$(get /v1/rounds/0)" downlink_bytes)
[ "$d0" = $((2 * RLEN)) ] || die "round 0 served $d0 downlink bytes, not two recipes of $RLEN"
stop_server

# 2. A fresh client at version 4: version 0 built, then the chain 0..4.
start_server 5 3 --seed $SEED
start_client A 0
APID=$LAST
start_client C 2
CPID=$LAST
wait_clients "$APID" "$CPID"
wait_until 30 "the federation to finish" finished
grep -q "model 0: built from its recipe" "$WORK/C.log" || die "C did not build version 0"
# (the mlp's three biases, whole in every delta, cost less once as values:
# the chain ends with a base)
grep -Eq "model 4: 4 deltas and a base from version 0, [0-9]+ bytes" "$WORK/C.log" ||
    die "C did not take the chain from version 0 with a base"
[ "$(snapshots C)" = 0 ] || die "C downloaded a snapshot"
check_digests A C
stop_server

# 3. With every delta kept (--downlink-keep 100), grow the chain from 0
# past the snapshot; then every chain is served exactly when it is smaller
# than the (zstd) snapshot, as the plain chain of its delta files or, where
# a base makes it smaller, as those deltas and a base (one entry more).
KEEP=100 start_server 12 3 --seed $SEED
start_client A 0
APID=$LAST
start_client C 2
CPID=$LAST
wait_clients "$APID" "$CPID"
wait_until 30 "the federation to finish" finished
V=$(version)
SNAP=$("${C[@]}" -o /dev/null -w '%{size_download}' "${AUTH[@]}" -H "Accept-Encoding: zstd" "$URL/v1/models/$V")
served=0 refused=0 based=0
for ((u = 0; u < V; u++)); do
    sum=8
    for ((w = u + 1; w <= V; w++)); do sum=$((sum + 4 + $(stat -c %s "$STATE/checkpoints/delta-$w.bin"))); done
    code=$("${C[@]}" -o "$WORK/chain.bin" -w '%{http_code}' "${AUTH[@]}" "$URL/v1/models/$V/delta?from=$u")
    if [ "$sum" -lt "$SNAP" ]; then
        [ "$code" = 200 ] || die "chain $u..$V ($sum bytes < snapshot $SNAP): HTTP $code"
        got=$(stat -c %s "$WORK/chain.bin")
        entries=$(od -An -tu4 -j4 -N4 "$WORK/chain.bin" | tr -d ' ')
        if [ "$got" = "$sum" ]; then
            [ "$entries" = $((V - u)) ] || die "chain $u..$V: $entries entries"
        else
            [ "$got" -lt "$sum" ] || die "chain $u..$V is $got bytes, the plain chain $sum"
            [ "$entries" = $((V - u + 1)) ] || die "chain $u..$V ($got bytes): $entries entries"
            based=$((based + 1))
        fi
        served=$((served + 1))
    else
        [ "$code" = 404 ] || die "chain $u..$V ($sum bytes >= snapshot $SNAP): HTTP $code"
        grep -q "not smaller than the snapshot" "$WORK/chain.bin" || die "404: $(cat "$WORK/chain.bin")"
        refused=$((refused + 1))
    fi
done
[ "$served" -gt 0 ] && [ "$refused" -gt 0 ] && [ "$based" -gt 0 ] ||
    die "$served chains served ($based with a base), $refused refused"
stop_server

# 4. A tampered recipe (through a proxy): D falls back to a snapshot.
KEEP=100 start_server 13 4 --seed $SEED
PROXIED=0
if command -v python3 >/dev/null; then
    python3 "$(dirname "$0")/tamper_proxy.py" "$URL" "$WORK/proxy.port" 2>"$WORK/proxy.err" &
    PIDS+=("$!")
    wait_until 20 "the proxy" test -s "$WORK/proxy.port"
    start_client A 0
    APID=$LAST
    CURL_OVERRIDE="http://127.0.0.1:$(cat "$WORK/proxy.port")" start_client D 3
    DPID=$LAST
    wait_clients "$APID" "$DPID"
    grep -q "model 0 from its recipe failed: the model built from the recipe has digest" \
        "$WORK/D.log" || die "D did not detect the tampered recipe"
    grep -Eq "model 12: snapshot, [0-9]+ bytes, digest [0-9a-f]+ matches" "$WORK/D.log" ||
        die "D did not fall back to a snapshot"
    check_digests D
    PROXIED=1
else
    echo "python3 not found: the tampered-recipe proxy is not run" >&2
fi
for path in /v1/models/1/init /v1/models/00/init "/v1/models/0/init?x=1%00" /v1/models/0/init/x \
    /v1/models/-0/init; do
    code=$("${C[@]}" -o /dev/null -w '%{http_code}' "${AUTH[@]}" "$URL$path")
    case $code in 400 | 404) ;; *) die "GET $path: HTTP $code" ;; esac
done
[ "$("${C[@]}" -o /dev/null -w '%{http_code}' "$URL/v1/models/0/init")" = 401 ] ||
    die "the recipe is served without a token"
[ "$("${C[@]}" -o /dev/null -w '%{http_code}' -X POST "${AUTH[@]}" "$URL/v1/models/0/init")" = 405 ] ||
    die "POST to the recipe is not refused"
[ "$("${C[@]}" -o /dev/null -w '%{http_code}' "$URL/healthz")" = 200 ] || die "coordinator unhealthy"
cmp -s "$WORK/recipe.json" <("${C[@]}" "${AUTH[@]}" "$URL/v1/models/0/init") ||
    die "the coordinator's recipe changed"
wait_until 30 "the federation to finish" finished
stop_server

# 5. Another --seed: version 0 is not its initialisation, no recipe.
KEEP=100 start_server 14 5 --seed $((SEED + 1))
grep -q "no recipe for version 0: version 0 .* is not the initialisation from --seed $((SEED + 1))" \
    "$WORK/server.err" || die "the coordinator did not refuse the recipe"
[ "$("${C[@]}" -o /dev/null -w '%{http_code}' "${AUTH[@]}" "$URL/v1/models/0/init")" = 404 ] ||
    die "a recipe is served for a version 0 that is not the seed's"
start_client A 0
APID=$LAST
start_client E 4
EPID=$LAST
wait_clients "$APID" "$EPID"
grep -q "model 0: no recipe (HTTP 404): taking the snapshot" "$WORK/E.log" ||
    die "E did not fall back to a snapshot"
grep -Eq "model 13: snapshot, [0-9]+ bytes, digest [0-9a-f]+ matches" "$WORK/E.log" ||
    die "E's snapshot was not checked"
check_digests E
stop_server

# 6. --downlink-keep 0 (the default) after a round: the deltas no chain
# smaller than the snapshot can use are removed, the others kept; the
# recipe is withdrawn once the delta from version 0 is gone.
start_server 15 5 --seed $SEED
grep -q "version 0 is the initialisation from --seed $SEED" "$WORK/server.err" ||
    die "the restarted coordinator did not publish the recipe"
start_client A 0
APID=$LAST
start_client C 2
CPID=$LAST
wait_clients "$APID" "$CPID"
wait_until 30 "the federation to finish" finished
V=$(version)
SNAP=$("${C[@]}" -o /dev/null -w '%{size_download}' "${AUTH[@]}" -H "Accept-Encoding: zstd" "$URL/v1/models/$V")
k=$V sum=8
while [ -f "$STATE/checkpoints/delta-$k.bin" ]; do
    sum=$((sum + 4 + $(stat -c %s "$STATE/checkpoints/delta-$k.bin")))
    k=$((k - 1))
done
[ "$k" -ge 1 ] || die "every delta is still kept"
[ "$k" -lt "$V" ] || die "no delta is kept"
[ "$sum" -lt "$SNAP" ] || die "the kept deltas ($sum bytes) reach the snapshot ($SNAP)"
for ((w = 1; w < k; w++)); do
    [ -f "$STATE/checkpoints/delta-$w.bin" ] && die "delta $w is kept below the gap at $k"
done
[ "$("${C[@]}" -o /dev/null -w '%{http_code}' "${AUTH[@]}" "$URL/v1/models/$V/delta?from=$k")" = 200 ] ||
    die "the chain of every kept delta is not served"
[ "$("${C[@]}" -o /dev/null -w '%{http_code}' "${AUTH[@]}" "$URL/v1/models/$V/delta?from=$((k - 1))")" = 404 ] ||
    die "a chain with a removed delta is served"
[ "$("${C[@]}" -o /dev/null -w '%{http_code}' "${AUTH[@]}" "$URL/v1/models/0/init")" = 404 ] ||
    die "the recipe is served without the deltas from version 0"
stop_server
echo "PASS test_downlink_init (tampered recipe via proxy: $PROXIED, $((SECONDS - T_START)) s)"
