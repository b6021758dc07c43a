#!/usr/bin/env bash
# Durability under load: one coordinator (mlp, uniform policy at 1%, 200
# clients, all of them in every round) driven by bench_load --persist (200
# simulated clients, one keep-alive connection each, every upload retried
# through outages) is killed (SIGKILL) at random moments, at least 10 times,
# and restarted each time with the same state directory (with PostgreSQL, a new, empty one: see test_kill_load_postgres.sh) and port. Between
# two kills the bench must record new acknowledgements. Then, with the bench
# and the coordinator stopped, the store (STATE/state.db, read with sqlite3,
# or the PostgreSQL database of STRATA_TEST_DATABASE, read with psql: see
# test_kill_load_postgres.sh) must hold:
#  (a) every acknowledged upload (bench_load --acks: round, client, receipt,
#      duplicate) as exactly one row of updates, with that receipt;
#  (b) no (round, client_id) twice in updates;
#  (c) nothing but updates that were acknowledged or can be resent: restarted
#      once more, the coordinator answers a re-upload of every stored payload
#      (its bytes from the store, the client's token from bench_load
#      --tokens) with 200, "duplicate":true and the stored receipt.
# The kill schedule comes from $RANDOM with a printed seed:
# STRATA_KILL_SEED=N replays it (process timings still vary).
# STRATA_SERVER_BIN overrides the coordinator binary (default
# BUILD/strata-server).
# With STRATA_KILL_TARGET=database (and the store in PostgreSQL: see
# test_db_restart_postgres.sh) the coordinator runs on and the database
# server is what goes down: an immediate shutdown (every session cut, as in
# a crash of the database server; crash recovery at the next start), down
# for a moment, then started again. The coordinator must reconnect and go
# on without a restart of its own; the checks are the same. A second
# coordinator follows on the same store meanwhile (it serves, and bids for
# the lead): a restart of the database ends the leader's session too, yet
# the follower must not take the lead (the leader comes back within its
# lease), so it never leads and the store's epoch stays 1.

# A watchdog: the whole test stops within ~120 s whatever happens (every wait
# below is bounded too; this is the last resort).
if [ -z "${STRATA_KILL_WATCHDOG:-}" ] && command -v timeout >/dev/null; then
    export STRATA_KILL_WATCHDOG=1
    exec timeout -k 10 120 bash "$0" "$@"
fi
. "$(dirname "$0")/lib.sh"
TARGET=${STRATA_KILL_TARGET:-coordinator}
case $TARGET in
coordinator) ;;
database)
    [ -n "${STRATA_TEST_DATABASE:-}" ] && [ -n "${STRATA_PG_DATA:-}" ] ||
        fail "STRATA_KILL_TARGET=database needs the cluster of tests/unit/with_postgres.sh"
    . "$(dirname "$0")/../unit/with_postgres.sh"
    ;;
*) fail "STRATA_KILL_TARGET: coordinator or database, not $TARGET" ;;
esac
SERVER=${STRATA_SERVER_BIN:-$BUILD/strata-server}
BENCH="$BUILD/bench_load"
for x in "$SERVER" "$BENCH"; do [ -x "$x" ] || fail "no $x"; done
for x in curl sqlite3 psql python3; do command -v "$x" >/dev/null || fail "$x is required"; done
export OMP_WAIT_POLICY=passive
T_START=$SECONDS
DEADLINE=$((SECONDS + 110)) # every wait_until stops here
NC=200
ROUNDS=1000 # more than the test lasts: the bench is stopped after the kills
MIN_KILLS=10
SECRET="kill-load-s3cret-$$"
STATE="$WORK/state"
C=(curl -sS --max-time 5)
ACKS="$WORK/acks.txt"
TOKENS="$WORK/tokens.txt"

SEED=${STRATA_KILL_SEED:-$(((${EPOCHREALTIME/[.,]/} ^ $$) % 32768))}
RANDOM=$SEED
echo "test_kill_load: seed $SEED (STRATA_KILL_SEED=$SEED replays this kill schedule)"

S_N=0
SPID=""
BPID=""
PORT=0
URL=""
dump() {
    local k f
    for ((k = S_N - 1; k <= S_N; k++)); do
        for f in "$WORK/server.$k.out" "$WORK/server.$k.err"; do
            [ -f "$f" ] && { echo "==== $f" && tail -n 40 "$f"; } >&2
        done
    done
    [ -f "$WORK/bench.err" ] && { echo "==== bench.err" && tail -n 20 "$WORK/bench.err"; } >&2
    [ -f "$WORK/standby.err" ] && { echo "==== standby.err" && tail -n 20 "$WORK/standby.err"; } >&2
    return 0
}
die() {
    trap - TERM INT
    dump
    echo "FAIL: $* (seed $SEED)" >&2
    exit 1
}
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'die "stopped by a signal (the watchdog?)"' TERM INT

rnd() { R=$(($1 + RANDOM % ($2 - $1 + 1))); } # never in a subshell: that reseeds
sleep_ms() { sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"; }
acks() { ACKED=0; [ -f "$ACKS" ] && ACKED=$(wc -l <"$ACKS"); }
event() { echo "  t=$((SECONDS - T_START))s $*"; }

# launch_server: starts the coordinator on PORT (0 the first time, then the
# port it bound) and waits until it listens; retries while the port is still
# held after a kill.
launch_server() {
    local try k u sdir
    for ((try = 0; try < 40; try++)); do
        S_N=$((S_N + 1))
        # With the store in PostgreSQL the state directory is a cache: every
        # start gets a new, empty one and must resume from the database.
        sdir=$STATE
        [ -z "${STRATA_TEST_DATABASE:-}" ] || sdir="$STATE.$S_N"
        "$SERVER" --state-dir "$sdir" ${STORE_ARGS[@]+"${STORE_ARGS[@]}"} --model mlp --data "$DATA" --port "$PORT" \
            --rounds $ROUNDS --min-clients $NC --policy uniform --density 0.01 \
            --enrolment-secret "$SECRET" --upload-rate 1000000 --threads 1 \
            >"$WORK/server.$S_N.out" 2>"$WORK/server.$S_N.err" &
        SPID=$!
        PIDS+=("$SPID")
        for ((k = 0; k < 400; k++)); do
            u=$(sed -n 's/^strata-server: listening on //p' "$WORK/server.$S_N.out" 2>/dev/null)
            if [ -n "$u" ]; then
                [ "$PORT" != 0 ] || { PORT=${u##*:} && URL=$u; }
                [ "$u" = "$URL" ] || die "coordinator start $S_N listens on $u, not $URL"
                return 0
            fi
            if ! alive "$SPID"; then
                reap "$SPID"
                grep -q "cannot listen" "$WORK/server.$S_N.err" || die "coordinator start $S_N failed"
                sleep 0.25
                continue 2
            fi
            sleep 0.05
        done
        die "coordinator start $S_N: not listening after 20 s"
    done
    die "port $PORT still held after 40 tries"
}

stop_server() { # SIGTERM; the exit status must be 0
    kill -TERM "$SPID"
    local k
    for ((k = 0; k < 200; k++)); do
        alive "$SPID" || break
        sleep 0.1
    done
    alive "$SPID" && die "the coordinator did not stop on SIGTERM"
    reap "$SPID"
    [ "$REAPED_RC" = 0 ] || die "coordinator exit status $REAPED_RC after SIGTERM"
}

# down_database MS: the database server shut down at once (its sessions
# cut), down for MS ms, started again; the coordinator must stay up. Sets
# ACKED while the database is down, so that only acknowledgements after the
# outage count as new.
down_database() {
    strata_pg_as_owner "$STRATA_PG_BIN/pg_ctl" -D "$STRATA_PG_DATA" -m immediate -w -t 30 \
        stop >/dev/null || die "pg_ctl stop failed"
    acks # every acknowledgement of a commit before the shutdown is in by now
    sleep_ms "$1"
    strata_pg_as_owner "$STRATA_PG_BIN/pg_ctl" -D "$STRATA_PG_DATA" -l "$STRATA_PG_DIR/postgres.log" \
        -w -t 30 start >/dev/null || die "pg_ctl start failed"
    alive "$SPID" || die "the coordinator exited while the database was down"
}

bench_alive() { alive "$BPID" || die "bench_load exited during the run"; }
acks_grew() {
    bench_alive
    acks
    [ "$ACKED" -gt "$ACKS_AT_KILL" ]
}

# ---- the run: the coordinator, the bench, the kills ----------------------------
launch_server
STANDBY_PID=""
if [ "$TARGET" = database ]; then
    "$SERVER" --state-dir "$STATE.standby" "${STORE_ARGS[@]}" --coordinator-name standby \
        --model mlp --data "$DATA" --port 0 --rounds $ROUNDS --min-clients $NC --policy uniform \
        --density 0.01 --enrolment-secret "$SECRET" --upload-rate 1000000 --threads 1 \
        >"$WORK/standby.out" 2>"$WORK/standby.err" &
    STANDBY_PID=$!
    PIDS+=("$STANDBY_PID")
    standing_by() { alive "$STANDBY_PID" && grep -q "following: .* leads the store" "$WORK/standby.err"; }
    wait_until 30 "the second coordinator following" standing_by
fi
# The follower never led, and the epoch is still 1.
standby_never_led() {
    [ -n "$STANDBY_PID" ] || return 0
    alive "$STANDBY_PID" || die "the following coordinator exited: $(tail -n 5 "$WORK/standby.err")"
    ! grep -q "leads the store now\|leading the store as" "$WORK/standby.err" ||
        die "the follower took the lead after a restart of the database: $(grep -i "lead" "$WORK/standby.err" | tail -n 3)"
    local epoch
    epoch=$(store_query "$STATE" "SELECT epoch FROM leader")
    [ "$epoch" = 1 ] || die "the store's epoch is $epoch, not 1: the lead changed hands"
}
"$BENCH" --server "$URL" --clients $NC --rounds $ROUNDS --secret "$SECRET" --persist \
    --acks "$ACKS" --tokens "$TOKENS" --timeout 100 --json >"$WORK/bench.out" 2>"$WORK/bench.err" &
BPID=$!
PIDS+=("$BPID")
# No kill before every client is registered: registrations are not retried,
# and an orphan registration would be selected for rounds it never uploads in.
registered() { bench_alive && grep -q "clients registered" "$WORK/bench.err"; }
wait_until 30 "$NC clients registered" registered
[ "$(wc -l <"$TOKENS")" = $NC ] || die "$(wc -l <"$TOKENS") tokens for $NC clients"
event "$NC clients registered; kills start"

KILLS=0
rnd "$MIN_KILLS" $((MIN_KILLS + 2))
WANT=$R
ACKS_AT_KILL=0
GAPS=() # acknowledgements between consecutive kills
while [ "$KILLS" -lt "$WANT" ]; do
    rnd 200 2500
    sleep_ms "$R"
    # The restarted coordinator must acknowledge new uploads before the next kill.
    wait_until 25 "acknowledgements after kill $KILLS" acks_grew
    before=$ACKS_AT_KILL
    KILLS=$((KILLS + 1))
    rnd 50 800
    if [ "$TARGET" = database ]; then
        down_database "$R"
        event "database down $KILLS: $ACKED acknowledgements so far ($((ACKED - before)) since the last outage), down for ${R} ms"
        standby_never_led
    else
        kill -KILL "$SPID" 2>/dev/null || true
        reap "$SPID"
        sleep_ms "$R" # down: the bench's retries fail meanwhile
        acks          # every answer of the killed coordinator is in by now
        event "kill $KILLS (pid $SPID): $ACKED acknowledgements so far ($((ACKED - before)) since the last kill), down for ${R} ms"
    fi
    ACKS_AT_KILL=$ACKED
    GAPS+=($((ACKED - before)))
    [ "$TARGET" = database ] || launch_server
done
wait_until 25 "acknowledgements after the last kill" acks_grew
# A lead lost to the last restart would show by now (a standby takes over
# within a quarter of a second of finding the leader's session gone).
if [ -n "$STANDBY_PID" ]; then
    sleep 3
    standby_never_led
    kill -TERM "$STANDBY_PID"
    for ((k = 0; k < 100; k++)); do
        alive "$STANDBY_PID" || break
        sleep 0.1
    done
    alive "$STANDBY_PID" && die "the standby did not stop on SIGTERM"
    reap "$STANDBY_PID"
    [ "$REAPED_RC" = 0 ] || die "the standby's exit status after SIGTERM is $REAPED_RC, not 0"
fi
kill -TERM "$BPID"
for ((k = 0; k < 150; k++)); do
    alive "$BPID" || break
    sleep 0.1
done
alive "$BPID" && die "bench_load did not stop on SIGTERM"
reap "$BPID"
BRC=$REAPED_RC
SUMMARY=$(tail -n 1 "$WORK/bench.out")
grep '^clients ' "$WORK/bench.out" || true
[ "$BRC" = 0 ] || die "bench_load exit status $BRC"
[ "${SUMMARY:0:1}" = "{" ] || die "no JSON summary from bench_load"
[ "$(json_field "$SUMMARY" errors)" = 0 ] || die "bench_load counted errors: $SUMMARY"
[ "$(json_field "$SUMMARY" interrupted)" = true ] || die "bench_load was not interrupted: $SUMMARY"
stop_server
T_RUN=$((SECONDS - T_START))

# ---- checks ----------------------------------------------------------------------
[ "$KILLS" -ge "$MIN_KILLS" ] || die "only $KILLS kills (at least $MIN_KILLS wanted)"
for ((k = 1; k < ${#GAPS[@]}; k++)); do
    [ "${GAPS[k]}" -gt 0 ] || die "no acknowledgement between kills $k and $((k + 1))"
done
acks
TOTAL_ACKS=$ACKED
[ "$TOTAL_ACKS" -gt 0 ] || die "no acknowledgement at all"

q() { store_query "$STATE" "$1"; }
q "SELECT round, client_id, receipt FROM updates ORDER BY round, client_id" >"$WORK/stored.txt" ||
    die "cannot read the store"
STORED=$(wc -l <"$WORK/stored.txt")
# (b) no (round, client_id) twice
twice=$(q "SELECT round, client_id, count(*) FROM updates GROUP BY round, client_id HAVING count(*) > 1")
[ -z "$twice" ] || die "(round, client_id) stored more than once: $(head -n 5 <<<"$twice")"
# (a) every acknowledgement is stored once, with its receipt
bad=$(awk 'NF != 4 || ($4 != 0 && $4 != 1) { print "line " NR ": " $0; exit }' "$ACKS")
[ -z "$bad" ] || die "a malformed acknowledgement, $bad"
cut -d' ' -f1-3 "$ACKS" | sort -k1,1n -k2,2n >"$WORK/acked.txt"
dups=$(cut -d' ' -f1,2 "$WORK/acked.txt" | uniq -d | head -n 5)
[ -z "$dups" ] || die "(round, client) acknowledged twice: $dups"
missing=$(comm -23 <(sort "$WORK/acked.txt") <(sort "$WORK/stored.txt") | head -n 5)
[ -z "$missing" ] || die "acknowledged but not stored with that receipt (round client receipt): $missing"
DUP_ACKS=$(awk '$4 == 1' "$ACKS" | wc -l)
UNACKED=$((STORED - TOTAL_ACKS))

# (c) every stored update can be resent: the same bytes with the client's
# token get the stored receipt back, as a duplicate.

mkdir -p "$WORK/resend"
stored_payloads "$STATE" "$WORK/resend" || die "cannot extract the stored payloads"
# One curl process for every re-upload: a config entry per stored update.
awk -v dir="$WORK/resend" -v url="$URL" 'FNR == NR { tok[$1] = $2; next }
    { f = dir "/" $1 "-" $2
      if (n++) print "next"
      printf "url = \"%s/v1/rounds/%s/updates\"\nheader = \"Authorization: Bearer %s\"\n", url, $1, tok[$2]
      printf "header = \"Content-Type: application/octet-stream\"\ndata-binary = \"@%s.bin\"\n", f
      printf "output = \"%s.json\"\nwrite-out = \"%%{http_code} %s %s\\n\"\n", f, $1, $2 }' \
    "$TOKENS" "$WORK/stored.txt" >"$WORK/resend.cfg"
empty=$(find "$WORK/resend" -name '*.bin' -empty | head -n 3)
[ -z "$empty" ] || die "empty stored payloads: $empty"
[ "$(find "$WORK/resend" -name '*.bin' | wc -l)" = "$STORED" ] || die "not every stored payload was extracted"
launch_server
ACCEPTED=$(metric strata_updates_accepted_total)
timeout 60 curl -sS --parallel --parallel-max 8 -K "$WORK/resend.cfg" >"$WORK/resend.codes" \
    2>"$WORK/resend.err" || die "re-uploads: curl failed: $(tail -n 3 "$WORK/resend.err")"
bad=$(awk '$1 != 200' "$WORK/resend.codes" | head -n 5)
[ -z "$bad" ] || die "re-uploads not answered 200 (status round client): $bad"
[ "$(wc -l <"$WORK/resend.codes")" = "$STORED" ] || die "$(wc -l <"$WORK/resend.codes") answers to $STORED re-uploads"
bad=$(awk -v dir="$WORK/resend" '{
        f = dir "/" $1 "-" $2 ".json"; body = ""
        while ((getline line < f) > 0) body = body line
        close(f)
        if (body !~ /"duplicate":true/ || index(body, "\"receipt\":\"" $3 "\"") == 0) {
            print $1, $2, "stored " $3 ", answered " body; if (++n == 5) exit }
    }' "$WORK/stored.txt")
[ -z "$bad" ] || die "a re-upload did not get the stored receipt as a duplicate: $bad"
[ "$(metric strata_updates_accepted_total)" = "$ACCEPTED" ] || die "re-uploads were counted as new"
stop_server

echo "test_kill_load: seed $SEED; run ${T_RUN} s; $KILLS $TARGET kills (acknowledgements between" \
    "kills: ${GAPS[*]}); $TOTAL_ACKS acknowledged ($DUP_ACKS as duplicates), $STORED stored" \
    "($UNACKED stored without an acknowledgement), every stored update resent as a duplicate"
echo "PASS test_kill_load ($((SECONDS - T_START)) s)"
