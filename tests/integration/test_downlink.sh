#!/usr/bin/env bash
# The compressed downlink with real processes on loopback: a coordinator
# with --downlink topk:0.05 --downlink-keep 6 (mlp, uniform 5% uplink, 20
# steps a round) and clients A and B that take part in every round, and C,
# which is started for one round at a time (after the first, with A held
# by SIGSTOP, so that the federation waits for C's update instead of running
# to its end while C starts):
#  1. C's first round starts from version 0 built from its recipe (no
#     snapshot; test_downlink_init.sh covers the recipe); restarted two or
#     more versions later it rebuilds the model from a chain of deltas;
#  2. with its cached model corrupted, the rebuilt model's digest differs:
#     C logs it and resynchronises from a snapshot;
#  3. with a delta file of the coordinator corrupted, the chain does not
#     decode: C resynchronises from a snapshot;
#  4. restarted more than 6 versions behind, it gets a snapshot (the deltas
#     are no longer kept).
# Every model any client used (snapshot, cached copy or rebuilt) has the
# digest the coordinator logged for that version, which is also the SHA-256
# of the float bytes of the coordinator's checkpoint of x̂; the clients'
# cached models at the end are byte for byte the coordinator's x̂. Then
# /metrics' downlink counter is checked against response bodies: it grows by
# exactly the model and delta bodies curl receives with a 200 (snapshots raw
# and zstd, delta chains; 304s, HEAD and refusals add nothing), and it
# equals the sum of the rounds' downlink bytes (a body sent between two
# rounds counts in the later one). Finally a restarted
# coordinator serves the same model and delta bytes.
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
CLIENT="$BUILD/strata-client"
for x in "$SERVER" "$CLIENT"; do [ -x "$x" ] || fail "no $x"; done
command -v curl >/dev/null || fail "curl is required"
export OMP_WAIT_POLICY=passive
T_START=$SECONDS
DEADLINE=$((SECONDS + 150))
ROUNDS=30
STATE="$WORK/state"
SECRET=downlink-s3cret

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
version_at_least() { [ "$(version)" -ge "$1" ]; }

start_server() {
    "$SERVER" --state-dir "$STATE" --model mlp --data "$DATA" --port 0 --rounds $ROUNDS \
        --min-clients 3 --clients-per-round 2 --over-select 0.5 --min-updates 2 \
        --round-deadline 60 --policy uniform --density 0.05 --max-steps 20 \
        --downlink topk:0.05 --downlink-keep 6 --enrolment-secret $SECRET \
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
start_server
[ "$(json_field "$(get /v1/status)" downlink)" = "topk:0.05" ] || die "status: $(get /v1/status)"

start_client() { # start_client NAME INDEX [extra options]
    local name=$1 idx=$2
    shift 2
    "$CLIENT" --server "$URL" --state-dir "$WORK/$name" --data "$DATA" --partition iid \
        --num-clients 3 --client-index "$idx" --threads 1 --poll-wait 5 \
        --enrolment-secret $SECRET "$@" >>"$WORK/$name.log" 2>&1 &
    LAST=$!
    PIDS+=("$LAST")
}
run_c() { # run_c [hold]: one round of client C, waited for; with hold, A
    # is stopped meanwhile, so no round closes without C's update and the
    # federation moves on by a version or two, not by as many rounds as C
    # loses to A and B while it starts (which can run it to its last round)
    [ -z "${1:-}" ] || kill -STOP "$APID"
    start_client C 2 --max-rounds 1
    local pid=$LAST
    wait_until 60 "client C's round" exited "$pid"
    reap "$pid"
    [ -z "${1:-}" ] || kill -CONT "$APID"
    [ "$REAPED_RC" -eq 0 ] || die "client C exit status $REAPED_RC"
}
cached_version() { sed -n 's/^"m\([0-9]*\)"$/\1/p' "$WORK/C/model.etag"; }

start_client A 0
APID=$LAST
start_client B 1
BPID=$LAST
# 1. The first round from version 0's recipe, then a chain of deltas.
run_c
grep -q "model 0: built from its recipe" "$WORK/C.log" || die "C did not build version 0"
grep -Eq "model [0-9]+: snapshot" "$WORK/C.log" && die "C's first model is a snapshot"
v0=$(cached_version)
wait_until 60 "two versions past C's" version_at_least $((v0 + 2))
run_c hold
grep -Eq "model [0-9]+: [2-6] deltas( and a base)? from version $v0," "$WORK/C.log" ||
    die "C did not rebuild from a chain of deltas from version $v0"

# 2. A corrupted cached model: the digest after the deltas differs. The
# bytes changed lie in fc1.weight (the first tensor after the header),
# which the deltas carry: a tensor that a chain's base sets (a bias) would
# be repaired by it, not detected.
v1=$(cached_version)
[ "$v1" -gt "$v0" ] || die "C's cache did not move on ($v0 -> $v1)"
wait_until 60 "a version past C's" version_at_least $((v1 + 1))
f="$WORK/C/model.safetensors"
hlen=$(od -An -tu8 -N8 "$f" | tr -d ' ')
printf '\x3f\x7f' | dd of="$f" bs=1 seek=$((8 + hlen + 1002)) conv=notrunc status=none
run_c hold
grep -Eq "deltas from version $v1 failed: the model rebuilt for version [0-9]+ has digest" \
    "$WORK/C.log" || die "the corrupted cache was not detected by its digest"
grep -q "resynchronising from a snapshot" "$WORK/C.log" || die "C did not resynchronise"

# 3. A corrupted delta file on the coordinator: the chain does not decode.
v2=$(cached_version)
wait_until 60 "a version past C's" version_at_least $((v2 + 1))
d="$STATE/checkpoints/delta-$((v2 + 1)).bin"
[ -f "$d" ] || die "no $d"
printf '\x00\x01\x02\x03' | dd of="$d" bs=1 seek=40 conv=notrunc status=none
run_c hold
grep -Eq "deltas from version $v2 failed: .*(checksum|zstd|decod|frame)" "$WORK/C.log" ||
    die "the corrupted delta was not detected"
[ "$(grep -c "resynchronising from a snapshot" "$WORK/C.log")" -ge 2 ] || die "no second resync"

# 4. More than --downlink-keep versions behind: a snapshot.
v3=$(cached_version)
wait_until 60 "seven versions past C's" version_at_least $((v3 + 7))
[ -f "$STATE/checkpoints/delta-$((v3 + 1)).bin" ] && die "delta $((v3 + 1)) was not pruned"
run_c hold
grep -q "no deltas from version $v3 (HTTP 404): taking the snapshot" "$WORK/C.log" ||
    die "C was not sent to the snapshot"

wait_until 90 "clients A and B to finish" eval 'exited $APID && exited $BPID'
for p in "$APID" "$BPID"; do
    reap "$p"
    [ "$REAPED_RC" -eq 0 ] || die "client exit status $REAPED_RC"
done
[ "$(json_field "$(get /v1/status)" state)" = finished ] || die "status: $(get /v1/status)"

# Every model a client used has the coordinator's digest for its version,
# which is the SHA-256 of the float bytes of the checkpoint of x̂.
data_sha() { # the SHA-256 of a safetensors file's data section
    local hl
    hl=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    tail -c +$((8 + hl + 1)) "$1" | sha256sum | cut -d' ' -f1
}
declare -A SD
while read -r v dg; do SD[$v]=$dg; done < <(sed -n 's/.*downlink delta [0-9]* bytes ([^)]*), model \([0-9]*\) digest \([0-9a-f]*\);.*/\1 \2/p' "$WORK/server.err")
[ "${#SD[@]}" -ge $((ROUNDS - 1)) ] || die "the coordinator logged ${#SD[@]} digests"
for v in "${!SD[@]}"; do
    [ "$(data_sha "$STATE/checkpoints/model-$v.safetensors")" = "${SD[$v]}" ] ||
        die "version $v: the checkpoint of x̂ does not have the logged digest"
done
SD[0]=$(data_sha "$STATE/checkpoints/model-0.safetensors")
checked=0
for n in A B C; do
    while read -r v dg; do
        [ "${SD[$v]:-}" = "$dg" ] || die "client $n used model $v with digest $dg, not ${SD[$v]:-none}"
        checked=$((checked + 1))
    done < <(sed -n 's/.*model \([0-9]*\): .*digest \([0-9a-f]*\) matches.*/\1 \2/p' "$WORK/$n.log")
    rounds=$(grep -c "uploaded .* bytes" "$WORK/$n.log" || true)
    models=$(grep -c "digest [0-9a-f]* matches" "$WORK/$n.log" || true)
    [ "$models" -ge "$rounds" ] || die "client $n: $rounds rounds, $models checked models"
    v=$(sed -n 's/^"m\([0-9]*\)"$/\1/p' "$WORK/$n/model.etag")
    [ "$(data_sha "$WORK/$n/model.safetensors")" = "${SD[$v]}" ] ||
        die "client $n's cached model $v is not the coordinator's x̂"
done
# A and B rebuild nearly every version from a one-delta chain; A, held for
# four of C's rounds, may miss up to two versions each time.
chains=$(cat "$WORK/A.log" "$WORK/B.log" | grep -c "1 deltas from version" || true)
[ "$chains" -ge $((2 * (ROUNDS - 3) - 8)) ] || die "A and B rebuilt only $chains models from deltas"

# /metrics' downlink counter: the sum of the rounds' downlink bytes, and it
# grows by exactly the bodies served.
sum=0
dsum=0
for ((r = 0; r < ROUNDS; r++)); do
    s=$(get "/v1/rounds/$r")
    sum=$((sum + $(json_field "$s" downlink_bytes)))
    dsum=$((dsum + $(json_field "$s" dense_total_bytes)))
    [ "$(json_field "$s" total_bytes)" = $(($(json_field "$s" uplink_bytes) + $(json_field "$s" downlink_bytes))) ] ||
        die "round $r: total_bytes is not uplink + downlink: $s"
done
m0=$(metric strata_downlink_bytes_total)
[ "$m0" = "$sum" ] || die "downlink counter $m0, rounds' downlink bytes $sum"
[ "$(metric strata_dense_fedavg_bytes_total)" = "$dsum" ] ||
    die "dense counter $(metric strata_dense_fedavg_bytes_total), rounds' dense totals $dsum"
TOK=$(json_field "$(cat "$WORK/A/identity.json")" token)
V=$(version)
bytes=0
fetch() { # fetch CODE CURL-ARGS...: expects HTTP CODE; adds a 200's body size
    local want=$1 out
    shift
    out=$("${C[@]}" -o /dev/null -w '%{http_code} %{size_download}' -H "Authorization: Bearer $TOK" "$@")
    [ "${out% *}" = "$want" ] || die "$*: HTTP ${out% *}, expected $want"
    [ "$want" != 200 ] || bytes=$((bytes + ${out#* }))
}
fetch 200 "$URL/v1/models/$V"
fetch 200 -H "Accept-Encoding: zstd" "$URL/v1/models/$V"
fetch 200 "$URL/v1/models/$V/delta?from=$((V - 2))"
fetch 304 -H "If-None-Match: \"m$V\"" "$URL/v1/models/$V"
fetch 304 -H "If-None-Match: \"d$((V - 2))-$V\"" "$URL/v1/models/$V/delta?from=$((V - 2))"
fetch 200 -I "$URL/v1/models/$V" # HEAD: no body
fetch 404 "$URL/v1/models/$V/delta?from=0"
fetch 400 "$URL/v1/models/$V/delta?from=$V"
fetch 404 "$URL/v1/models/$((V + 1))"
code=$("${C[@]}" -o "$WORK/chain.bin" -w '%{http_code}' -H "Authorization: Bearer $TOK" \
    "$URL/v1/models/$V/delta?from=$((V - 2))")
[ "$code" = 200 ] || die "delta chain: HTTP $code"
[ "$(head -c 4 "$WORK/chain.bin")" = SDC1 ] || die "the chain does not start with SDC1"
bytes=$((bytes + $(stat -c %s "$WORK/chain.bin")))
[ "$("${C[@]}" -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TOK" "$URL/v1/models/$V/delta?from=x")" = 400 ] ||
    die "a bad from was not refused"
m1=$(metric strata_downlink_bytes_total)
[ $((m1 - m0)) -eq $((bytes)) ] || die "downlink counter grew by $((m1 - m0)), bodies $bytes"
[ "$bytes" -gt 0 ] || die "no bodies"

"${C[@]}" -o "$WORK/model.bin" -H "Authorization: Bearer $TOK" "$URL/v1/models/$V"

# The coordinator evaluates x and x̂ on one evaluation model into which it
# copies them: the accuracies it logged for the last two versions are those
# of their checkpoints (x̂; x of the latest) evaluated on their own.
acc_of() { # the test accuracy of a checkpoint
    "$TOOL" eval --model "$1" --data "$DATA" --json | sed -n 's/.*"test_accuracy":\([0-9.e-]*\).*/\1/p'
}
near() { # near A B: |A - B| at most two of the 10,000 test images
    awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; exit !(a != "" && b != "" && d < 0.00025 && d > -0.00025) }'
}
for v in $((V - 1)) "$V"; do
    line=$(grep "model $v digest [0-9a-f]*; served model" "$WORK/server.err" | tail -n 1)
    logged=$(echo "$line" | sed -n 's/.*served model x̂ accuracy \([0-9.]*\).*/\1/p')
    got=$(acc_of "$STATE/checkpoints/model-$v.safetensors")
    near "$logged" "$got" || die "version $v: x̂'s logged accuracy '$logged', its checkpoint's $got"
done
logged=$(echo "$line" | sed -n 's/.*server model x accuracy \([0-9.]*\).*/\1/p')
got=$(acc_of "$STATE/checkpoints/server-model-$V.safetensors")
near "$logged" "$got" || die "version $V: x's logged accuracy '$logged', its checkpoint's $got"

# A restarted coordinator serves the same bytes (x̂, its deltas).
kill -TERM "$SPID"
wait_until 20 "the server to stop" exited "$SPID"
reap "$SPID"
start_server
"${C[@]}" -o "$WORK/chain2.bin" -H "Authorization: Bearer $TOK" "$URL/v1/models/$V/delta?from=$((V - 2))"
"${C[@]}" -o "$WORK/model2.bin" -H "Authorization: Bearer $TOK" "$URL/v1/models/$V"
cmp -s "$WORK/chain.bin" "$WORK/chain2.bin" || die "the restarted coordinator serves another chain"
cmp -s "$WORK/model.bin" "$WORK/model2.bin" || die "the restarted coordinator serves another model"
[ "$(version)" = "$V" ] || die "the restarted coordinator is at version $(version), not $V"
kill -TERM "$SPID"
wait_until 20 "the server to stop" exited "$SPID"
reap "$SPID"
echo "PASS test_downlink ($checked models checked, $chains one-delta rebuilds by A and B, $((SECONDS - T_START)) s)"
