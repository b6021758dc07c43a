#!/usr/bin/env bash
# A matrix of bad requests against one real coordinator: one case per rule
# (authentication, content types, JSON parsing, limits, each upload
# validation rule, decoder refusals, unknown rounds and routes). Every case
# must be answered with its status and a JSON error {"error":{"code","message"}},
# count exactly one strata_requests_rejected_total{reason=<code>} (and, for
# uploads, one strata_updates_rejected_total{reason=...}) and leave the
# coordinator's state as it was: /v1/status, round 0's summary, the accepted
# and completed counters, the rows of the SQLite tables (the stored payloads'
# count and bytes among them) and the files under checkpoints/ are compared before and after each case. Finally both selected
# clients upload correct updates and round 0 closes normally.
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
FORGE="$BUILD/payload_forge"
[ -x "$SERVER" ] || fail "no $SERVER"
[ -x "$FORGE" ] || fail "no $FORGE"
command -v curl >/dev/null || fail "curl is required"
command -v sqlite3 >/dev/null || fail "sqlite3 is required (scripts/setup.sh)"
START=$(date +%s)

SPID=""
cleanup() {
    if [ -n "$SPID" ]; then
        kill "$SPID" 2>/dev/null || true
        wait "$SPID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# Limits small enough for every refusal to be reachable: a correct update is
# ~40 KB and a dense one (--policy none) ~700 KB, both under MAX_BODY.
MAX_BODY=1048576
RATE=15
SECRET=s3cret
STATE="$WORK/state"
"$SERVER" --state-dir "$STATE" --model mlp --data "$DATA" --port 0 --rounds 2 --min-clients 2 \
    --clients-per-round 2 --policy uniform --density 0.05 --round-deadline 120 --min-updates 2 \
    --enrolment-secret "$SECRET" --max-body-bytes "$MAX_BODY" --max-json-bytes 1024 \
    --max-json-depth 8 --max-clients 3 --upload-rate "$RATE" \
    >"$WORK/server.out" 2>"$WORK/server.err" &
SPID=$!
wait_listening "$SPID" "$WORK/server.out" "$WORK/server.err"
ADMIN=$(head -n 1 "$STATE/admin.token")
[ ${#ADMIN} -ge 16 ] || fail "admin token '$ADMIN'"

C=(curl -sS --max-time 20)
J=(-H 'Content-Type: application/json')
B=(-H 'Content-Type: application/octet-stream')
# req METHOD PATH [curl args...]: sets CODE and BODY.
req() {
    local m=$1 p=$2
    shift 2
    CODE=$("${C[@]}" -X "$m" -o "$WORK/body" -w '%{http_code}' "$@" "$URL$p")
    BODY=$(tr -d '\000' <"$WORK/body")
}
expect() { [ "$CODE" = "$1" ] || fail "$2: HTTP $CODE, expected $1 ($BODY)"; }
metrics() { "${C[@]}" "$URL/metrics" >"$1" || fail "GET /metrics"; }

# ---- set-up: two clients, round 0 opens, payloads ------------------------
register() {
    req POST /v1/clients "${J[@]}" -d "{\"name\":\"$1\",\"enrolment_secret\":\"$SECRET\"}"
    expect 201 "register $1"
    REG_TOKEN=$(json_field "$BODY" token)
    REG_ID=$(json_field "$BODY" client_id)
}
register edge-a
TA=$REG_TOKEN IDA=$REG_ID
register edge-b
TB=$REG_TOKEN IDB=$REG_ID
AA=(-H "Authorization: Bearer $TA")
AB=(-H "Authorization: Bearer $TB")
AD=(-H "Authorization: Bearer $ADMIN")
req GET /v1/admin/config "${AD[@]}"
expect 200 "admin config with the admin token"
echo "$BODY" | grep -q "\"upload_rate\":$RATE" || fail "admin config: $BODY"
req GET '/v1/tasks/next?wait=10' "${AA[@]}"
expect 200 "task of client A"
TASK=$BODY
[ "$(json_field "$TASK" round)" = 0 ] || fail "task: $TASK"
[ "$(json_field "$TASK" model_version)" = 0 ] || fail "task: $TASK"
echo "$TASK" | grep -q '"layer":"fc1.weight","compressor":"topk","density":0.05' ||
    fail "task budgets: $TASK"
req GET '/v1/tasks/next' "${AB[@]}"
expect 200 "task of client B"
"${C[@]}" -o "$WORK/model.safetensors" "${AA[@]}" "$URL/v1/models/0" || fail "model download"

# pay OUT CLIENT [compress options...]: a payload of the round 0 task; the
# options given replace the defaults (a repeated option: the last one wins).
pay() {
    local out=$1 cid=$2
    shift 2
    "$TOOL" compress --in "$WORK/model.safetensors" --policy uniform --density 0.05 --round 0 \
        --rounds 2 --model-version 0 --samples 100 --client-id "$cid" "$@" \
        --out "$WORK/$out" >/dev/null || fail "compress $out"
}
pay good-a.bin "$IDA"
pay good-b.bin "$IDB"
pay ver.bin "$IDA" --model-version 1
pay round.bin "$IDA" --round 1
pay samples.bin "$IDA" --samples 0
pay density.bin "$IDA" --density 0.1
pay dense.bin "$IDA" --policy none
pay fp16.bin "$IDA" --values fp16
pay r99.bin "$IDA" --round 99 --rounds 100
# Models of another shape: fc3 without bias (5 tensors instead of 6), fc2
# one unit narrower (same tensor count, fewer elements), fc2 one unit wider
# (more elements than the model) and an extra layer fc4 (8 tensors).
arch() {
    printf '{"name":"%s","input":[1,28,28],"layers":[{"type":"flatten"},' "$1"
    printf '{"type":"linear","name":"fc1","out_features":200},{"type":"relu"},'
    printf '{"type":"linear","name":"fc2","out_features":%s},{"type":"relu"},' "$2"
    printf '{"type":"linear","name":"fc3","out_features":10,"bias":%s}%s]}\n' "$3" "${4:-}"
}
arch nobias 200 false >"$WORK/nobias.json"
arch narrow 199 true >"$WORK/narrow.json"
arch wide 201 true >"$WORK/wide.json"
arch extra 200 true ',{"type":"relu"},{"type":"linear","name":"fc4","out_features":10}' \
    >"$WORK/extra.json"
for m in nobias narrow wide extra; do
    "$TOOL" train --model "$WORK/$m.json" --data "$DATA" --epochs 1 --limit 32 --threads 1 \
        --out "$WORK/$m.safetensors" >"$WORK/train.log" 2>&1 ||
        fail "train $m: $(cat "$WORK/train.log")"
    "$TOOL" compress --in "$WORK/$m.safetensors" --policy uniform --density 0.05 --round 0 \
        --rounds 2 --model-version 0 --samples 100 --client-id "$IDA" --out "$WORK/$m.bin" \
        >/dev/null || fail "compress $m"
done
# Payloads the encoder refuses to write, forged from B's correct one; the
# decoder of strata-tool refuses each of them too.
while IFS='|' read -r m msg; do
    "$FORGE" --in "$WORK/good-b.bin" --out "$WORK/$m.bin" --"$m" || fail "payload_forge --$m"
    if "$TOOL" inspect "$WORK/$m.bin" >/dev/null 2>"$WORK/inspect.err"; then
        fail "strata-tool inspect accepts the --$m payload"
    fi
    grep -Eq "$msg" "$WORK/inspect.err" || fail "inspect --$m: $(cat "$WORK/inspect.err")"
done <<'EOF'
nan|value 0 is NaN
index-out-of-range|out of range
rice|not the shortest
bad-crc|checksum mismatch
EOF
"$TOOL" inspect "$WORK/good-b.bin" >/dev/null || fail "inspect refuses the correct payload"
printf 'not a payload, not even a zstd frame\n%.0s' 1 2 3 >"$WORK/garbage.bin"
: >"$WORK/empty.bin"
head -c $((2 * MAX_BODY)) /dev/zero >"$WORK/big.bin"
# A correct registration followed by 2000 spaces: only its size is wrong.
{
    printf '{"name":"big","enrolment_secret":"%s"}' "$SECRET"
    head -c 2000 /dev/zero | tr '\0' ' '
} >"$WORK/big.json"
printf '{"name":"deep","enrolment_secret":"%s","x":[[[[[[[[[1]]]]]]]]]}' "$SECRET" \
    >"$WORK/deep.json"

# ---- the matrix ------------------------------------------------------------
DB="$STATE/state.db"
# snapshot FILE: everything a refused request must leave as it was, written
# to FILE; the rejection counters go to FILE.rej and the raw /metrics text to
# FILE.metrics. Few processes: the machine may be loaded, and the upload-rate
# case below needs the cases to be quick.
snapshot() {
    "${C[@]}" -w '\n' "$URL/v1/status" "$URL/v1/rounds/0" "$URL/metrics" >"$1.raw" ||
        fail "snapshot: curl failed"
    awk -v rej="$1.rej" -v met="$1.metrics" '
        /^strata_/ { print > met }
        /^\{"state":/ { print; next }
        /^\{"round":/ {
            n = split("round state model_version selected participants uplink_bytes", k, " ")
            for (i = 1; i <= n; i++) {
                v = ""
                if (match($0, "\"" k[i] "\":[^,}]*"))
                    v = substr($0, RSTART + length(k[i]) + 3, RLENGTH - length(k[i]) - 3)
                print "round0." k[i] "=" v
            }
            next
        }
        /^strata_(updates_accepted_total|rounds_completed_total|registered_clients) / { print }
        /^strata_(round|model_version|paused) / { print }
        /^strata_(requests|updates)_rejected_total\{/ { print > rej }
    ' "$1.raw" >"$1" || fail "snapshot: awk failed"
    sqlite3 -readonly "$DB" "SELECT 'clients', COUNT(*) FROM clients;
        SELECT 'rounds', COUNT(*), group_concat(state) FROM rounds;
        SELECT 'round_clients', COUNT(*) FROM round_clients;
        SELECT 'updates', COUNT(*) FROM updates;
        SELECT 'checkpoints', COUNT(*) FROM checkpoints;" >>"$1" 2>&1 ||
        fail "snapshot: sqlite3 failed: $(cat "$1")"
    local f
    sqlite3 -readonly "$DB" "SELECT 'payloads', COUNT(*), total(length(body)) FROM payloads;" \
        >>"$1" 2>&1 || fail "snapshot: sqlite3 failed: $(cat "$1")"
    for f in "$STATE"/checkpoints/**; do
        if [ -d "$f" ]; then echo "dir ${f#"$STATE"/}"; else echo "file ${f#"$STATE"/}"; fi
    done >>"$1"
}
shopt -s globstar nullglob
# metric FILE NAME: the value of one sample line (0 when absent).
metric() { awk -v n="$2" '$1 == n { v = $2 } END { print v + 0 }' "$1"; }

declare -A SEEN # reason -> cases that counted it (for the final /metrics check)
NCASES=0
T0=""
ERR_RE='^\{"error":\{"code":"([a-z_]+)","message":"(([^"\\]|\\.)+)"\}\}$'
# check NAME STATUS CODE UPLOAD_REASON MESSAGE_REGEX METHOD PATH [curl args...]
#   One case: the request is answered with STATUS, Content-Type
#   application/json and exactly {"error":{"code":CODE,"message":M}} where M
#   is not empty and matches MESSAGE_REGEX; strata_requests_rejected_total
#   {reason=CODE} and (unless UPLOAD_REASON is -) strata_updates_rejected_total
#   {reason=UPLOAD_REASON} grow by one, no other rejection counter moves, and
#   the snapshot is unchanged. Leaves the response headers in HDR and the
#   snapshots in $WORK/s.before and $WORK/s.after.
check() {
    local name=$1 status=$2 code=$3 ureason=$4 msg=$5 m=$6 p=$7
    shift 7
    snapshot "$WORK/s.before"
    local rc=0
    CODE=$("${C[@]}" -X "$m" -D "$WORK/hdr" -o "$WORK/body" -w '%{http_code}' "$@" "$URL$p") ||
        rc=$?
    BODY=$(<"$WORK/body")
    HDR=$(<"$WORK/hdr")
    HDR=${HDR//$'\r'/}
    [ "$rc" -eq 0 ] || fail "$name: curl exit $rc (HTTP $CODE)"
    [ "$CODE" = "$status" ] || fail "$name: HTTP $CODE, expected $status ($BODY)${T0:+ \
[$(awk "BEGIN { print $EPOCHREALTIME - $T0 }") s after the first upload of client C]}"
    [[ ${HDR,,} =~ (^|$'\n')content-type:\ application/json ]] ||
        fail "$name: the response is not application/json: $HDR"
    [[ $BODY =~ $ERR_RE ]] || fail "$name: not a JSON error body: $BODY"
    [ "${BASH_REMATCH[1]}" = "$code" ] || fail "$name: code ${BASH_REMATCH[1]}, expected $code"
    [[ ${BASH_REMATCH[2]} =~ $msg ]] || fail "$name: the message does not match /$msg/: $BODY"
    snapshot "$WORK/s.after"
    cmp -s "$WORK/s.before" "$WORK/s.after" ||
        fail "$name: the coordinator's state changed: $(diff "$WORK/s.before" "$WORK/s.after")"
    awk -v a="strata_requests_rejected_total{reason=\"$code\"}" \
        -v b="strata_updates_rejected_total{reason=\"$ureason\"}" '
        FNR == NR { want[$1] = $2 + ($1 == a || $1 == b); next }
        { if (!($1 in want) || want[$1] != $2) bad = bad " " $1 "=" $2 " (expected " want[$1] ")"
          delete want[$1] }
        END { for (k in want) bad = bad " " k " missing"; if (bad != "") { print bad; exit 1 } }
    ' "$WORK/s.before.rej" "$WORK/s.after.rej" >"$WORK/c.diff" ||
        fail "$name: rejection counters:$(cat "$WORK/c.diff")"
    SEEN[$code]=$((${SEEN[$code]:-0} + 1))
    [ "$ureason" = - ] || SEEN[upd_$ureason]=$((${SEEN[upd_$ureason]:-0} + 1))
    NCASES=$((NCASES + 1))
    printf 'ok %-48s %s %s\n' "$name" "$status" "$code"
}
# header NAME: the value of a response header of the last case.
header() {
    local line
    while IFS= read -r line; do
        if [[ ${line,,} == "${1,,}:"* ]]; then
            line=${line#*:}
            echo "${line// /}"
            return
        fi
    done <<<"$HDR"
}
U0=/v1/rounds/0/updates
ZERO=$(printf '%064d' 0)

# Authentication and authorisation.
check "tasks: no token" 401 unauthorized - "bearer" GET /v1/tasks/next
[ "$(header www-authenticate)" = Bearer ] || fail "401 without WWW-Authenticate: Bearer"
check "tasks: unknown token" 401 unauthorized - "unknown token" GET /v1/tasks/next \
    -H "Authorization: Bearer $ZERO"
check "tasks: malformed Authorization" 401 unauthorized - "malformed" GET /v1/tasks/next \
    -H "Authorization: Basic $TA"
check "tasks: token with a space" 401 unauthorized - "malformed" GET /v1/tasks/next \
    -H "Authorization: Bearer $TA x"
check "model: no token" 401 unauthorized - "bearer" GET /v1/models/0
check "upload: no token" 401 unauthorized unauthorized "bearer" POST $U0 "${B[@]}" \
    --data-binary @"$WORK/good-a.bin"
check "upload: unknown token" 401 unauthorized unauthorized "unknown token" POST $U0 \
    -H "Authorization: Bearer $ZERO" "${B[@]}" --data-binary @"$WORK/good-a.bin"
check "upload: malformed Authorization" 401 unauthorized unauthorized "malformed" POST $U0 \
    -H "Authorization: Bearer" "${B[@]}" --data-binary @"$WORK/good-a.bin"
check "admin pause: no token" 401 unauthorized - "admin" POST /v1/admin/pause "${J[@]}" -d '{}'
check "admin stop: unknown token" 401 unauthorized - "unknown admin token" POST /v1/admin/stop \
    -H "Authorization: Bearer $ZERO" "${J[@]}" -d '{}'
check "admin config: no token" 401 unauthorized - "admin" GET /v1/admin/config
check "admin pause: client token" 403 forbidden - "admin endpoints" POST /v1/admin/pause \
    "${AA[@]}" "${J[@]}" -d '{"reason":"x"}'
check "admin stop: client token" 403 forbidden - "admin endpoints" POST /v1/admin/stop \
    "${AB[@]}" "${J[@]}" -d '{}'
check "admin config: client token" 403 forbidden - "admin endpoints" GET /v1/admin/config "${AA[@]}"
check "register: wrong secret" 401 bad_secret - "enrolment_secret" POST /v1/clients "${J[@]}" \
    -d '{"name":"x","enrolment_secret":"s3creT"}'
check "register: missing secret" 400 bad_request - "enrolment_secret: missing" POST /v1/clients \
    "${J[@]}" -d '{"name":"x"}'
check "register: empty body" 400 bad_request - "enrolment_secret: missing" POST /v1/clients \
    "${J[@]}"

# Content types.
check "upload: Content-Type application/json" 415 unsupported_media_type unsupported_media_type \
    "octet-stream" POST $U0 "${AA[@]}" "${J[@]}" --data-binary @"$WORK/good-a.bin"
check "upload: no Content-Type" 415 unsupported_media_type unsupported_media_type "octet-stream" POST $U0 \
    "${AA[@]}" -H 'Content-Type:' --data-binary @"$WORK/good-a.bin"
check "upload: Content-Type that is not UTF-8" 415 unsupported_media_type unsupported_media_type \
    "octet-stream" POST $U0 "${AA[@]}" -H $'Content-Type: text/\xff' --data-binary @"$WORK/good-a.bin"
check "register: Content-Type text/plain" 415 unsupported_media_type - "application/json" \
    POST /v1/clients -H 'Content-Type: text/plain' -d "{\"enrolment_secret\":\"$SECRET\"}"
check "register: form encoded (curl default)" 415 unsupported_media_type - "application/json" \
    POST /v1/clients -d "{\"enrolment_secret\":\"$SECRET\"}"
check "admin pause: Content-Type text/plain" 415 unsupported_media_type - "application/json" \
    POST /v1/admin/pause "${AD[@]}" -H 'Content-Type: text/plain' -d '{}'

# Malformed JSON and JSON limits.
check "register: malformed JSON" 400 bad_request - "not valid JSON" POST /v1/clients "${J[@]}" \
    -d "{\"enrolment_secret\":\"$SECRET\""
check "register: duplicate key" 400 bad_request - "duplicate" POST /v1/clients "${J[@]}" \
    -d "{\"name\":\"a\",\"name\":\"b\",\"enrolment_secret\":\"$SECRET\"}"
check "register: unknown key" 400 bad_request - "unknown key" POST /v1/clients "${J[@]}" \
    -d "{\"colour\":\"red\",\"enrolment_secret\":\"$SECRET\"}"
check "register: not an object" 400 bad_request - "object" POST /v1/clients "${J[@]}" \
    -d "[\"$SECRET\"]"
check "register: name not a string" 400 bad_request - "name" POST /v1/clients "${J[@]}" \
    -d "{\"name\":7,\"enrolment_secret\":\"$SECRET\"}"
check "register: JSON deeper than --max-json-depth" 400 bad_request - "nesting deeper than 8" \
    POST /v1/clients "${J[@]}" --data-binary @"$WORK/deep.json"
check "register: JSON over --max-json-bytes" 413 too_large - "limit of 1024" POST /v1/clients \
    "${J[@]}" --data-binary @"$WORK/big.json"
check "register: chunked JSON over --max-json-bytes" 413 too_large - "limit of 1024" \
    POST /v1/clients "${J[@]}" -H 'Transfer-Encoding: chunked' --data-binary @"$WORK/big.json"
check "admin pause: malformed JSON" 400 bad_request - "not valid JSON" POST /v1/admin/pause \
    "${AD[@]}" "${J[@]}" -d '{"reason":'
check "admin pause: unknown key" 400 bad_request - "unknown key" POST /v1/admin/pause \
    "${AD[@]}" "${J[@]}" -d '{"why":"x"}'
check "admin stop: JSON deeper than --max-json-depth" 400 bad_request - "nesting" \
    POST /v1/admin/stop "${AD[@]}" "${J[@]}" -d '{"reason":[[[[[[[[["x"]]]]]]]]]}'
check "admin stop: JSON over --max-json-bytes" 413 too_large - "limit" POST /v1/admin/stop \
    "${AD[@]}" "${J[@]}" --data-binary @"$WORK/big.json"

# Routes and query arguments.
check "unknown path" 404 not_found - "endpoint" GET /v1/nope
check "unknown admin action" 404 not_found - "endpoint" POST /v1/admin/explode "${AD[@]}" \
    "${J[@]}" -d '{}'
check "wrong method on /v1/status" 405 method_not_allowed - "use GET" DELETE /v1/status
[ "$(header allow)" = GET,HEAD ] || fail "405 without Allow: GET, HEAD"
check "wrong method on /v1/clients" 405 method_not_allowed - "use POST" GET /v1/clients
check "wrong method on updates" 405 method_not_allowed - "use POST" GET $U0 "${AA[@]}"
check "unknown round: GET /v1/rounds/99" 404 not_found - "no round 99" GET /v1/rounds/99
check "unknown model version" 404 not_found - "no model version 99" GET /v1/models/99 "${AA[@]}"
check "tasks: wait out of range" 400 bad_request - "wait" GET '/v1/tasks/next?wait=99' "${AA[@]}"
check "rounds: limit 0" 400 bad_request - "limit" GET '/v1/rounds?limit=0'

# Upload size limits. With a Content-Length the refusal comes before the
# body is read (curl waits for 100 Continue, which never comes).
check "upload: Content-Length over --max-body-bytes" 413 too_large too_large "limit of $MAX_BODY" \
    POST $U0 "${AA[@]}" "${B[@]}" -H 'Expect: 100-continue' --data-binary @"$WORK/big.bin"
rx=$(($(metric "$WORK/s.after.metrics" strata_bytes_received_total) - \
    $(metric "$WORK/s.before.metrics" strata_bytes_received_total)))
[ "$rx" -lt $((2 * MAX_BODY / 100)) ] || fail "the oversize body was read ($rx bytes received)"
check "upload: chunked body over --max-body-bytes" 413 too_large too_large "limit of $MAX_BODY" \
    POST $U0 "${AB[@]}" "${B[@]}" -H 'Transfer-Encoding: chunked' --data-binary @"$WORK/big.bin"

# Decoder refusals (client B): 400 bad_payload.
while IFS='|' read -r m msg; do
    check "upload: $m payload" 400 bad_payload bad_payload "$msg" POST $U0 "${AB[@]}" "${B[@]}" \
        --data-binary @"$WORK/$m.bin"
done <<'EOF'
garbage|zstd|frame|magic
bad-crc|checksum mismatch
nan|is NaN
index-out-of-range|out of range
rice|not the shortest
empty|empty body
EOF
check "upload: payload of another client" 403 forbidden forbidden "for client $IDA" POST $U0 \
    "${AB[@]}" "${B[@]}" --data-binary @"$WORK/good-a.bin"

# Validation against the round's task (client A): 422 invalid_update.
while IFS='|' read -r file msg name; do
    check "upload: $name" 422 invalid_update invalid_update "$msg" POST $U0 "${AA[@]}" "${B[@]}" \
        --data-binary @"$WORK/$file"
done <<'EOF'
round.bin|header round 1 does not match the URL's round 0|header round differs from the URL
ver.bin|model_version 1|wrong model version
nobias.bin|5 layers, the model has 6|layer count (fc3 without bias)
narrow.bin|fc2.weight.*39800 elements, expected 40000|numel of a layer (fc2 narrower)
wide.bin|larger than the model|more elements than the model (fc2 wider)
extra.bin|larger than the model|more layers than the model (fc4 added)
dense.bin|compressor none, the task says topk|compressor differs from the task
fp16.bin|values fp16, the task says fp32|values format differs from the task
density.bin|kept elements, the budget|kept count above the budget density
samples.bin|sample_count 0|sample_count 0
EOF
check "upload: round that never opened" 409 round_not_open round_not_open "round 99" \
    POST /v1/rounds/99/updates "${AA[@]}" "${B[@]}" --data-binary @"$WORK/r99.bin"

# A third client (the last allowed) registers after round 0 opened: it is not
# selected. A fourth is refused.
register edge-c
TC=$REG_TOKEN IDC=$REG_ID
AC=(-H "Authorization: Bearer $TC")
pay good-c.bin "$IDC"
check "register: over --max-clients" 429 too_many_clients - "3 clients" POST /v1/clients \
    "${J[@]}" -d "{\"name\":\"edge-d\",\"enrolment_secret\":\"$SECRET\"}"
check "upload: client not selected" 403 not_selected not_selected "not selected" POST $U0 \
    "${AC[@]}" "${B[@]}" --data-binary @"$WORK/good-c.bin"
T0=$EPOCHREALTIME
cp "$WORK/s.after" "$WORK/s.nsel"
cp "$WORK/s.after.rej" "$WORK/s.nsel.rej"

# Upload rate: every upload that passes authentication takes one of the RATE
# tokens of its client, whatever its fate. C spends the rest of its tokens in
# one quick burst (one curl process, each upload refused as not selected, so
# nothing is accepted twice), then is refused with a Retry-After. The bucket
# refills RATE tokens a minute: the burst and the next case must take less
# than 60 / RATE seconds.
urls=()
for _ in $(seq 2 "$RATE"); do urls+=("$URL$U0"); done
"${C[@]}" -X POST "${AC[@]}" "${B[@]}" --data-binary @"$WORK/good-c.bin" -w '\n%{http_code}\n' \
    "${urls[@]}" >"$WORK/burst.out" || fail "burst: curl failed"
n403=$(grep -c '^403$' "$WORK/burst.out" || true)
nsel=$(grep -c '^{"error":{"code":"not_selected",' "$WORK/burst.out" || true)
if [ "$n403" -ne $((RATE - 1)) ] || [ "$nsel" -ne $((RATE - 1)) ]; then
    fail "burst: $n403 of $((RATE - 1)) uploads got 403 not_selected: $(cat "$WORK/burst.out")"
fi
check "upload: over --upload-rate" 429 rate_limited rate_limited "uploads in a minute" POST $U0 \
    "${AC[@]}" "${B[@]}" --data-binary @"$WORK/good-c.bin"
ra=$(header retry-after)
if ! [[ $ra =~ ^[0-9]+$ ]] || [ "$ra" -lt 1 ] || [ "$ra" -gt $((60 / RATE + 1)) ]; then
    fail "429: Retry-After '$ra', expected 1 to $((60 / RATE + 1)) seconds"
fi
awk -v t0="$T0" -v t1="$EPOCHREALTIME" \
    'BEGIN { printf "    (not selected -> 429: %.2f s)\n", t1 - t0 }'
# ... and the burst changed nothing either; it counted RATE - 1 not_selected.
cmp -s "$WORK/s.nsel" "$WORK/s.before" ||
    fail "burst: the coordinator's state changed: $(diff "$WORK/s.nsel" "$WORK/s.before")"
awk -v n=$((RATE - 1)) '
    FNR == NR { want[$1] = $2 + ($1 ~ /reason="not_selected"/ ? n : 0); next }
    want[$1] != $2 { bad = bad " " $1 "=" $2 }
    END { if (bad != "") { print bad; exit 1 } }
' "$WORK/s.nsel.rej" "$WORK/s.before.rej" >"$WORK/c.diff" ||
    fail "burst: rejection counters:$(cat "$WORK/c.diff")"
SEEN[not_selected]=$((SEEN[not_selected] + RATE - 1))
SEEN[upd_not_selected]=$((SEEN[upd_not_selected] + RATE - 1))

# ---- the coordinator still works ------------------------------------------
req POST $U0 "${AA[@]}" "${B[@]}" --data-binary @"$WORK/good-a.bin"
expect 200 "correct upload of client A"
[ "$(json_field "$BODY" duplicate)" = false ] || fail "upload A: $BODY"
req POST $U0 "${AB[@]}" "${B[@]}" --data-binary @"$WORK/good-b.bin"
expect 200 "correct upload of client B"
[ "$(json_field "$BODY" duplicate)" = false ] || fail "upload B: $BODY"
for _ in $(seq 1 100); do
    req GET /v1/rounds/0
    [ "$(json_field "$BODY" state)" = closed ] && break
    sleep 0.2
done
[ "$(json_field "$BODY" state)" = closed ] || fail "round 0 did not close: $BODY"
[ "$(json_field "$BODY" participants)" = 2 ] || fail "round 0: $BODY"
up_bytes=$(($(stat -c %s "$WORK/good-a.bin") + $(stat -c %s "$WORK/good-b.bin")))
[ "$(json_field "$BODY" uplink_bytes)" = "$up_bytes" ] || fail "round 0 uplink: $BODY"
grep -q '^round 0/2: 2 updates, accuracy' "$WORK/server.out" || fail "no round log line"
[ "$(sqlite3 -readonly "$DB" 'SELECT COUNT(*) FROM updates')" = 2 ] || fail "updates rows"
[ "$(stored_count "$STATE")" = 2 ] || fail "stored payloads: $(stored_count "$STATE")"
[ "$(sqlite3 -readonly "$DB" 'SELECT COUNT(*) FROM clients')" = 3 ] || fail "clients rows"

# /metrics: the per-reason counts are exactly those of the cases above.
metrics "$WORK/m.final"
[ "$(metric "$WORK/m.final" strata_updates_accepted_total)" = 2 ] || fail "accepted counter"
[ "$(metric "$WORK/m.final" strata_rounds_completed_total)" = 1 ] || fail "rounds counter"
while read -r line; do
    name=${line%% *} value=${line##* }
    reason=${name#*reason=\"}
    reason=${reason%\"\}}
    case $name in
    strata_updates_*) want=${SEEN[upd_$reason]:-0} ;;
    *) want=${SEEN[$reason]:-0} ;;
    esac
    [ "$value" = "$want" ] || fail "$name is $value, expected $want"
    [ "$value" = 0 ] || echo "metrics: $line"
done < <(grep -E '^strata_(requests|updates)_rejected_total\{' "$WORK/m.final")
kill -0 "$SPID" 2>/dev/null || fail "the server died"
echo "PASS test_bad_requests ($NCASES cases, $(($(date +%s) - START)) s)"
