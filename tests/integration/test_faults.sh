#!/usr/bin/env bash
# Fault injection over one multi-round run with real processes: a coordinator
# (mlp, uniform policy at 5%, 8 rounds) and 4 clients, one of them in a
# network namespace of its own, joined to the host by a veth pair (its
# uploads capped with tbf so that each lasts ~1.5 s). Everything
# talks to the coordinator on the host end of the veth pair. The data set is a
# small copy of Fashion-MNIST (2000 training samples per client).
#  - The coordinator is killed (SIGKILL) at random moments, at least 10 times
#    (some while it is still starting up), and restarted with the same state
#    directory, address and port.
#  - The namespace client is killed (SIGKILL) while an upload is staged and in
#    flight, the other clients at random moments (preferably while they hold
#    a staged upload); each is restarted with its state directory.
#  - The namespace client's link is taken down for a few seconds and brought
#    up again, twice; the client must recover by itself.
# The run must complete (status "finished", every client exits 0). Then the
# coordinator's accepted updates (its SQLite rows, round summaries, stored
# files and /metrics) must equal the receipts the clients hold, with every
# (round, client) once, and a re-upload of a stored payload must return the
# client's receipt as a duplicate without being counted.
#
# The fault schedule comes from $RANDOM with a printed seed:
# STRATA_FAULT_SEED=N replays the same schedule (process timings still vary).
# STRATA_FAULT_KEEP=DIR keeps the run's logs and state directories there.
# Needs root for the namespace; exits 77 (skipped) when it cannot make one.

# A watchdog: the whole test stops within ~150 s whatever happens (every wait
# below is bounded too; this is the last resort).
if [ -z "${STRATA_FAULT_WATCHDOG:-}" ] && command -v timeout >/dev/null; then
    export STRATA_FAULT_WATCHDOG=1
    exec timeout -k 10 150 bash "$0" "$@"
fi
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
CLIENT="$BUILD/strata-client"
for x in "$SERVER" "$CLIENT"; do [ -x "$x" ] || fail "no $x"; done
for x in curl sqlite3 ip; do command -v "$x" >/dev/null || fail "$x is required"; done
export OMP_WAIT_POLICY=passive
T_START=$SECONDS
RUN_DEADLINE=$((SECONDS + 128)) # the run must be finished by then
DEADLINE=$((SECONDS + 140))     # every wait, the checks included, stops here
ROUNDS=8
NC=4
NSI=3 # the client in the network namespace
SECRET="faults-s3cret-$$"
MIN_KILLS=10  # coordinator kills, at least
NS_KILLS=3    # namespace client kills with an upload in flight
HOST_KILLS=3  # kills of the other clients
LINK_CUTS=2   # namespace link cuts
STATE="$WORK/state"
EVENTS="$WORK/events.log"

SEED=${STRATA_FAULT_SEED:-$(((${EPOCHREALTIME/[.,]/} ^ $$) % 32768))}
RANDOM=$SEED
echo "test_faults: seed $SEED (STRATA_FAULT_SEED=$SEED replays this fault schedule)"

# ---- bookkeeping, cleanup -----------------------------------------------------
NS="strata-fault-$$"
VH="stfh$$" # host end of the veth pair
VN="stfn$$" # namespace end
NS_MADE=0
VETH_MADE=0
S_N=0
cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        kill -KILL "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    PIDS=()
    [ "$VETH_MADE" = 1 ] && ip link del "$VH" 2>/dev/null
    [ "$NS_MADE" = 1 ] && ip netns del "$NS" 2>/dev/null
    if [ -n "${STRATA_FAULT_KEEP:-}" ] && [ -d "$WORK" ]; then
        mkdir -p "$STRATA_FAULT_KEEP" && cp -a "$WORK/." "$STRATA_FAULT_KEEP/" &&
            echo "test_faults: logs and state kept in $STRATA_FAULT_KEEP" >&2
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'die "stopped by a signal (the watchdog?)"' TERM INT

skip() {
    echo "SKIP test_faults: $*"
    exit 77
}

# now: the time in ms (since the epoch) in NOW. Integer arithmetic only.
now() { NOW=$((${EPOCHREALTIME/[.,]/} / 1000)); }
now
T0_MS=$NOW
# rnd MIN MAX: a random integer in [MIN, MAX] in R (from the seeded $RANDOM;
# never called in a subshell, which would reseed it).
rnd() { R=$(($1 + RANDOM % ($2 - $1 + 1))); }
event() { # event TEXT: one line of the fault log, with the time since start
    now
    local t
    t=$(printf '%d.%d' $(((NOW - T0_MS) / 1000)) $(((NOW - T0_MS) % 1000 / 100)))
    echo "  t=${t}s $*" | tee -a "$EVENTS"
}

dump() { # the fault events are on stdout already; the logs' ends go to stderr
    local f k
    for ((k = S_N - 2; k <= S_N; k++)); do
        f="$WORK/server.$k"
        [ -f "$f.out" ] || continue
        { echo "==== $f.out" && tail -n 8 "$f.out" && echo "==== $f.err" && tail -n 8 "$f.err"; } >&2
    done
    for f in "$WORK"/c*.log; do
        [ -f "$f" ] && { echo "==== $f" && tail -n 25 "$f"; } >&2
    done
    return 0
}
die() {
    trap - TERM INT
    dump
    echo "FAIL: $* (seed $SEED)" >&2
    exit 1
}

# ---- the network namespace ----------------------------------------------------
[ "$(id -u)" = 0 ] || skip "needs root to create a network namespace"
ip netns add "$NS" 2>"$WORK/ip.err" || skip "cannot create a network namespace: $(cat "$WORK/ip.err")"
NS_MADE=1
# A free /30 in 10.213.0.0/16, derived from the PID.
HOST_IP=""
for ((k = 0; k < 64; k++)); do
    n=$((($$ + k) % 16384))
    o3=$((n >> 6)) o4=$(((n & 63) * 4))
    grep -Eq " 10\.213\.$o3\.($((o4 + 1))|$((o4 + 2)))/" <<<"$(ip -4 -o addr show)" && continue
    HOST_IP=10.213.$o3.$((o4 + 1)) NS_IP=10.213.$o3.$((o4 + 2))
    break
done
[ -n "$HOST_IP" ] || fail "no free /30 in 10.213.0.0/16"
ip link add "$VH" type veth peer name "$VN" netns "$NS" 2>"$WORK/ip.err" ||
    skip "cannot create a veth pair: $(cat "$WORK/ip.err")"
VETH_MADE=1
# No IPv6 chatter (router solicitations, DAD) on the pair: IPv4 only.
{ echo 1 >"/proc/sys/net/ipv6/conf/$VH/disable_ipv6"; } 2>/dev/null || true
ip netns exec "$NS" sh -c "echo 1 >/proc/sys/net/ipv6/conf/$VN/disable_ipv6" 2>/dev/null || true
ip addr add "$HOST_IP/30" dev "$VH"
ip link set "$VH" up
ip -n "$NS" link set lo up
ip -n "$NS" addr add "$NS_IP/30" dev "$VN"
ip -n "$NS" link set "$VN" up
# Slow uploads from the namespace (25 KB/s: ~1.5 s each), so that they can be
# caught in flight (and the rounds leave time for the faults).
TBF=1
ip netns exec "$NS" tc qdisc add dev "$VN" root tbf rate 200kbit burst 16kb latency 500ms \
    2>"$WORK/tc.err" || {
    TBF=0
    echo "test_faults: warning: no tbf ($(cat "$WORK/tc.err")); namespace uploads run at full speed"
}
echo "test_faults: namespace $NS ($VN $NS_IP) <-> $VH $HOST_IP"

# ---- a small copy of the data set -------------------------------------------------
# 2000 training samples per client and 2000 test samples, uncompressed: every
# (re)start of a client or of the coordinator loads its split in a moment.
SUB="$WORK/data"
mkdir -p "$SUB"
subset() { # subset NAME COUNT: the first COUNT records of IDX file NAME[.gz]
    local src="$DATA/$1" dst="$SUB/$1" n=$2 h k rec=1
    [ -f "$src" ] || src="$src.gz"
    [ -f "$src" ] || return 1
    # Header: magic (its last byte: the number of dimensions D), then D
    # big-endian sizes, the first being the record count.
    read -r -a h <<<"$(
        set +o pipefail
        gzip -dcf "$src" | head -c 16 | od -An -v -tu1
    )"
    [ "${#h[@]}" = 16 ] && [ "${h[3]}" -ge 1 ] && [ "${h[3]}" -le 3 ] || return 1
    for ((k = 1; k < h[3]; k++)); do
        rec=$((rec * ((h[4 + 4 * k] << 24) | (h[5 + 4 * k] << 16) | (h[6 + 4 * k] << 8) | h[7 + 4 * k])))
    done
    [ $(((h[4] << 24) | (h[5] << 16) | (h[6] << 8) | h[7])) -ge "$n" ] || return 1
    (
        printf '\x00\x00\x08'
        printf '%b' "$(printf '\\x%02x' "${h[3]}" $((n >> 24 & 255)) $((n >> 16 & 255)) $((n >> 8 & 255)) $((n & 255)))"
        set +o pipefail
        gzip -dcf "$src" | head -c $((4 + 4 * h[3] + n * rec)) | tail -c +9
    ) >"$dst"
}
if subset train-images-idx3-ubyte $((NC * 2000)) && subset train-labels-idx1-ubyte $((NC * 2000)) &&
    subset t10k-images-idx3-ubyte 2000 && subset t10k-labels-idx1-ubyte 2000; then
    DATA=$SUB
else
    echo "test_faults: no Fashion-MNIST IDX files in $DATA; using it whole"
fi

# ---- the coordinator ------------------------------------------------------------
C=(curl -sS --max-time 2)
URL=""
get() { "${C[@]}" "$URL$1" 2>/dev/null | tr -d '\000' || true; }

S_STATE=down # down, starting (launched, not yet listening), up
SPID=""
S_UP_AT=0     # when down: relaunch at
S_KILL_PROG=0 # when up: kill once the clients hold this many receipts,
S_KILL_AT=0   # or from this time on, once they got one from this coordinator;
S_KILL_DELAY=0
S_TRIGGER=0   # then at this moment (0: not yet triggered)
PORT=0
KILLS=0
EARLY_KILLS=0
BIND_RETRIES=0
FINISHED=0
ROUND_NOW=0
PROG=0 # receipts the clients hold
PROG_UP=0
count_receipts() { # builtins only: this runs every tick
    local i lines n=0
    for ((i = 0; i < NC; i++)); do
        [ -f "$WORK/c$i/receipts.log" ] || continue
        mapfile -t lines <"$WORK/c$i/receipts.log"
        n=$((n + ${#lines[@]}))
    done
    PROG=$n
}
launch_server() {
    S_N=$((S_N + 1))
    "$SERVER" --state-dir "$STATE" --model mlp --data "$DATA" --host "$HOST_IP" --port "$PORT" \
        --rounds $ROUNDS --min-clients $NC --clients-per-round $NC --policy uniform --density 0.05 \
        --local-epochs 1 --max-steps 20 --round-deadline 300 --enrolment-secret "$SECRET" \
        >"$WORK/server.$S_N.out" 2>"$WORK/server.$S_N.err" &
    SPID=$!
    PIDS+=("$SPID")
    S_STATE=starting
    now
    S_LAUNCHED=$NOW
    # Now and then a kill while it starts up (opening the store, replaying
    # the open round): it takes a fraction of a second, so wait for it here.
    if [ "$FAULTS" = 1 ] && [ "$FINISHED" = 0 ] && [ $((RANDOM % 4)) = 0 ]; then
        rnd 10 250
        sleep "0.$(printf '%03d' "$R")"
        grep -q "listening on" "$WORK/server.$S_N.out" 2>/dev/null || kill_server
    fi
}
# The next kill of a listening coordinator: after a random number G of new
# receipts, or after a random 3-8 s once there is at least one, plus a random
# delay. G is at most the receipts left before the last round divided by the
# kills still due (MIN_KILLS + 2 by then), and the delay short when that is
# tight, so that at least MIN_KILLS happen however fast the rounds go; waiting
# for progress keeps the run moving and the clients' backoff from running
# away.
schedule_kill() {
    local need=$((MIN_KILLS + 2 - KILLS)) left=$(((ROUNDS - 1) * NC - PROG)) gmax=4
    if [ "$need" -gt 0 ]; then
        gmax=$((left / need))
        [ "$gmax" -le 3 ] || gmax=3
        [ "$gmax" -ge 1 ] || gmax=1
    fi
    rnd 1 "$gmax"
    S_KILL_PROG=$((PROG + R))
    rnd 3000 8000
    S_KILL_AT=$((NOW + R))
    if [ "$gmax" -ge 3 ]; then rnd 0 800; else rnd 0 300; fi
    S_KILL_DELAY=$R
    S_TRIGGER=0
    PROG_UP=$PROG
}
kill_server() {
    local what=$S_STATE
    kill -KILL "$SPID" 2>/dev/null || true
    reap "$SPID"
    KILLS=$((KILLS + 1))
    [ "$what" = starting ] && EARLY_KILLS=$((EARLY_KILLS + 1))
    rnd 100 1500
    now
    S_UP_AT=$((NOW + R))
    S_STATE=down
    event "coordinator kill $KILLS (pid $SPID, $what, round $ROUND_NOW, $PROG receipts), down for ${R} ms"
}
poll_server() {
    now
    case $S_STATE in
    down)
        [ "$NOW" -ge "$S_UP_AT" ] && launch_server
        ;;
    starting)
        if grep -q "listening on" "$WORK/server.$S_N.out" 2>/dev/null; then
            local u
            u=$(sed -n 's/^strata-server: listening on //p' "$WORK/server.$S_N.out" | head -n 1)
            if [ "$PORT" = 0 ]; then
                PORT=${u##*:}
                URL=$u
            fi
            [ "$u" = "http://$HOST_IP:$PORT" ] || die "coordinator start $S_N listens on $u"
            S_STATE=up
            S_KILL_PROG=0
            [ "$FAULTS" = 1 ] && schedule_kill
            NEXT_STATUS=0
        elif ! alive "$SPID"; then
            reap "$SPID"
            # The port may still be held for a moment after a kill: retry.
            if grep -q "cannot listen" "$WORK/server.$S_N.err" && [ "$BIND_RETRIES" -lt 40 ]; then
                BIND_RETRIES=$((BIND_RETRIES + 1))
                S_STATE=down
                S_UP_AT=$((NOW + 250))
            else
                die "coordinator start $S_N failed (exit $REAPED_RC): $(cat "$WORK/server.$S_N.err")"
            fi
        elif [ $((NOW - S_LAUNCHED)) -gt 20000 ]; then
            die "coordinator start $S_N: not listening after 20 s"
        fi
        ;;
    up)
        alive "$SPID" || {
            reap "$SPID"
            die "the coordinator exited by itself (exit $REAPED_RC)"
        }
        if [ "$NOW" -ge "$NEXT_STATUS" ]; then
            NEXT_STATUS=$((NOW + 700))
            local m nl=$'\n'
            m=$(get /metrics)
            if [[ $nl$m =~ ${nl}strata_round\ ([0-9]+) ]]; then
                ROUND_NOW=${BASH_REMATCH[1]}
                if [ "$ROUND_NOW" -ge "$ROUNDS" ] && [ "$FINISHED" = 0 ]; then
                    FINISHED=1
                    event "the coordinator closed the last round"
                fi
            fi
        fi
        [ "$FINISHED" = 0 ] && [ "$S_KILL_PROG" != 0 ] || return 0
        if [ "$S_TRIGGER" = 0 ] && { [ "$PROG" -ge "$S_KILL_PROG" ] ||
            { [ "$NOW" -ge "$S_KILL_AT" ] && [ "$PROG" -gt "$PROG_UP" ]; }; }; then
            S_TRIGGER=$((NOW + S_KILL_DELAY))
        fi
        [ "$S_TRIGGER" != 0 ] && [ "$NOW" -ge "$S_TRIGGER" ] && kill_server
        ;;
    esac
    return 0
}

# ---- the clients ------------------------------------------------------------------
CPID=()
C_STATE=() # up, down (killed, restart at C_UP_AT), exited (exited 0 at the end)
C_UP_AT=()
CLIENT_KILLS=0
STAGED_KILLS=0 # kills of a client holding a staged upload
start_client() { # start_client INDEX
    local i=$1 ns=()
    [ "$i" = "$NSI" ] && ns=(ip netns exec "$NS")
    echo "---- test_faults: start" >>"$WORK/c$i.log"
    "${ns[@]}" "$CLIENT" --server "$URL" --state-dir "$WORK/c$i" --data "$DATA" --partition iid \
        --num-clients $NC --client-index "$i" --threads 1 --poll-wait 5 --name "edge-$i" \
        --enrolment-secret "$SECRET" >>"$WORK/c$i.log" 2>&1 &
    CPID[i]=$!
    PIDS+=("${CPID[i]}")
    C_STATE[i]=up
}
kill_client() { # kill_client INDEX WHY; STAGED=1 when it held a staged upload
    local i=$1 staged=""
    kill -KILL "${CPID[i]}" 2>/dev/null || true
    reap "${CPID[i]}"
    CLIENT_KILLS=$((CLIENT_KILLS + 1))
    STAGED=0
    if [ -e "$WORK/c$i/pending.json" ]; then
        STAGED=1
        STAGED_KILLS=$((STAGED_KILLS + 1))
        staged=$(cat "$WORK/c$i/pending.json" 2>/dev/null || true)
        staged=", round $(json_field "$staged" round) staged and unacknowledged"
    fi
    rnd 300 2000
    now
    C_UP_AT[i]=$((NOW + R))
    C_STATE[i]=down
    event "client $i kill ($2$staged), down for ${R} ms"
}
poll_clients() {
    local i
    now
    for ((i = 0; i < NC; i++)); do
        case ${C_STATE[i]} in
        up)
            if ! alive "${CPID[i]}"; then
                reap "${CPID[i]}"
                [ "$REAPED_RC" = 0 ] || die "client $i exited with status $REAPED_RC"
                grep -q "the federation has finished" "$WORK/c$i.log" ||
                    die "client $i exited 0 without seeing the end of the run"
                C_STATE[i]=exited
                event "client $i finished"
            fi
            ;;
        down)
            [ "$NOW" -ge "${C_UP_AT[i]}" ] && start_client "$i"
            ;;
        esac
    done
    return 0
}

# The namespace client: killed a moment after it staged an upload (the tbf
# cap keeps the upload in flight for about a second).
NS_K=0
NS_INFLIGHT=0 # of them, kills with the upload still staged
NS_SEEN=0
NS_NEXT=0
NS_KILL_AT=0
poll_ns_kill() {
    [ "$NS_K" -lt "$NS_KILLS" ] && [ "${C_STATE[NSI]}" = up ] || return 0
    now
    [ "$NOW" -ge "$NS_NEXT" ] || return 0
    if [ ! -e "$WORK/c$NSI/pending.json" ]; then
        NS_SEEN=0
    elif [ "$NS_SEEN" = 0 ]; then
        NS_SEEN=1
        rnd 50 600
        NS_KILL_AT=$((NOW + R))
    elif [ "$NOW" -ge "$NS_KILL_AT" ]; then
        NS_SEEN=0
        NS_K=$((NS_K + 1))
        kill_client "$NSI" "namespace client, upload in flight"
        NS_INFLIGHT=$((NS_INFLIGHT + STAGED))
        rnd 3000 8000
        NS_NEXT=$((NOW + R))
    fi
    return 0
}
# The other clients: at random times, preferring one that holds a staged
# upload (in flight, or retried while the coordinator is down).
HK=0
HK_AT=0
poll_host_kill() {
    [ "$HK" -lt "$HOST_KILLS" ] || return 0
    now
    [ "$NOW" -ge "$HK_AT" ] || return 0
    local i pick="" any=()
    for ((i = 0; i < NC; i++)); do
        [ "$i" != "$NSI" ] && [ "${C_STATE[i]}" = up ] || continue
        any+=("$i")
        [ -e "$WORK/c$i/pending.json" ] && pick=$i
    done
    [ ${#any[@]} -gt 0 ] || return 0
    if [ -z "$pick" ]; then
        [ "$NOW" -ge $((HK_AT + 3000)) ] || return 0
        pick=${any[RANDOM % ${#any[@]}]}
    fi
    HK=$((HK + 1))
    kill_client "$pick" "random moment"
    rnd 4000 10000
    HK_AT=$((NOW + R))
}

# The namespace link: down for a few seconds, then up.
LINK=up
CUTS=0
CUT_AT=0
RESTORE_AT=0
CUT_MS=0
poll_link() {
    now
    if [ "$LINK" = up ] && [ "$CUTS" -lt "$LINK_CUTS" ] && [ "$FINISHED" = 0 ] &&
        [ "$NOW" -ge "$CUT_AT" ]; then
        ip -n "$NS" link set "$VN" down || die "cannot take $VN down"
        ip netns exec "$NS" curl -s --max-time 1 -o /dev/null "$URL/healthz" &&
            die "the link is down but the coordinator answers the namespace"
        LINK=down
        CUTS=$((CUTS + 1))
        rnd 3000 5000
        RESTORE_AT=$((NOW + R))
        CUT_MS=$((CUT_MS + R))
        event "link cut $CUTS: $VN down for ${R} ms"
    elif [ "$LINK" = down ] && [ "$NOW" -ge "$RESTORE_AT" ]; then
        ip -n "$NS" link set "$VN" up || die "cannot bring $VN up"
        LINK=up
        rnd 6000 14000
        CUT_AT=$((NOW + R))
        event "link $VN up again"
    fi
    return 0
}

# ---- start-up: the coordinator, the clients, registration ------------------------
FAULTS=0
launch_server
until [ "$S_STATE" = up ]; do
    [ "$SECONDS" -lt "$DEADLINE" ] || die "the coordinator did not start"
    poll_server
    sleep 0.05
done
ip netns exec "$NS" curl -sS --max-time 5 -o /dev/null "$URL/healthz" ||
    die "the coordinator is not reachable from the namespace"
for ((i = 0; i < NC; i++)); do start_client "$i"; done
# Faults start once every client is registered: a kill between the
# coordinator's commit of a registration and the client's reading of the
# answer leaves an orphan client id behind (the client registers again), which
# rounds would then select and wait for.
registered() { [ "$(grep -l "registered as client" "$WORK"/c*.log 2>/dev/null | wc -l)" = $NC ]; }
until registered; do
    [ "$SECONDS" -lt "$DEADLINE" ] || die "the clients did not register"
    poll_clients
    sleep 0.1
done
[ "$(readlink "/proc/${CPID[NSI]}/ns/net")" != "$(readlink /proc/$$/ns/net)" ] ||
    die "client $NSI does not run in the namespace"
FAULTS=1
now
count_receipts
schedule_kill
rnd 1000 4000
NS_NEXT=$((NOW + R))
rnd 2000 7000
HK_AT=$((NOW + R))
rnd 4000 12000
CUT_AT=$((NOW + R))
event "all $NC clients registered; faults start"

# ---- the run ----------------------------------------------------------------------
all_done() {
    local i
    for ((i = 0; i < NC; i++)); do [ "${C_STATE[i]}" = exited ] || return 1; done
}
until all_done && [ "$S_STATE" = up ] && [ "$LINK" = up ]; do
    [ "$SECONDS" -lt "$RUN_DEADLINE" ] ||
        die "the run did not finish in time (round $ROUND_NOW, $KILLS coordinator kills)"
    count_receipts
    poll_server
    poll_clients
    if [ "$FINISHED" = 0 ]; then
        poll_ns_kill
        poll_host_kill
    fi
    poll_link
    sleep 0.1
done
T_RUN=$((SECONDS - T_START))
event "every client exited 0"

# ---- checks -------------------------------------------------------------------------
[ "$KILLS" -ge "$MIN_KILLS" ] || die "only $KILLS coordinator kills (at least $MIN_KILLS wanted)"
[ "$CUTS" -ge 1 ] || die "the link was never cut"
[ "$NS_INFLIGHT" -ge 1 ] || die "the namespace client was never killed with an upload in flight"
st=$(get /v1/status)
[ "$(json_field "$st" state)" = finished ] || die "status: $st"

# The clients' receipts: "ROUND CLIENT_ID RECEIPT", one line per (round, client).
: >"$WORK/receipts.txt"
for ((i = 0; i < NC; i++)); do
    [ ! -e "$WORK/c$i/receipts.log.old" ] || die "client $i started afresh (receipts.log.old)"
    [ "$(grep -c "registered as client" "$WORK/c$i.log")" = 1 ] || die "client $i registered twice"
    [ ! -e "$WORK/c$i/pending.json" ] || die "client $i still holds a staged upload"
    id=$(json_field "$(cat "$WORK/c$i/identity.json")" client_id)
    rounds=$(cut -d' ' -f1 "$WORK/c$i/receipts.log" | tr '\n' ' ')
    [ "$rounds" = "$(seq -s ' ' 0 $((ROUNDS - 1))) " ] || die "client $i holds receipts for rounds '$rounds'"
    awk -v id="$id" 'NF == 2 { print $1, id, $2 }' "$WORK/c$i/receipts.log" >>"$WORK/receipts.txt"
done
sort -k1,1n -k2,2n -o "$WORK/receipts.txt" "$WORK/receipts.txt"
TOTAL=$(wc -l <"$WORK/receipts.txt")
[ "$TOTAL" = $((ROUNDS * NC)) ] || die "$TOTAL receipts, expected $((ROUNDS * NC))"
dups=$(cut -d' ' -f1,2 "$WORK/receipts.txt" | uniq -d)
[ -z "$dups" ] || die "(round, client) with two receipts: $dups"
dups=$(cut -d' ' -f3 "$WORK/receipts.txt" | sort | uniq -d)
[ -z "$dups" ] || die "a receipt held twice: $dups"

# The coordinator's view: round summaries, stored files, /metrics.
get "/v1/rounds?from=0&limit=1000" | sed 's/{"round":/\n&/g' |
    awk 'match($0, /^\{"round":[0-9]+/) {
        r = substr($0, 10, RLENGTH - 9); st = "?"; p = "?"
        if (match($0, /"state":"[a-z]+"/)) st = substr($0, RSTART + 9, RLENGTH - 10)
        if (match($0, /"participants":[0-9]+/)) p = substr($0, RSTART + 15, RLENGTH - 15)
        print r, st, p }' >"$WORK/rounds.txt"
cut -d' ' -f1 "$WORK/receipts.txt" | uniq -c | awk '{ print $2, "closed", $1 }' >"$WORK/rounds.want"
diff "$WORK/rounds.txt" "$WORK/rounds.want" >"$WORK/diff.txt" ||
    die "round summaries (round state participants) differ from the receipts: $(cat "$WORK/diff.txt")"
sqlite3 -readonly -batch -noheader -separator ' ' "$STATE/state.db" \
    "SELECT u.round, u.client_id FROM updates u JOIN payloads p ON p.seq = u.seq
     ORDER BY u.round, u.client_id" >"$WORK/stored.txt" || die "cannot read $STATE/state.db"
cut -d' ' -f1,2 "$WORK/receipts.txt" | diff "$WORK/stored.txt" - >"$WORK/diff.txt" ||
    die "stored payloads differ from the receipts: $(cat "$WORK/diff.txt")"
ACCEPTED=$(metric strata_updates_accepted_total)
COMPLETED=$(metric strata_rounds_completed_total)
# (Both counters are counted from the store's rounds and updates at start-up,
# so no kill can make them drift from what was acknowledged.)
[ "$ACCEPTED" = "$TOTAL" ] ||
    die "strata_updates_accepted_total is $ACCEPTED, the clients hold $TOTAL receipts (a kill between an update's commit and the counter's?)"
[ "$COMPLETED" = $ROUNDS ] ||
    die "strata_rounds_completed_total is $COMPLETED, expected $ROUNDS (a kill between a round's close and the counter's?)"

# The receipts are the coordinator's: a re-upload of a stored payload (one
# random round per client) gets the client's receipt back as a duplicate, and
# is not counted. (The SQLite comparison below covers every receipt.)
for ((i = 0; i < NC; i++)); do
    id=$(json_field "$(cat "$WORK/c$i/identity.json")" client_id)
    tok=$(json_field "$(cat "$WORK/c$i/identity.json")" token)
    r=$((RANDOM % ROUNDS))
    receipt=$(awk -v r="$r" '$1 == r { print $2 }' "$WORK/c$i/receipts.log")
    stored_payload "$STATE" "$r" "$id" "$WORK/resend.bin" || die "client $i round $r: no stored payload"
    body=$("${C[@]}" -H "Authorization: Bearer $tok" -H "Content-Type: application/octet-stream" \
        --data-binary @"$WORK/resend.bin" "$URL/v1/rounds/$r/updates" || true)
    [[ $body =~ \"receipt\":\"([0-9a-f]+)\" ]] && [ "${BASH_REMATCH[1]}" = "$receipt" ] ||
        die "client $i round $r: re-upload answered $body, the client holds $receipt"
    [[ $body =~ \"duplicate\":true ]] || die "client $i round $r: $body"
done
[ "$(metric strata_updates_accepted_total)" = "$TOTAL" ] || die "re-uploads were counted"

kill -TERM "$SPID"
k=0
while alive "$SPID" && [ "$k" -lt 200 ]; do
    sleep 0.1
    k=$((k + 1))
done
alive "$SPID" && die "the coordinator did not stop on SIGTERM"
reap "$SPID"
[ "$REAPED_RC" = 0 ] || die "coordinator exit status $REAPED_RC after SIGTERM"

# The coordinator's durable record equals the receipts, row for row.
sqlite3 -readonly -batch -noheader -separator ' ' "$STATE/state.db" \
    "SELECT round, client_id, receipt FROM updates ORDER BY round, client_id" >"$WORK/accepted.txt" ||
    die "cannot read $STATE/state.db"
diff "$WORK/accepted.txt" "$WORK/receipts.txt" >"$WORK/diff.txt" ||
    die "accepted updates and receipts differ (< coordinator, > clients): $(cat "$WORK/diff.txt")"
# Restarted once more on the finished state, the coordinator reports the
# same counts.
FAULTS=0
launch_server
k=0
until grep -q "listening on" "$WORK/server.$S_N.out" 2>/dev/null; do
    alive "$SPID" || die "the final restart failed: $(tail -n 3 "$WORK/server.$S_N.err")"
    [ "$k" -lt 300 ] || die "the final restart is not listening after 30 s"
    sleep 0.1
    k=$((k + 1))
done
[ "$(metric strata_updates_accepted_total)" = "$TOTAL" ] ||
    die "after a restart strata_updates_accepted_total is $(metric strata_updates_accepted_total), expected $TOTAL"
[ "$(metric strata_rounds_completed_total)" = $ROUNDS ] ||
    die "after a restart strata_rounds_completed_total is $(metric strata_rounds_completed_total), expected $ROUNDS"
kill -TERM "$SPID"
reap "$SPID"

RESENT=$(cat "$WORK"/c*.log | grep -c "re-sending the staged update" || true)
HELD=$(cat "$WORK"/c*.log | grep -c "(already held)" || true)
RETRIES=$(grep -c "retrying" "$WORK/c$NSI.log" || true)
echo "test_faults: seed $SEED; run ${T_RUN} s; coordinator kills $KILLS ($EARLY_KILLS while starting," \
    "$BIND_RETRIES bind retries); client kills $CLIENT_KILLS ($STAGED_KILLS with a staged upload," \
    "$NS_INFLIGHT of the namespace client's $NS_K in flight); link cuts $CUTS ($((CUT_MS / 1000)) s down);" \
    "rounds $ROUNDS; receipts $TOTAL = accepted $ACCEPTED; staged uploads re-sent $RESENT" \
    "($HELD already held); namespace client retries $RETRIES; tbf $TBF"
echo "PASS test_faults ($((SECONDS - T_START)) s)"
