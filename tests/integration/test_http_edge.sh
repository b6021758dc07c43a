#!/usr/bin/env bash
# The coordinator's HTTP edge over raw sockets (bash's /dev/tcp): request
# smuggling (two Content-Lengths, Content-Length with Transfer-Encoding,
# unknown or repeated transfer codings, a header name with a space, folded
# header lines, Host), request targets that MHD would unescape into another
# path (%00, invalid escapes, %2F, raw NUL), Content-Type rules of the JSON
# endpoints, and HEAD.
# Every refusal must come back as exactly one response (the bytes after the
# header block are exactly its Content-Length) with its status and the JSON
# error {"error":{"code","message"}}, the connection must then be closed,
# strata_requests_rejected_total{reason=<code>} must grow by one and no other
# rejection counter move, and the coordinator's state (/v1/status, round 0's
# summary, registered clients, paused) must be as it was: the smuggled
# requests behind the refused ones (a registration, an admin pause) must not
# have run.
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
[ -x "$SERVER" ] || fail "no $SERVER"
command -v curl >/dev/null || fail "curl is required"
START=$(date +%s)
export LC_ALL=C # lengths in bytes

SPID=""
cleanup() {
    if [ -n "$SPID" ]; then
        kill "$SPID" 2>/dev/null || true
        wait "$SPID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap '' PIPE # a write to a connection the coordinator closed must not end the test

SECRET=s3cret
STATE="$WORK/state"
"$SERVER" --state-dir "$STATE" --model mlp --data "$DATA" --port 0 --rounds 2 --min-clients 2 \
    --clients-per-round 2 --round-deadline 120 --enrolment-secret "$SECRET" \
    --max-json-bytes 1024 >"$WORK/server.out" 2>"$WORK/server.err" &
SPID=$!
wait_listening "$SPID" "$WORK/server.out" "$WORK/server.err"
PORT=${URL##*:}
ADMIN=$(head -n 1 "$STATE/admin.token")
C=(curl -sS --max-time 20)

# Two clients: round 0 opens with both selected.
for n in a b; do
    reg=$("${C[@]}" -X POST -H 'Content-Type: application/json' \
        -d "{\"name\":\"edge-$n\",\"enrolment_secret\":\"$SECRET\"}" "$URL/v1/clients")
    [ ${#reg} -gt 0 ] && [ "$(json_field "$reg" client_id)" != "" ] || fail "register $n: $reg"
    [ "$n" = a ] && TA=$(json_field "$reg" token)
done
for _ in $(seq 1 100); do
    [ "$(json_field "$("${C[@]}" "$URL/v1/rounds/0")" state)" = open ] && break
    sleep 0.1
done
[ "$(json_field "$("${C[@]}" "$URL/v1/rounds/0")" state)" = open ] || fail "round 0 did not open"

# snapshot FILE: what no refused request may change, to FILE; the rejection
# counters to FILE.rej.
snapshot() {
    "${C[@]}" -w '\n' "$URL/v1/status" "$URL/v1/rounds/0" "$URL/metrics" >"$1.raw" ||
        fail "snapshot: curl failed"
    awk -v rej="$1.rej" '
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
        /^strata_(updates_accepted_total|registered_clients|paused|round|model_version) / { print }
        /^strata_(requests|updates)_rejected_total\{/ { print > rej }
    ' "$1.raw" >"$1" || fail "snapshot: awk failed"
    grep -q '"registered_clients":2,' "$1" || fail "snapshot: $(cat "$1")"
}

# exchange REQUEST: sends REQUEST (printf %b escapes: \r, \n, \0, \xHH) in
# one write on a new connection and reads until the coordinator closes it
# (at most 5 s). Sets HEAD (the header block, CRs removed), STATUS, NREST
# (the number of bytes after the header block), REST (those bytes, as text)
# and CLOSED (1 when the coordinator closed the connection).
exchange() {
    printf '%b' "$1" >"$WORK/req"
    exec 3<>"/dev/tcp/127.0.0.1/$PORT" || fail "connect"
    cat "$WORK/req" >&3 2>/dev/null || true
    local rc=0 nhead
    timeout 5 cat <&3 >"$WORK/resp" || rc=$?
    exec 3<&- 3>&-
    CLOSED=$((rc == 0))
    grep -q $'^\r$' "$WORK/resp" ||
        fail "$NAME: no complete response: '$(head -c 300 "$WORK/resp")'"
    HEAD=$(sed $'/^\r$/q' "$WORK/resp" | tr -d '\r')
    nhead=$(sed $'/^\r$/q' "$WORK/resp" | wc -c)
    NREST=$(($(stat -c %s "$WORK/resp") - nhead))
    REST=$(dd if="$WORK/resp" bs=1 skip="$nhead" count=2000 2>/dev/null | tr -d '\000')
    STATUS=${HEAD%%$'\n'*}
    STATUS=${STATUS#HTTP/1.1 }
    STATUS=${STATUS%% *}
}
# header NAME: the value of a header of the last response ("" when absent).
header() {
    local line
    while IFS= read -r line; do
        if [[ ${line,,} == "${1,,}:"* ]]; then
            line=${line#*:}
            echo "${line# }"
            return
        fi
    done <<<"$HEAD"
}
# one_response [HEAD]: exactly one response came back: the bytes after its
# header block are its Content-Length (none for a HEAD request).
one_response() {
    local cl want
    cl=$(header content-length)
    [[ $cl =~ ^[0-9]+$ ]] || fail "$NAME: Content-Length '$cl': $HEAD"
    want=$cl
    [ "${1:-}" = HEAD ] && want=0
    [ "$NREST" -eq "$want" ] ||
        fail "$NAME: $NREST bytes after the headers, expected $want (more than one response?): '$REST'"
}

NCASES=0
ERR_RE='^\{"error":\{"code":"([a-z_]+)","message":"(([^"\\]|\\.)+)"\}\}$'
# refused NAME STATUS CODE MESSAGE_REGEX REQUEST [HEAD]: REQUEST is
# answered with STATUS and the JSON error CODE (for a HEAD request: the
# status and a JSON Content-Type, no body), exactly once, and the connection
# is closed; the rejection counter of CODE grows by one, no other moves, and
# the snapshot is unchanged.
refused() {
    NAME=$1
    local status=$2 code=$3 msg=$4
    snapshot "$WORK/s.before"
    exchange "$5"
    [ "$STATUS" = "$status" ] || fail "$NAME: HTTP $STATUS, expected $status: $RESP"
    one_response "${6:-}"
    [ "$CLOSED" = 1 ] || fail "$NAME: the connection was left open"
    [ "$(header content-type)" = application/json ] || fail "$NAME: not JSON: $HEAD"
    if [ "${6:-}" != HEAD ]; then
        [[ $REST =~ $ERR_RE ]] || fail "$NAME: not a JSON error body: $REST"
        [ "${BASH_REMATCH[1]}" = "$code" ] || fail "$NAME: code ${BASH_REMATCH[1]}, expected $code"
        [[ ${BASH_REMATCH[2]} =~ $msg ]] || fail "$NAME: the message does not match /$msg/: $REST"
    fi
    snapshot "$WORK/s.after"
    cmp -s "$WORK/s.before" "$WORK/s.after" ||
        fail "$NAME: the coordinator's state changed: $(diff "$WORK/s.before" "$WORK/s.after")"
    awk -v a="strata_requests_rejected_total{reason=\"$code\"}" '
        FNR == NR { want[$1] = $2 + ($1 == a); next }
        { if (!($1 in want) || want[$1] != $2) bad = bad " " $1 "=" $2 " (expected " want[$1] ")"
          delete want[$1] }
        END { for (k in want) bad = bad " " k " missing"; if (bad != "") { print bad; exit 1 } }
    ' "$WORK/s.before.rej" "$WORK/s.after.rej" >"$WORK/c.diff" ||
        fail "$NAME: rejection counters:$(cat "$WORK/c.diff")"
    NCASES=$((NCASES + 1))
    printf 'ok %-62s %s %s\n' "$NAME" "$status" "$code"
}

H='Host: x\r\n'
J='Content-Type: application/json\r\n'
AD="Authorization: Bearer $ADMIN\\r\\n"
AA="Authorization: Bearer $TA\\r\\n"
REG="{\"name\":\"smuggled\",\"enrolment_secret\":\"$SECRET\"}"
# Requests hidden behind the body of another: a registration and an admin
# pause (each would change the snapshot).
SMUG_REG="POST /v1/clients HTTP/1.1\r\n$H$J""Content-Length: ${#REG}\r\n\r\n$REG"
SMUG_PAUSE="POST /v1/admin/pause HTTP/1.1\r\n$H${AD}Content-Length: 0\r\n\r\n"
# blen S: the length in bytes of S once its escapes are interpreted.
blen() {
    local s
    printf -v s '%b' "$1"
    echo ${#s}
}
FRAMING="request framing"

# ---- framing ---------------------------------------------------------------
refused "two different Content-Lengths (smuggled registration)" 400 bad_request \
    "$FRAMING: more than one Content-Length" \
    "POST /v1/clients HTTP/1.1\r\n$H${J}Content-Length: 2\r\nContent-Length: $((2 + $(blen "$SMUG_REG")))\r\n\r\n{}$SMUG_REG"
refused "two equal Content-Lengths" 400 bad_request "$FRAMING: more than one Content-Length" \
    "POST /v1/clients HTTP/1.1\r\n$H${J}Content-Length: ${#REG}\r\nContent-Length: ${#REG}\r\n\r\n$REG"
refused "Content-Length and Transfer-Encoding (smuggled registration)" 400 bad_request \
    "$FRAMING: both Content-Length and Transfer-Encoding" \
    "POST /v1/clients HTTP/1.1\r\n$H${J}Content-Length: $((5 + $(blen "$SMUG_REG")))\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n$SMUG_REG"
refused "Transfer-Encoding and Content-Length (smuggled admin pause)" 400 bad_request \
    "$FRAMING: both Content-Length and Transfer-Encoding" \
    "POST /v1/admin/resume HTTP/1.1\r\n$H${AD}Transfer-Encoding: chunked\r\nContent-Length: $((5 + $(blen "$SMUG_PAUSE")))\r\n\r\n0\r\n\r\n$SMUG_PAUSE"
refused "Transfer-Encoding: gzip" 400 bad_request "$FRAMING: a Transfer-Encoding other than" \
    "POST /v1/clients HTTP/1.1\r\n$H${J}Transfer-Encoding: gzip\r\n\r\n$REG"
refused "Transfer-Encoding: gzip, chunked" 400 bad_request "Transfer-Encoding other than" \
    "POST /v1/clients HTTP/1.1\r\n$H${J}Transfer-Encoding: gzip, chunked\r\n\r\n$(printf '%x' ${#REG})\r\n$REG\r\n0\r\n\r\n"
refused "Transfer-Encoding: identity on a GET" 400 bad_request "Transfer-Encoding other than" \
    "GET /v1/status HTTP/1.1\r\n${H}Transfer-Encoding: identity\r\n\r\n"
refused "Transfer-Encoding: Chunked (not exactly chunked)" 400 bad_request "other than one 'chunked'" \
    "POST /v1/clients HTTP/1.1\r\n$H${J}Transfer-Encoding: Chunked\r\n\r\n0\r\n\r\n"
refused "Transfer-Encoding: chunked twice" 400 bad_request "Transfer-Encoding other than" \
    "POST /v1/clients HTTP/1.1\r\n$H${J}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
refused "'Transfer-Encoding :' (space before the colon) with Content-Length" 400 bad_request \
    "$FRAMING: a header name that is not a token" \
    "POST /v1/clients HTTP/1.1\r\n$H${J}Transfer-Encoding : chunked\r\nContent-Length: $((5 + $(blen "$SMUG_REG")))\r\n\r\n0\r\n\r\n$SMUG_REG"
# obs-fold: libmicrohttpd glues a continuation line to the header's name, so
# it would read no Content-Length here and take the body for a request.
refused "'Content-Length:' folded onto the next line (smuggled registration)" 400 bad_request \
    "$FRAMING: a header line continued on the next" \
    "POST /v1/clients HTTP/1.1\r\n$H${J}Content-Length:\r\n $(blen "$SMUG_REG")\r\n\r\n$SMUG_REG"
refused "'Transfer-Encoding:' folded onto the next line" 400 bad_request "continued on the next" \
    "POST /v1/clients HTTP/1.1\r\n$H${J}Transfer-Encoding:\r\n\tchunked\r\n\r\n0\r\n\r\n"
refused "Transfer-Encoding hidden in a folded header" 400 bad_request "continued on the next" \
    "POST /v1/clients HTTP/1.1\r\n$H${J}X-A: b\r\n Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}"
refused "Transfer-Encoding in HTTP/1.0" 400 bad_request "$FRAMING: Transfer-Encoding in HTTP/1.0" \
    "POST /v1/clients HTTP/1.0\r\n$H${J}Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
refused "HTTP/1.1 without Host" 400 bad_request "$FRAMING: no Host" \
    "GET /v1/status HTTP/1.1\r\n\r\n"
refused "two Host headers" 400 bad_request "$FRAMING: more than one Host" \
    "GET /v1/status HTTP/1.1\r\n${H}Host: y\r\n\r\n"

# ---- request targets -------------------------------------------------------
TARGET="request target"
refused "GET /v1/rounds/0%00x" 400 bad_request "$TARGET: an escaped NUL" \
    "GET /v1/rounds/0%00x HTTP/1.1\r\n$H\r\n"
refused "POST /v1/admin/pause%00x" 400 bad_request "$TARGET: an escaped NUL" \
    "POST /v1/admin/pause%00x HTTP/1.1\r\n$H${AD}Content-Length: 0\r\n\r\n"
refused "GET /v1/rounds/0 with a raw NUL byte" 400 bad_request "$TARGET: a NUL byte" \
    "GET /v1/rounds/0\0x HTTP/1.1\r\n$H\r\n"
refused "GET /v1/rounds/0%zz" 400 bad_request "$TARGET: a '%' not followed by two hex digits" \
    "GET /v1/rounds/0%zz HTTP/1.1\r\n$H\r\n"
refused "GET /v1/rounds/0% (trailing %)" 400 bad_request "not followed by two hex digits" \
    "GET /v1/rounds/0% HTTP/1.1\r\n$H\r\n"
refused "GET /v1/status%2 (one hex digit)" 400 bad_request "not followed by two hex digits" \
    "GET /v1/status%2 HTTP/1.1\r\n$H\r\n"
refused "GET /v1/rounds%2F0 (escaped slash)" 400 bad_request "$TARGET: an escaped '/'" \
    "GET /v1/rounds%2F0 HTTP/1.1\r\n$H\r\n"
refused "GET /v1/status%0d%0aX:%20y (escaped CR LF)" 400 bad_request "escaped control character" \
    "GET /v1/status%0d%0aX:%20y HTTP/1.1\r\n$H\r\n"
refused "GET /v1/rounds?from=0%00 (query)" 400 bad_request "$TARGET: an escaped NUL" \
    "GET /v1/rounds?from=0%00 HTTP/1.1\r\n$H\r\n"
refused "GET /v1/rounds?limit=1%z (query)" 400 bad_request "not followed by two hex digits" \
    "GET /v1/rounds?limit=1%z HTTP/1.1\r\n$H\r\n"
refused "GET /v1/st<DEL>atus (byte outside printable ASCII)" 400 bad_request \
    "$TARGET: a byte outside printable ASCII" "GET /v1/st\x7fatus HTTP/1.1\r\n$H\r\n"

# ---- content types ---------------------------------------------------------
UMT=unsupported_media_type
refused "register without Content-Type" 415 $UMT "expected application/json, got none" \
    "POST /v1/clients HTTP/1.1\r\n${H}Content-Length: ${#REG}\r\n\r\n$REG"
refused "register with Content-Type application/jsonx" 415 $UMT "got application/jsonx" \
    "POST /v1/clients HTTP/1.1\r\n${H}Content-Type: application/jsonx\r\nContent-Length: ${#REG}\r\n\r\n$REG"
refused "register, chunked, without Content-Type" 415 $UMT "got none" \
    "POST /v1/clients HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n$(printf '%x' ${#REG})\r\n$REG\r\n0\r\n\r\n"
refused "admin pause with a body, without Content-Type" 415 $UMT "got none" \
    "POST /v1/admin/pause HTTP/1.1\r\n$H${AD}Content-Length: 14\r\n\r\n{\"reason\":\"x\"}"
# (Refused once the whole body is in: the request was framed correctly, so
# the connection could stay open; this one asks to close it.)
refused "admin pause with a chunked body, without Content-Type" 415 $UMT "with a body, got none" \
    "POST /v1/admin/pause HTTP/1.1\r\n$H${AD}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\ne\r\n{\"reason\":\"x\"}\r\n0\r\n\r\n"
refused "admin pause, empty body, Content-Type text/plain" 415 $UMT "got text/plain" \
    "POST /v1/admin/pause HTTP/1.1\r\n$H${AD}Content-Type: text/plain\r\nContent-Length: 0\r\n\r\n"
# Still accepted: an admin POST with an empty body and no Content-Type, and
# one with a JSON body and parameters after the media type (resume while
# running changes nothing).
for req in "POST /v1/admin/resume HTTP/1.1\r\n$H${AD}Content-Length: 0\r\nConnection: close\r\n\r\n" \
    "POST /v1/admin/resume HTTP/1.1\r\n$H${AD}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n" \
    "POST /v1/admin/resume HTTP/1.1\r\n$H${AD}Content-Type: application/json; charset=utf-8\r\nContent-Length: 14\r\nConnection: close\r\n\r\n{\"reason\":\"x\"}"; do
    NAME="admin resume: ${req%%\\r\\nConnection*}"
    exchange "$req"
    [ "$STATUS" = 200 ] && [ "$REST" = '{"state":"running"}' ] || fail "$NAME: $RESP"
    one_response
done
echo "ok admin resume without Content-Type (empty body, chunked or not), and with a charset"

# ---- HEAD and Allow --------------------------------------------------------
# Each GET route answers HEAD with the GET's status and headers (Date aside)
# and no body. An open round's record holds its running duration, so its
# length can gain a digit between the GET and the HEAD (999 to 1000 ms): a
# pair that differs is asked again, at most three times.
for route in "/healthz|" "/v1/status|" "/v1/rounds|" "/v1/rounds/0|" "/v1/rounds/%30|" \
    "/v1/models/0|$AA" "/v1/tasks/next|$AA" "/v1/admin/config|$AD" "/nope|" "/v1/rounds/7|"; do
    path=${route%%|*} auth=${route#*|}
    for try in 1 2 3; do
        NAME="GET $path"
        exchange "GET $path HTTP/1.1\r\n$H${auth}Connection: close\r\n\r\n"
        one_response
        get_head=$(grep -v '^Date:' <<<"$HEAD")
        get_status=$STATUS
        NAME="HEAD $path"
        exchange "HEAD $path HTTP/1.1\r\n$H${auth}Connection: close\r\n\r\n"
        one_response HEAD
        [ "$(grep -v '^Date:' <<<"$HEAD")" = "$get_head" ] && break
        [ "$try" -lt 3 ] || fail "$NAME: the headers differ from GET's: $HEAD ... $get_head"
    done
    echo "ok HEAD $path: $STATUS like GET, no body"
done
[ "$get_status" = 404 ] || fail "GET /v1/rounds/7: $get_status"
refused "HEAD on POST /v1/clients" 405 method_not_allowed "" \
    "HEAD /v1/clients HTTP/1.1\r\n$H\r\n" HEAD
[ "$(header allow)" = POST ] || fail "$NAME: Allow '$(header allow)'"
refused "DELETE /v1/status" 405 method_not_allowed "use GET, HEAD" \
    "DELETE /v1/status HTTP/1.1\r\n$H\r\n"
[ "$(header allow)" = "GET, HEAD" ] || fail "$NAME: Allow '$(header allow)'"
refused "POST /v1/rounds/0" 405 method_not_allowed "use GET, HEAD" \
    "POST /v1/rounds/0 HTTP/1.1\r\n${H}Content-Length: 0\r\n\r\n"
[ "$(header allow)" = "GET, HEAD" ] || fail "$NAME: Allow '$(header allow)'"

# ---- the coordinator still works -------------------------------------------
STATUS_JSON=$("${C[@]}" "$URL/v1/status")
[ "$(json_field "$STATUS_JSON" registered_clients)" = 2 ] || fail "status: $STATUS_JSON"
[ "$(json_field "$STATUS_JSON" state)" = running ] || fail "status: $STATUS_JSON"
kill -0 "$SPID" 2>/dev/null || fail "the server died"
echo "PASS test_http_edge ($NCASES refusals, $(($(date +%s) - START)) s)"
