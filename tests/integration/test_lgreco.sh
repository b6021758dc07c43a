#!/usr/bin/env bash
# The lgreco closed loop with a real coordinator and real clients (issue
# "budgets that adapt", must-show 1).
#
# Part 1: strata-server with {"type":"lgreco","lgreco_every":2}, mlp, 3
# strata-client processes, 6 rounds. Rounds 0, 2 and 4 ask for error tables
# (task.error_candidates); each of their closes solves the averaged table.
# Checked from /v1/rounds/{r}: round 0 runs uniform (topk 1% on every large
# layer, small layers dense); every solve reports an error within the
# budget (the uniform allocation's error) and fewer estimated bytes than
# uniform; round 1's budgets are the allocation round 0 published, differ
# from round 0's and are not all one density; the run's uplink is below a
# uniform run's (same seed, same clients); after a restart the coordinator
# puts the last allocation back.
#
# Part 3: three clients over curl, one of them lying (errors of 1e300): the
# combined table is the coordinate-wise median and ignores it.
#
# Part 2: one client over curl against a fresh coordinator: uploads whose
# metadata has no table, a table with a missing row, a negative, NaN-free
# but out-of-range entry, a row too long (oversized), or a table in a round
# that asked for none, are refused with 422 and change nothing (no
# participant); the same update with a well-formed table is accepted.
source "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
CLIENT="$BUILD/strata-client"
FORGE="$BUILD/payload_forge"
for b in "$SERVER" "$CLIENT" "$FORGE"; do [ -x "$b" ] || fail "no $b"; done
command -v curl >/dev/null || fail "curl is required"
C=(curl -sS --max-time 20)


LG='{"type":"lgreco","lgreco_every":2}'
ROUNDS=6

# start_server DIR POLICY ROUNDS CLIENTS: a coordinator on a free port; sets
# URL and SPID.
start_server() {
    : >"$1/server.out" # wait_listening reads the listening line of this start
    "$SERVER" --state-dir "$1/state" --model mlp --data "$DATA" --port 0 --rounds "$3" \
        --min-clients "$4" --clients-per-round "$4" --policy "$2" --density 0.01 --seed 7 \
        --round-deadline 120 --enrolment-secret lg-s3cret >>"$1/server.out" 2>>"$1/server.err" &
    SPID=$!
    PIDS+=("$SPID")
    wait_listening "$SPID" "$1/server.out" "$1/server.err"
}

stop_server() {
    kill -TERM "$SPID"
    reap "$SPID"
    [ "$REAPED_RC" = 0 ] || fail "coordinator exit status $REAPED_RC: $(tail -n 5 "$1/server.err")"
}

# federation DIR POLICY: 3 clients, ROUNDS rounds, Dirichlet shares; leaves
# the coordinator running (URL, SPID) once every round is closed.
federation() {
    local dir=$1 i pids=()
    mkdir -p "$dir"
    start_server "$dir" "$2" "$ROUNDS" 3
    for i in 0 1 2; do
        "$CLIENT" --server "$URL" --enrolment-secret lg-s3cret --data "$DATA" \
            --num-clients 3 --client-index "$i" --partition dirichlet:0.5 --seed 7 \
            --state-dir "$dir/c$i" \
            >"$dir/c$i.out" 2>"$dir/c$i.err" &
        pids+=($!)
        PIDS+=($!)
    done
    for i in 0 1 2; do
        timeout 600 tail --pid="${pids[i]}" -f /dev/null || fail "$2: client $i did not finish"
        reap "${pids[i]}"
        [ "$REAPED_RC" = 0 ] || fail "$2: client $i exit $REAPED_RC: $(tail -n 5 "$dir/c$i.err")"
    done
}

# Sums a key over rounds 0..ROUNDS-1 of the coordinator at URL.
sum_rounds() {
    local r total=0 body
    for ((r = 0; r < ROUNDS; r++)); do
        body=$("${C[@]}" -f "$URL/v1/rounds/$r") || fail "GET /v1/rounds/$r"
        total=$((total + $(json_field "$body" "$1")))
    done
    echo "$total"
}

# compressors JSON: the round's "compressors" object, compact.
compressors() {
    printf '%s' "$1" | grep -o '"compressors":{[^}]*}'
}

# --- part 1 -------------------------------------------------------------------
federation "$WORK/uniform" uniform
uni_bytes=$(sum_rounds uplink_bytes)
stop_server "$WORK/uniform"

federation "$WORK/lgreco" "$LG"
lg_bytes=$(sum_rounds uplink_bytes)
echo "uplink over $ROUNDS rounds: uniform $uni_bytes bytes, lgreco $lg_bytes bytes"
[ "$lg_bytes" -lt "$uni_bytes" ] || fail "lgreco spent $lg_bytes bytes, uniform $uni_bytes"

r0=$("${C[@]}" -f "$URL/v1/rounds/0")
r1=$("${C[@]}" -f "$URL/v1/rounds/1")
c0=$(compressors "$r0")
c1=$(compressors "$r1")
echo "round 0: $c0"
echo "round 1: $c1"
# Round 0 is uniform: the large layers at 1%, the biases dense.
echo "$c0" | grep -q '"fc1.weight":"topk:0.01"' || fail "round 0 is not uniform: $c0"
echo "$c0" | grep -q '"fc1.bias":"none"' || fail "round 0 is not uniform: $c0"
[ "$c0" != "$c1" ] || fail "round 1's budgets are round 0's: $c1"
# The allocation round 0 published is what round 1 used.
alloc=$(printf '%s' "$r0" | grep -o '"allocation":{[^}]*}' | sed 's/"allocation"/"compressors"/')
[ "$alloc" = "$c1" ] || fail "round 1 ($c1) does not use round 0's allocation ($alloc)"
# Per layer, not one density: at least two distinct specifications among
# the compressed layers.
distinct=$(printf '%s' "$c1" | grep -o '"[^"]*":"[^"]*"' | cut -d'"' -f4 | sort -u | wc -l)
[ "$distinct" -ge 2 ] || fail "round 1 uses one budget everywhere: $c1"
for r in 0 2 4; do
    body=$("${C[@]}" -f "$URL/v1/rounds/$r")
    lg=$(printf '%s' "$body" | grep -o '"lgreco":{[^{]*') || fail "round $r: no lgreco solve: $body"
    eb=$(json_field "$lg" error_budget)
    ce=$(json_field "$lg" chosen_error)
    by=$(json_field "$lg" bytes)
    ub=$(json_field "$lg" uniform_bytes)
    echo "round $r: error $ce within $eb, $by bytes vs uniform $ub"
    awk -v a="$ce" -v b="$eb" 'BEGIN { exit !(a <= b) }' || fail "round $r: error $ce > $eb"
    awk -v a="$by" -v b="$ub" 'BEGIN { exit !(a < b) }' || fail "round $r: $by bytes >= $ub"
done
for r in 1 3 5; do
    body=$("${C[@]}" -f "$URL/v1/rounds/$r") || fail "GET /v1/rounds/$r"
    ! grep -q '"lgreco"' <<<"$body" || fail "round $r solved a table: $body"
done
acc=$(json_field "$("${C[@]}" -f "$URL/v1/rounds/5")" accuracy)
acc0=$(json_field "$r0" accuracy)
assert_gt "$acc" "$acc0" "accuracy after $ROUNDS lgreco rounds against round 0's"
stop_server "$WORK/lgreco"
# A restart puts the last allocation back.
start_server "$WORK/lgreco" "$LG" "$ROUNDS" 3
grep -q "lgreco: the allocation solved at round 4 is back in use" "$WORK/lgreco/server.err" ||
    fail "the restarted coordinator did not restore the allocation: $(tail -n 5 "$WORK/lgreco/server.err")"
stop_server "$WORK/lgreco"

# --- part 2 -------------------------------------------------------------------
dir="$WORK/bad"
mkdir -p "$dir"
start_server "$dir" "$LG" 3 1
body=$("${C[@]}" -f -X POST -H 'Content-Type: application/json' \
    -d '{"name":"lg-0","enrolment_secret":"lg-s3cret"}' "$URL/v1/clients") || fail "register"
id=$(json_field "$body" client_id)
tok=$(json_field "$body" token)
task=$("${C[@]}" -f -H "Authorization: Bearer $tok" "$URL/v1/tasks/next?wait=10") || fail "task"
ncand=$(printf '%s' "$task" | grep -o '"error_candidates":\[[^]]*\]' | grep -o '"compressor"' | wc -l)
[ "$ncand" -gt 10 ] || fail "round 0 asks for $ncand candidates: $task"
"${C[@]}" -f -H "Authorization: Bearer $tok" -o "$dir/w0.safetensors" "$URL/v1/models/0" ||
    fail "model 0"
"$BUILD/agg_check" delta --like "$dir/w0.safetensors" --seed 3 --scale 0.01 \
    --out "$dir/delta.safetensors" || fail "delta"
"$TOOL" compress --in "$dir/delta.safetensors" --policy "$LG" --density 0.01 --round 0 \
    --rounds 3 --out "$dir/up.bin" --client-id "$id" --model-version 0 --samples 100 \
    >/dev/null || fail "compress"
nlayers=$(printf '%s' "$task" | grep -o '"layer":' | wc -l)

# table ROWS COLS VALUE: an error table as metadata JSON.
table() {
    awk -v r="$1" -v c="$2" -v v="$3" 'BEGIN {
        printf "{\"train_loss\":1.0,\"error_table\":[";
        for (i = 0; i < r; i++) {
            printf "%s[", i ? "," : "";
            for (j = 0; j < c; j++) printf "%s%s", j ? "," : "", v;
            printf "]";
        }
        printf "]}";
    }'
}

upload() { # upload FILE ROUND: prints the HTTP status and the body
    "${C[@]}" -X POST -H "Authorization: Bearer $tok" -H 'Content-Type: application/octet-stream' \
        --data-binary @"$1" -w ' %{http_code}' "$URL/v1/rounds/$2/updates"
}

bad_cases=(
    '{"train_loss":1.0}|missing'
    "$(table $((nlayers - 1)) "$ncand" 1.5)|rows"
    "$(table "$nlayers" "$ncand" -2)|finite number >= 0"
    "$(table "$nlayers" $((ncand + 1)) 1.5)|numbers"
    "$(table "$nlayers" "$ncand" '"x"')|finite number >= 0"
)
i=0
for c in "${bad_cases[@]}"; do
    meta=${c%|*}
    want=${c##*|}
    "$FORGE" --in "$dir/up.bin" --out "$dir/bad$i.bin" --metadata "$meta" || fail "forge $i"
    out=$(upload "$dir/bad$i.bin" 0)
    [ "${out##* }" = 422 ] || fail "bad table $i: expected 422, got $out"
    echo "$out" | grep -q "error_table" || fail "bad table $i: $out"
    echo "$out" | grep -qF "$want" || fail "bad table $i: no \"$want\" in $out"
    [ "$(json_field "$("${C[@]}" -f "$URL/v1/rounds/0")" participants)" = 0 ] ||
        fail "bad table $i changed the round"
    i=$((i + 1))
done
"$FORGE" --in "$dir/up.bin" --out "$dir/good.bin" --metadata "$(table "$nlayers" "$ncand" 0.25)" ||
    fail "forge good"
out=$(upload "$dir/good.bin" 0)
[ "${out##* }" = 200 ] || fail "a well-formed table: expected 200, got $out"
for _ in $(seq 1 100); do
    body=$("${C[@]}" "$URL/v1/rounds/0")
    [ "$(json_field "$body" state)" = closed ] && break
    sleep 0.2
done
echo "$body" | grep -q '"lgreco":{' || fail "round 0 closed without a solve: $body"
# Round 1 asks for no table: one is refused.
task=$("${C[@]}" -f -H "Authorization: Bearer $tok" "$URL/v1/tasks/next?wait=10") || fail "task 1"
echo "$task" | grep -q '"error_candidates":\[\]' || fail "round 1 asks for a table: $task"
stop_server "$dir"

# --- part 3 -------------------------------------------------------------------
# Three clients over curl; one claims errors of 1e300 everywhere. The
# coordinate-wise median of the three tables ignores it: the error budget
# stays on the honest tables' scale and the round closes.
dir="$WORK/liar"
mkdir -p "$dir"
start_server "$dir" "$LG" 3 3
toks=()
for i in 0 1 2; do
    body=$("${C[@]}" -f -X POST -H 'Content-Type: application/json' \
        -d "{\"name\":\"lg-$i\",\"enrolment_secret\":\"lg-s3cret\"}" "$URL/v1/clients") ||
        fail "register $i"
    ids[i]=$(json_field "$body" client_id)
    toks[i]=$(json_field "$body" token)
done
for i in 0 1 2; do
    tok=${toks[i]}
    "${C[@]}" -f -H "Authorization: Bearer $tok" "$URL/v1/tasks/next?wait=10" >/dev/null ||
        fail "task $i"
    "$TOOL" compress --in "$WORK/bad/delta.safetensors" --policy "$LG" --density 0.01 --round 0 \
        --rounds 3 --out "$dir/up$i.bin" --client-id "${ids[i]}" --model-version 0 \
        --samples 100 >/dev/null || fail "compress $i"
    v=0.5
    [ "$i" = 2 ] && v=1e300
    "$FORGE" --in "$dir/up$i.bin" --out "$dir/t$i.bin" --metadata "$(table "$nlayers" "$ncand" $v)" ||
        fail "forge $i"
    out=$(upload "$dir/t$i.bin" 0)
    [ "${out##* }" = 200 ] || fail "upload $i: $out"
done
for _ in $(seq 1 100); do
    body=$("${C[@]}" "$URL/v1/rounds/0")
    [ "$(json_field "$body" state)" = closed ] && break
    sleep 0.2
done
lg=$(printf '%s' "$body" | grep -o '"lgreco":{[^{]*') || fail "no solve with a lying client: $body"
eb=$(json_field "$lg" error_budget)
echo "error budget with one client claiming 1e300: $eb"
awk -v e="$eb" 'BEGIN { exit !(e < 1e6) }' || fail "the lying table moved the budget to $eb"
stop_server "$dir"
echo "PASS test_lgreco (uplink: uniform $uni_bytes, lgreco $lg_bytes bytes)"
