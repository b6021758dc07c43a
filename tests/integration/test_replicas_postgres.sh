#!/usr/bin/env bash
# Three coordinators on one PostgreSQL store, all serving, behind HAProxy,
# with 10 real clients (strata-client, mlp on Fashion-MNIST, compressed
# uplink) over 20 rounds, and every kind of replica loss. In a
# throw-away PostgreSQL cluster (tests/unit/with_postgres.sh): coordinators
# A, B and C (--database, each its own state directory, a 2 s lease); the
# first to start leads, the others follow (they serve registration, tasks,
# uploads and model downloads from the store). HAProxy sends each
# client connection to any coordinator whose GET /v1/health answers 200
# (round robin). Then, while the clients train:
#  1. the leader is killed (SIGKILL) during an upload window (one client
#     held back, so that the round is open with the others' updates
#     acknowledged): a follower takes over as soon as the leader's session
#     ends, and the held-back client's update completes the round; the
#     killed one comes back as a follower;
#  2. the leader is killed during a round close (once it sealed the round
#     in the store, before the close is recorded): the new leader closes
#     that round, once;
#  3. the leader is stopped (SIGSTOP) for longer than its lease: a follower
#     takes over when the lease runs out; continued (SIGCONT), the old
#     leader finds itself fenced and stops, writing nothing; it comes back;
#  4. a follower is killed while clients upload through it, and comes back.
# The run must complete (every client exits 0, the federation finished);
# every update a client was acknowledged (its log's receipt) is stored once;
# every closed round's summary counts exactly its stored updates; every
# new model equals the previous one plus the mean of that round's stored
# updates weighted by their samples (agg_check, from the store's own
# copies of the checkpoints and payloads); no round was closed twice (each
# round's progress line appears once over all logs); /metrics gives each
# coordinator's role (and a follower's database latency). The test prints
# the failover times it measured. KEEP_WORK=1 keeps its work directory.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../unit/with_postgres.sh"
SERVER=${STRATA_SERVER_BIN:-$BUILD/strata-server}
CLIENT="$BUILD/strata-client"
CHECK="$BUILD/agg_check"
for x in "$SERVER" "$CLIENT" "$CHECK"; do [ -x "$x" ] || fail "no $x"; done
for x in curl psql haproxy python3; do
    command -v "$x" >/dev/null || fail "$x is required (scripts/setup.sh installs it)"
done
dump() {
    local f
    for f in "$WORK"/*.err "$WORK"/*.log; do
        [ -f "$f" ] && { echo "==== $f" && tail -n 15 "$f"; } >&2
    done
    return 0
}
die() {
    dump
    fail "$*"
}
trap 'stop_all; strata_pg_stop; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
export OMP_WAIT_POLICY=passive
NC=10
ROUNDS=20
SECRET="replicas-s3cret-$$"
LEASE=2
C=(curl -sS --max-time 5)
T_START=$SECONDS

strata_pg_start || fail "cannot start PostgreSQL"
DB=$STRATA_TEST_PG_URL
pg() { psql "$DB" -X -A -t -q -F ' ' -v ON_ERROR_STOP=1 -c "$1"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
declare -A PORT PID RUN
for n in A B C; do PORT[$n]=$(free_port); RUN[$n]=0; done
PF=$(free_port)

# start NAME: coordinator NAME (its next log: NAME<k>.out/.err).
start() {
    RUN[$1]=$((RUN[$1] + 1))
    local log="$WORK/$1${RUN[$1]}"
    "$SERVER" --database "$DB" --state-dir "$WORK/state-$1" --coordinator-name "$1" \
        --lease $LEASE --model mlp --data "$DATA" --port "${PORT[$1]}" --rounds $ROUNDS \
        --min-clients $NC --policy uniform --density 0.05 \
        --max-steps 60 --eval-samples 10000 --round-deadline 120 --enrolment-secret "$SECRET" \
        --threads 1 >"$log.out" 2>"$log.err" &
    PID[$1]=$!
    PIDS+=("${PID[$1]}")
}
last_err() { echo "$WORK/$1${RUN[$1]}.err"; }
logged() { grep -q "$2" "$(last_err "$1")" 2>/dev/null; }
leader() { pg "SELECT holder FROM leader" 2>/dev/null; }
leader_is() { [ "$(leader)" = "$1" ]; }
leader_not() { local l; l=$(leader) && [ -n "$l" ] && [ "$l" != "$1" ] && alive "${PID[$l]}"; }
healthy() { "${C[@]}" "http://127.0.0.1:${PORT[$1]}/v1/health" 2>/dev/null | grep -q '"ready":true'; }
now_ms() { echo $((${EPOCHREALTIME/[.,]/} / 1000)); }
open_round() { pg "SELECT round FROM rounds WHERE state = 0 AND closed_ms = 0"; }
uploads_in_open() { pg "SELECT count(*) FROM updates u JOIN rounds r ON r.round = u.round
                        WHERE r.state = 0 AND r.closed_ms = 0"; }
closed() { pg "SELECT count(*) FROM rounds WHERE state = 1"; }
closed_at_least() { [ "$(closed)" -ge "$1" ]; }
upload_window() { [ -n "$(open_round)" ] && [ "$(uploads_in_open)" -ge 1 ]; }

# The coordinators: A leads (the first), B and C follow and serve.
start A
wait_until 60 "A leading" logged A "leading the store as A"
wait_until 30 "A listening" grep -q "listening on" "$WORK/A1.out"
start B
start C
for n in B C; do wait_until 60 "$n following" logged "$n" "following: A leads"; done
for n in A B C; do wait_until 30 "$n ready" healthy "$n"; done
json_field "$("${C[@]}" "http://127.0.0.1:${PORT[B]}/v1/health")" leader | grep -qx false ||
    die "B's health does not say it follows"
haproxy_coordinators "$WORK/haproxy.log" "$PF" "${PORT[A]}" "${PORT[B]}" "${PORT[C]}"

CPIDS=()
for ((i = 0; i < NC; i++)); do
    "$CLIENT" --server "http://127.0.0.1:$PF" --state-dir "$WORK/client$i" --data "$DATA" \
        --partition dirichlet:1 --num-clients $NC --client-index $i --threads 1 --poll-wait 5 \
        --enrolment-secret "$SECRET" >"$WORK/client$i.log" 2>&1 &
    CPIDS+=($!)
    PIDS+=($!)
done
wait_until 120 "round 0 closed" closed_at_least 1
# Every coordinator served models to clients (HAProxy spreads their
# connections).
for n in A B C; do
    r=$("${C[@]}" "http://127.0.0.1:${PORT[$n]}/metrics" | sed -n 's/^strata_downlink_bytes_total //p')
    [ -n "$r" ] && [ "${r%.*}" -gt 0 ] || die "$n served no model: downlink bytes '$r'"
done
# /metrics says each one's role; a follower's, its database latency.
m() { "${C[@]}" "http://127.0.0.1:${PORT[$1]}/metrics" | sed -n "s/^$2 //p"; }
[ "$(m A strata_leader)" = 1 ] && [ -n "$(m A strata_lease_epoch)" ] || die "A's /metrics: not the leader"
for n in B C; do
    [ "$(m $n strata_leader)" = 0 ] || die "$n's /metrics: strata_leader '$(m $n strata_leader)'"
    awk -v x="$(m $n strata_store_read_seconds)" 'BEGIN { exit !(x > 0 && x < 5) }' ||
        die "$n's strata_store_read_seconds is '$(m $n strata_store_read_seconds)'"
done

# failover NAME: waits for a leader other than NAME that serves as the
# leader (its engine opened again); FAILOVER_MS is the time since T0.
leads_and_serves() {
    local l
    leader_not "$1" && l=$(leader) &&
        "${C[@]}" "http://127.0.0.1:${PORT[$l]}/v1/health" 2>/dev/null | grep -q '"leader":true'
}
failover() {
    wait_until 60 "a leader other than $1, serving" leads_and_serves "$1"
    FAILOVER_MS=$(($(now_ms) - T0))
}

# 1. The leader killed during an upload window: the last client held back
# (stopped), so that the round is open with the others' updates
# acknowledged; it uploads once a new leader leads.
L=$(leader)
kill -STOP "${CPIDS[NC - 1]}"
held() { [ -n "$(open_round)" ] && [ "$(uploads_in_open)" -ge $((NC - 1)) ]; }
wait_until 120 "an upload window with $((NC - 1)) updates" held
T0=$(now_ms)
kill -KILL "${PID[$L]}"
reap "${PID[$L]}"
failover "$L"
F1=$FAILOVER_MS
kill -CONT "${CPIDS[NC - 1]}"
start "$L"
wait_until 60 "$L following again" logged "$L" "following:"

# 2. The leader killed during a round close: once it sealed the round.
L=$(leader)
sealed() { [ -n "$(pg "SELECT round FROM rounds WHERE state = 0 AND closed_ms <> 0")" ]; }
WAIT_POLL=0.02 wait_until 120 "a round sealed by $L" sealed
T0=$(now_ms)
kill -KILL "${PID[$L]}"
reap "${PID[$L]}"
SEALED=$(pg "SELECT round FROM rounds WHERE state = 0 AND closed_ms <> 0")
[ -n "$SEALED" ] && KILLED_IN_CLOSE=1 || KILLED_IN_CLOSE=0
failover "$L"
F2=$FAILOVER_MS
start "$L"
wait_until 60 "$L following again" logged "$L" "following:"

# 3. The leader stopped past its lease: fenced once continued.
L=$(leader)
T0=$(now_ms)
kill -STOP "${PID[$L]}"
failover "$L"
F3=$FAILOVER_MS
kill -CONT "${PID[$L]}"
wait_until 30 "$L stopping, fenced" exited "${PID[$L]}"
reap "${PID[$L]}"
grep -q "no longer leads the store" "$(last_err "$L")" || die "$L's log does not say it was fenced"
start "$L"
wait_until 60 "$L following again" logged "$L" "following:"

# 4. A follower killed while clients upload.
L=$(leader)
for n in A B C; do [ "$n" != "$L" ] && F=$n && break; done
WAIT_POLL=0.02 wait_until 120 "an upload window" upload_window
kill -KILL "${PID[$F]}"
reap "${PID[$F]}"
start "$F"
wait_until 60 "$F following again" logged "$F" "following:"

# The run completes.
for p in "${CPIDS[@]}"; do
    wait_until 400 "client $p finishing" exited "$p"
    reap "$p"
    [ "$REAPED_RC" -eq 0 ] || die "a client exited with $REAPED_RC"
done
[ "$(closed)" -eq $ROUNDS ] || die "$(closed) of $ROUNDS rounds closed"

# Every acknowledged update stored once, with its receipt.
cat "$WORK"/client*.log | sed -n 's/.*round \([0-9]*\): receipt \([0-9a-f]*\).*/\1 \2/p' |
    sort -u >"$WORK/acked.txt"
ACKED=$(wc -l <"$WORK/acked.txt")
[ "$ACKED" -ge $((ROUNDS * NC / 2)) ] || die "only $ACKED acknowledged updates"
pg "SELECT round, receipt FROM updates ORDER BY 1, 2" | sort >"$WORK/stored.txt"
missing=$(comm -23 "$WORK/acked.txt" "$WORK/stored.txt" | head -n 5)
[ -z "$missing" ] || die "acknowledged but not stored: $missing"
bad=$(pg "SELECT r.round, (r.summary::json->>'participants'), count(u.seq) FROM rounds r
          LEFT JOIN updates u ON u.round = r.round WHERE r.state = 1 GROUP BY r.round
          HAVING (r.summary::json->>'participants')::bigint <> count(u.seq)")
[ -z "$bad" ] || die "closed rounds whose summary does not count their stored updates: $bad"
dup=$(cat "$WORK"/[ABC]*.out | grep -oE '^round [0-9]+/' | sort | uniq -d)
[ -z "$dup" ] || die "rounds closed twice: $dup"

# Every new model: the previous one plus the weighted mean of the round's
# stored updates (plain server step, lr 1), from the store's copies of the
# checkpoints (the model clients get is the server's model x: no downlink
# compression here, whose x files are pruned).
file() { # file KIND VERSION OUT: a version's file as the store keeps it
    pg "SELECT encode(data, 'hex') FROM file_chunks WHERE kind = $1 AND version = $2
        ORDER BY chunk" | python3 -c 'import sys
open(sys.argv[1], "wb").write(b"".join(bytes.fromhex(l.strip()) for l in sys.stdin))' "$3"
    [ -s "$3" ]
}
model_x() { file 6 "$1" "$2"; }
mkdir -p "$WORK/check"
STRATA_TEST_DATABASE=$DB stored_payloads "$WORK/state-A" "$WORK/check"
CHECKED=0
while read -r r v; do
    model_x "$v" "$WORK/check/w0.safetensors" || die "no model $v in the store"
    model_x $((v + 1)) "$WORK/check/w1.safetensors" || die "no model $((v + 1)) in the store"
    ps=()
    for c in $(pg "SELECT client_id FROM updates WHERE round = $r ORDER BY seq"); do
        ps+=("$WORK/check/$r-$c.bin")
    done
    out=$("$CHECK" verify --w0 "$WORK/check/w0.safetensors" --w1 "$WORK/check/w1.safetensors" \
        --tol 1e-5 "${ps[@]}") || die "round $r: the model is not the mean of its updates: $out"
    CHECKED=$((CHECKED + 1))
done < <(pg "SELECT round, model_version FROM rounds WHERE state = 1
             AND (summary::json->>'failed') IS NULL ORDER BY round")
[ "$CHECKED" -eq $ROUNDS ] || die "only $CHECKED of $ROUNDS new models checked"
echo "PASS test_replicas_postgres: 3 coordinators, $NC clients, $ROUNDS rounds; failover after" \
    "a SIGKILL in an upload window ${F1} ms, in a round close ${F2} ms (killed after the seal:" \
    "$KILLED_IN_CLOSE), after a SIGSTOP ${F3} ms (lease ${LEASE} s); $ACKED acknowledged, all" \
    "stored once; $CHECKED models checked against their rounds' updates" \
    "($((SECONDS - T_START)) s)"
