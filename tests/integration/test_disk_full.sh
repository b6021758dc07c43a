#!/usr/bin/env bash
# A full disk under the coordinator, with real processes on loopback: its
# state directory lives on a small tmpfs (32 MiB) that the test fills with a
# filler file (dd until ENOSPC) at chosen moments, then frees; a run of 6
# rounds (mlp, uniform policy at 1%) with 3 clients whose own state
# directories are on the normal disk.
#  0. Round open: the coordinator is stopped (SIGTERM) and restarted while
#     the disk is full, with every client registered and no round opened yet
#     (the first start had --min-clients 4): opening round 0 fails (the store
#     cannot record it) and is retried with a backoff; no round exists, the
#     clients keep polling (204). Freed, round 0 opens.
#  1. Uploads: round 1 opens, then the disk is filled before any client
#     uploads: every upload is answered 503 `unavailable` (counted in
#     strata_updates_rejected_total{reason="unavailable"}), nothing is
#     acknowledged and the round cannot close; the clients retry. An admin
#     resume and a registration are answered 503 too, and change nothing.
#     Freed, the retried uploads are acknowledged and the round closes.
#  2. Round close: round 3 opens with room left for its uploads (~300 KB) but
#     not for the new checkpoint (~0.8 MB): the uploads are acknowledged, the
#     close fails and is retried (strata_round_close_failures_total,
#     strata_round_close_pending 1), the round stays closing, a task request
#     gets 204 (never 410). Then the disk is filled up completely and the
#     coordinator killed (SIGKILL) and restarted while it is full: it replays
#     the round's acknowledged updates and fails to close it again. Freed,
#     the close succeeds on its next retry.
# The phases are gated with the admin pause (no new round opens) and SIGSTOP
# of the clients (an open round cannot receive uploads), so that each fill
# lands at its moment however loaded the machine is. At the end every client
# exits 0 having seen the end of the run once, the coordinator reports all 6
# rounds completed, and every receipt the clients hold is a row of the
# updates table in state.db whose stored payload has the recorded size and
# SHA-256, as many rows as receipts. No request was answered 500.
#
# STRATA_DISK_KEEP=DIR keeps the logs (and a copy of the state directory)
# there. Needs root to mount the tmpfs; exits 77 (skipped) when it cannot.

# A watchdog: the whole test stops within ~130 s whatever happens (it takes
# ~15 s; every wait below is bounded too, this is the last resort).
if [ -z "${STRATA_DISK_WATCHDOG:-}" ] && command -v timeout >/dev/null; then
    export STRATA_DISK_WATCHDOG=1
    exec timeout -k 10 120 bash "$0" "$@"
fi
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
CLIENT="$BUILD/strata-client"
for x in "$SERVER" "$CLIENT"; do [ -x "$x" ] || fail "no $x"; done
for x in curl sqlite3 dd stat sha256sum; do command -v "$x" >/dev/null || fail "$x is required"; done
export OMP_WAIT_POLICY=passive
T_START=$SECONDS
DEADLINE=$((SECONDS + 100)) # every wait below also stops here
ROUNDS=6
NC=3
SECRET="disk-s3cret-$$"
DISK="$WORK/disk" # the tmpfs
STATE="$DISK/state"
# phase 2: room left for the uploads (three commits of the write-ahead log,
# a few 16 KiB pages each), not for a checkpoint (780 KiB)
ROOM_KB=600

# ---- bookkeeping, cleanup -----------------------------------------------------
MOUNTED=0
cleanup() {
    local p k
    for p in "${PIDS[@]}"; do
        kill -KILL "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    PIDS=()
    if [ -n "${STRATA_DISK_KEEP:-}" ] && [ -d "$WORK" ]; then
        mkdir -p "$STRATA_DISK_KEEP" && cp -a "$WORK/." "$STRATA_DISK_KEEP/" 2>/dev/null &&
            rm -f "$STRATA_DISK_KEEP"/disk/fill.* &&
            echo "test_disk_full: logs and state kept in $STRATA_DISK_KEEP" >&2
    fi
    if [ "$MOUNTED" = 1 ]; then
        for k in 1 2 3 4 5 6 7 8 9 10; do
            umount "$DISK" 2>/dev/null && MOUNTED=0 && break
            sleep 0.2
        done
        if [ "$MOUNTED" = 1 ]; then
            echo "test_disk_full: $DISK still busy; detaching it (umount -l)" >&2
            umount -l "$DISK" || echo "test_disk_full: cannot unmount $DISK" >&2
        fi
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'die "stopped by a signal (the watchdog?)"' TERM INT

skip() {
    echo "SKIP test_disk_full: $*"
    exit 77
}
S_N=0 # coordinator starts
dump() {
    local f
    for f in "$WORK"/server.*.out "$WORK"/server.*.err "$WORK"/c*.log; do
        [ -f "$f" ] && { echo "==== $f" && tail -n 15 "$f"; } >&2
    done
    df -k "$DISK" >&2 2>/dev/null || true
    return 0
}
die() {
    trap - TERM INT
    dump
    fail "$*"
}


# ---- the tmpfs ------------------------------------------------------------------
[ "$(id -u)" = 0 ] || skip "needs root to mount a tmpfs"
mkdir -p "$DISK"
mount -t tmpfs -o size=32m,mode=0700 strata-disk-full "$DISK" 2>"$WORK/mount.err" ||
    skip "cannot mount a tmpfs: $(cat "$WORK/mount.err")"
MOUNTED=1
avail_kb() { echo $(($(stat -f -c '%a * %S' "$DISK") / 1024)); }
FILLS=0
fill_all() { # fill_all: a new filler file written until ENOSPC; the disk is full
    FILLS=$((FILLS + 1))
    if dd if=/dev/zero of="$DISK/fill.$FILLS" bs=64k 2>"$WORK/dd.err"; then
        die "dd filled a 32 MiB tmpfs without running out of space"
    fi
    grep -q "No space left on device" "$WORK/dd.err" || die "dd: $(cat "$WORK/dd.err")"
    [ "$(avail_kb)" = 0 ] || die "the disk is not full after dd: $(avail_kb) KiB left"
}
fill_but() { # fill_but KB: a new filler file leaving KB KiB free
    local a
    a=$(avail_kb)
    [ "$a" -gt "$1" ] || die "only $a KiB free, cannot leave $1 KiB"
    FILLS=$((FILLS + 1))
    dd if=/dev/zero of="$DISK/fill.$FILLS" bs=1k count=$((a - $1)) 2>"$WORK/dd.err" ||
        die "dd: $(cat "$WORK/dd.err")"
    a=$(avail_kb)
    [ "$a" -ge $(($1 - 16)) ] && [ "$a" -le $(($1 + 16)) ] || die "$a KiB free, wanted $1 KiB"
}
free_all() { rm -f "$DISK"/fill.*; }

# ---- the coordinator ------------------------------------------------------------
C=(curl -sS --max-time 5)
URL=""
PORT=0
SPID=""
get() { "${C[@]}" "$URL$1" 2>/dev/null | tr -d '\000' || true; }
code() { "${C[@]}" -o /dev/null -w '%{http_code}' "$@" 2>/dev/null || true; }
round_field() { json_field "$(get "/v1/rounds/$1")" "$2"; }
round_state() { # round_state R: open, closed, or none (not opened)
    local c
    c=$(code "$URL/v1/rounds/$1")
    case $c in
    404) echo none ;;
    200) round_field "$1" state ;;
    *) echo "HTTP-$c" ;;
    esac
}
round_is() { [ "$(round_state "$1")" = "$2" ]; }
start_server() { # start_server MIN_CLIENTS
    local k
    for k in 1 2 3 4 5; do
        S_N=$((S_N + 1))
        "$SERVER" --state-dir "$STATE" --model mlp --data "$DATA" --port "$PORT" \
            --rounds $ROUNDS --min-clients "$1" --clients-per-round $NC --policy uniform \
            --density 0.01 --max-steps 20 --round-deadline 300 --enrolment-secret "$SECRET" \
            >"$WORK/server.$S_N.out" 2>"$WORK/server.$S_N.err" &
        SPID=$!
        PIDS+=("$SPID")
        local end=$((SECONDS + 30))
        until grep -q "listening on" "$WORK/server.$S_N.out" 2>/dev/null; do
            if ! alive "$SPID"; then
                reap "$SPID"
                # The port may still be held for a moment after a kill.
                grep -q "cannot listen" "$WORK/server.$S_N.err" && [ "$PORT" != 0 ] && break
                die "coordinator start $S_N failed (exit $REAPED_RC): $(cat "$WORK/server.$S_N.err")"
            fi
            [ "$SECONDS" -lt "$end" ] || die "coordinator start $S_N: not listening after 30 s"
            sleep 0.1
        done
        if alive "$SPID"; then
            URL=$(sed -n 's/^strata-server: listening on //p' "$WORK/server.$S_N.out" | head -n 1)
            [ "$PORT" = 0 ] || [ "$URL" = "http://127.0.0.1:$PORT" ] || die "restarted on $URL"
            PORT=${URL##*:}
            return 0
        fi
        sleep 0.5
    done
    die "coordinator start $S_N: cannot listen on port $PORT"
}
stop_server() { # stop_server SIGNAL
    kill "-$1" "$SPID"
    local end=$((SECONDS + 20))
    while alive "$SPID"; do
        [ "$SECONDS" -lt "$end" ] || die "the coordinator did not stop on SIG$1"
        sleep 0.1
    done
    reap "$SPID"
}
ADMIN_TOKEN=""
admin() { # admin ACTION: pause or resume; must be accepted
    local body
    body=$("${C[@]}" -X POST -H "Authorization: Bearer $ADMIN_TOKEN" "$URL/v1/admin/$1" 2>&1) ||
        die "admin $1: $body"
    [[ $body == *'"state"'* ]] || die "admin $1 answered $body"
}

# ---- the clients ----------------------------------------------------------------
CPID=()
start_client() { # start_client INDEX
    "$CLIENT" --server "$URL" --state-dir "$WORK/c$1" --data "$DATA" --partition iid \
        --num-clients $NC --client-index "$1" --threads 1 --poll-wait 5 --name "edge-$1" \
        --enrolment-secret "$SECRET" >>"$WORK/c$1.log" 2>&1 &
    CPID[$1]=$!
    PIDS+=("${CPID[$1]}")
}
proc_state() { sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2>/dev/null || echo gone; }
all_stopped() {
    local i
    for ((i = 0; i < NC; i++)); do [ "$(proc_state "${CPID[i]}")" = T ] || return 1; done
}
freeze() { # SIGSTOP every client (an open round then gets no upload)
    local i
    for ((i = 0; i < NC; i++)); do kill -STOP "${CPID[i]}"; done
    wait_until 10 "every client stopped" all_stopped
}
thaw() {
    local i
    for ((i = 0; i < NC; i++)); do kill -CONT "${CPID[i]}"; done
}
clients_alive() { # each client still runs and was not told that the run finished
    local i
    for ((i = 0; i < NC; i++)); do
        alive "${CPID[i]}" || die "client $i exited during $1: $(tail -n 3 "$WORK/c$i.log")"
        grep -q "the federation has finished" "$WORK/c$i.log" &&
            die "client $i was told that the federation finished during $1"
    done
    [ "$(metric 'strata_requests_rejected_total{reason="finished"}')" = 0 ] ||
        die "a client got 410 finished during $1"
    return 0
}
receipts_of() { # receipts_of ROUND: how many clients hold a receipt for ROUND
    local i n=0
    for ((i = 0; i < NC; i++)); do
        [ -f "$WORK/c$i/receipts.log" ] && grep -q "^$1 " "$WORK/c$i/receipts.log" && n=$((n + 1))
    done
    echo "$n"
}
receipts_are() { [ "$(receipts_of "$1")" = "$2" ]; }
registered() { [ "$(grep -l "registered as client" "$WORK"/c*.log 2>/dev/null | wc -l)" = $NC ]; }

# open_gated R: opens round R with the clients stopped and pauses the
# coordinator again, so that R gets no upload and R + 1 does not open once
# R closes; the caller thaws the clients.
open_gated() {
    freeze
    admin resume
    wait_until 20 "round $1 to open" round_is "$1" open
    admin pause
    [ "$(round_field "$1" participants)" = 0 ] || die "round $1 received updates while gated"
}
round_closed_with() { round_is "$1" closed && [ "$(round_field "$1" participants)" = "$2" ]; }

# ---- start-up: every client registered, no round open ----------------------------
# --min-clients 4 keeps round 0 from opening with the 3 clients registered.
start_server 4
ADMIN_TOKEN=$(head -n 1 "$STATE/admin.token")
[ -n "$ADMIN_TOKEN" ] || die "no admin token in $STATE/admin.token"
for ((i = 0; i < NC; i++)); do start_client "$i"; done
wait_until 60 "every client registered" registered
[ "$(metric strata_registered_clients)" = $NC ] || die "registered: $(metric strata_registered_clients)"
round_is 0 none || die "round 0 opened with $NC of 4 clients"

# ---- 0. the disk full at round open, the coordinator restarted while full --------
fill_all
stop_server TERM
[ "$REAPED_RC" = 0 ] || die "coordinator exit status $REAPED_RC after SIGTERM on a full disk"
start_server 3 # a round may open now; the store cannot record it
open_failures() { grep -c "opening round 0 failed" "$WORK/server.$S_N.err" || true; }
open_failed_twice() { [ "$(open_failures)" -ge 2 ]; }
wait_until 15 "opening round 0 to fail twice" open_failed_twice
grep -q "opening round 0 failed (attempt 2): .*; retrying in 2 s" "$WORK/server.$S_N.err" ||
    die "opening round 0 is not retried with a backoff"
round_is 0 none || die "round 0 on a full disk: $(get /v1/rounds/0)"
st=$(get /v1/status)
[ "$(json_field "$st" state)" = waiting ] || die "status on a full disk: $st"
for ((i = 0; i < NC; i++)); do
    tok=$(json_field "$(cat "$WORK/c$i/identity.json")" token)
    c=$(code -H "Authorization: Bearer $tok" "$URL/v1/tasks/next?wait=0")
    [ "$c" = 204 ] || die "client $i's task request on a full disk: HTTP $c (204 expected)"
done
clients_alive "phase 0"
OPEN_FAILS=$(open_failures)
freeze # round 0 opens once freed; it must not close before the pause
free_all
wait_until 20 "round 0 to open once the disk is freed" round_is 0 open
admin pause
thaw
wait_until 30 "round 0 closed" round_closed_with 0 $NC
grep -q "round 0: opened after [0-9]* failed attempts" "$WORK/server.$S_N.err" ||
    die "the coordinator did not log round 0's late opening"
echo "test_disk_full: phase 0 done: round 0 opened after $OPEN_FAILS failed attempts on a full disk"

# ---- 1. the disk full while round 1 receives its uploads ------------------------
U0=$(metric 'strata_updates_rejected_total{reason="unavailable"}')
open_gated 1
fill_all
thaw
retried_each() { # every client was answered 5xx for its round-1 upload and retries
    local i
    for ((i = 0; i < NC; i++)); do
        grep -q "POST /v1/rounds/1/updates: server busy or failing; retrying" "$WORK/c$i.log" ||
            return 1
    done
}
wait_until 30 "each client's round-1 upload refused and retried" retried_each
[ "$(metric 'strata_updates_rejected_total{reason="unavailable"}')" -ge $((U0 + NC)) ] ||
    die "round-1 uploads refused, but not as unavailable: $(get /metrics | grep rejected_total | grep -v ' 0$')"
[ "$(round_field 1 participants)" = 0 ] || die "round 1 acknowledged an update on a full disk: $(get /v1/rounds/1)"
receipts_are 1 0 || die "a client holds a round-1 receipt from a full disk"
round_is 1 open || die "round 1 on a full disk: $(get /v1/rounds/1)"
# Other writes are refused the same way: 503 with Retry-After, nothing changed.
unavailable() { # unavailable WHAT CURL-ARGS...: the request is answered 503 unavailable
    local what=$1 out
    shift
    out=$("${C[@]}" -i "$@" "${AUTH[@]}" 2>&1 | tr -d '\r' || true)
    [[ $out == "HTTP/1.1 503"* ]] && [[ $out == *'"code":"unavailable"'* ]] &&
        grep -qi '^Retry-After: [1-9]' <<<"$out" || die "$what on a full disk answered: $out"
}
AUTH=(-H "Authorization: Bearer $ADMIN_TOKEN")
unavailable "admin resume" -X POST "$URL/v1/admin/resume"
[ "$(json_field "$(get /v1/status)" state)" = paused ] || die "a refused resume changed the state"
AUTH=(-H "Content-Type: application/json")
unavailable "a registration" -d "{\"name\":\"late\",\"enrolment_secret\":\"$SECRET\"}" "$URL/v1/clients"
[ "$(metric strata_registered_clients)" = $NC ] || die "a registration was kept on a full disk"
[ "$(metric strata_rounds_completed_total)" = 1 ] || die "a round closed on a full disk"
clients_alive "phase 1"
free_all
wait_until 40 "round 1 closed once the disk is freed" round_closed_with 1 $NC
receipts_are 1 $NC || die "round 1 closed, yet $(receipts_of 1) clients hold a receipt"
echo "test_disk_full: phase 1 done: $(($(metric 'strata_updates_rejected_total{reason="unavailable"}') - U0)) uploads refused with 503 on a full disk"

# ---- a round without faults ------------------------------------------------------
open_gated 2
thaw
wait_until 30 "round 2 closed" round_closed_with 2 $NC

# ---- 2. room for round 3's uploads, not for its checkpoint; a restart while full -
F0=$(metric strata_round_close_failures_total)
open_gated 3
fill_but $ROOM_KB
thaw
wait_until 30 "the round-3 uploads acknowledged" receipts_are 3 $NC
close_failed() { [ "$(metric strata_round_close_failures_total)" -ge "$1" ]; }
wait_until 30 "round 3's close to fail twice" close_failed $((F0 + 2))
[ "$(metric strata_round_close_pending)" = 1 ] || die "strata_round_close_pending is not 1"
round_is 3 open || die "round 3 with its close failing: $(get /v1/rounds/3)"
[ "$(round_field 3 participants)" = $NC ] || die "round 3: $(get /v1/rounds/3)"
[ "$(metric strata_rounds_completed_total)" = 3 ] || die "rounds completed: $(metric strata_rounds_completed_total)"
grep -q "round 3: closing failed (attempt 2)" "$WORK/server.$S_N.err" || die "no failed close logged"
tok=$(json_field "$(cat "$WORK/c0/identity.json")" token)
c=$(code -H "Authorization: Bearer $tok" "$URL/v1/tasks/next?wait=0")
[ "$c" = 204 ] || die "a task request while round 3's close fails: HTTP $c (204 expected)"
clients_alive "phase 2"
fill_all # the rest: the disk is full now
stop_server KILL
start_server 3
[ "$(metric strata_updates_accepted_total)" = $((4 * NC)) ] ||
    die "after the restart on a full disk: $(metric strata_updates_accepted_total) updates accepted"
round_is 3 open && [ "$(round_field 3 participants)" = $NC ] ||
    die "round 3 after the restart on a full disk: $(get /v1/rounds/3)"
close_failed_here() { grep -q "round 3: closing failed (attempt 1)" "$WORK/server.$S_N.err"; }
wait_until 20 "round 3's close to fail after the restart" close_failed_here
[ "$(metric strata_round_close_pending)" = 1 ] || die "strata_round_close_pending is not 1 after the restart"
clients_alive "phase 2, after the restart"
free_all
wait_until 45 "round 3 closed once the disk is freed" round_closed_with 3 $NC
[ "$(metric strata_round_close_pending)" = 0 ] || die "strata_round_close_pending is still 1"
echo "test_disk_full: phase 2 done: round 3's close failed $(cat "$WORK"/server.*.err | grep -c "round 3: closing failed") times, then succeeded"

# ---- the rest of the run -------------------------------------------------------------
clients_alive "the last rounds"
admin resume
all_exited() {
    local i
    for ((i = 0; i < NC; i++)); do alive "${CPID[i]}" && return 1; done
    return 0
}
wait_until 60 "every client to exit" all_exited
for ((i = 0; i < NC; i++)); do
    reap "${CPID[i]}"
    [ "$REAPED_RC" = 0 ] || die "client $i exit status $REAPED_RC"
    [ "$(grep -c "the federation has finished" "$WORK/c$i.log")" = 1 ] ||
        die "client $i did not see the end of the run exactly once"
    [ "$(grep -c "registered as client" "$WORK/c$i.log")" = 1 ] || die "client $i registered twice"
    grep -q "update refused" "$WORK/c$i.log" && die "client $i had an update refused"
    [ ! -e "$WORK/c$i/pending.json" ] || die "client $i still holds a staged upload"
    rounds=$(cut -d' ' -f1 "$WORK/c$i/receipts.log" | tr '\n' ' ')
    [ "$rounds" = "$(seq -s ' ' 0 $((ROUNDS - 1))) " ] || die "client $i holds receipts for rounds '$rounds'"
done
st=$(get /v1/status)
[ "$(json_field "$st" state)" = finished ] || die "status: $st"
[ "$(json_field "$st" round)" = $ROUNDS ] || die "status: $st"
[ "$(metric strata_rounds_completed_total)" = $ROUNDS ] ||
    die "rounds completed: $(metric strata_rounds_completed_total), expected $ROUNDS"
[ "$(metric strata_rounds_failed_total)" = 0 ] || die "rounds failed: $(metric strata_rounds_failed_total)"
TOTAL=$((ROUNDS * NC))
[ "$(metric strata_updates_accepted_total)" = $TOTAL ] ||
    die "accepted $(metric strata_updates_accepted_total), expected $TOTAL"
stop_server TERM
[ "$REAPED_RC" = 0 ] || die "coordinator exit status $REAPED_RC after SIGTERM"
grep -h "internal error" "$WORK"/server.*.err && die "the coordinator answered 500 (internal error)"

# ---- every acknowledged update is in the store ----------------------------------------
# The clients' receipts: "ROUND CLIENT_ID RECEIPT", one line per (round, client).
: >"$WORK/receipts.txt"
for ((i = 0; i < NC; i++)); do
    id=$(json_field "$(cat "$WORK/c$i/identity.json")" client_id)
    awk -v id="$id" 'NF == 2 { print $1, id, $2 }' "$WORK/c$i/receipts.log" >>"$WORK/receipts.txt"
done
sort -k1,1n -k2,2n -o "$WORK/receipts.txt" "$WORK/receipts.txt"
[ "$(wc -l <"$WORK/receipts.txt")" = $TOTAL ] || die "$(wc -l <"$WORK/receipts.txt") receipts, expected $TOTAL"
sqlite3 -readonly -batch -noheader -separator ' ' "$STATE/state.db" \
    "SELECT round, client_id, receipt, bytes, lower(hex(sha256)) FROM updates ORDER BY round, client_id" \
    >"$WORK/accepted.txt" || die "cannot read $STATE/state.db"
cut -d' ' -f1-3 "$WORK/accepted.txt" | diff - "$WORK/receipts.txt" >"$WORK/diff.txt" ||
    die "accepted updates and receipts differ (< coordinator, > clients): $(cat "$WORK/diff.txt")"
while read -r r id receipt bytes sha; do
    f="$WORK/stored.bin"
    stored_payload "$STATE" "$r" "$id" "$f" || die "round $r, client $id (receipt $receipt): no stored payload"
    [ "$(stat -c %s "$f")" = "$bytes" ] || die "$f: $(stat -c %s "$f") bytes, the store says $bytes"
    [ "$(sha256sum <"$f" | cut -d' ' -f1)" = "$sha" ] || die "$f: SHA-256 differs from the store's"
done <"$WORK/accepted.txt"
[ "$(stored_count "$STATE")" = $TOTAL ] || die "stray stored payloads in $STATE/state.db"

# Each refusal and failed attempt is logged once (the counters of a killed
# coordinator are not all saved).
UNAVAIL=$(cat "$WORK"/server.*.err | grep -c "an update could not be stored" || true)
CLOSE_FAILS=$(cat "$WORK"/server.*.err | grep -c "closing failed" || true)
RETRIES=$(cat "$WORK"/c*.log | grep -c "/updates: server busy or failing; retrying" || true)
echo "test_disk_full: $ROUNDS rounds, $TOTAL receipts = $TOTAL stored updates; round 0's open" \
    "failed $OPEN_FAILS times; $UNAVAIL uploads answered 503 ($RETRIES client retries);" \
    "$CLOSE_FAILS failed closes (1 coordinator restart on a full disk)"
echo "PASS test_disk_full ($((SECONDS - T_START)) s)"
