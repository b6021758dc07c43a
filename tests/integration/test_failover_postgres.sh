#!/usr/bin/env bash
# A leader and a follower on one PostgreSQL store behind HAProxy, and the
# leader lost twice. In a throw-away PostgreSQL cluster
# (tests/unit/with_postgres.sh): coordinators A and B (--database, each its
# own state directory, a 2 s lease) and HAProxy in front, which sends
# requests to both while they answer GET /v1/health with 200 (the follower
# serves too). bench_load --persist runs 20 clients through HAProxy, retrying
# through every outage. Then:
#  1. A leads; B follows;
#  2. A is killed (SIGKILL) during an upload window: B takes over as soon
#     as A's database session ends, and the clients go on through B;
#  3. A is started again and follows;
#  4. B is stopped (SIGSTOP) for longer than its lease: A takes over when
#     the lease runs out, and the clients go on through A; A's /metrics
#     shows its lead (strata_lease_epoch as in GET /v1/health, renewed
#     within the lease, the renewal's duration);
#  5. B is continued (SIGCONT): it finds itself fenced (its epoch is not
#     the store's) and stops, writing nothing.
# Then the store must hold every acknowledged update exactly once with its
# receipt; every closed round's summary counts exactly its stored updates
# (each aggregated once); no round was closed by two coordinators (each
# round's progress line appears once over all their logs); and B's log says
# it was fenced. The test prints the two failover times it measured.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../unit/with_postgres.sh"
SERVER=${STRATA_SERVER_BIN:-$BUILD/strata-server}
BENCH="$BUILD/bench_load"
for x in "$SERVER" "$BENCH"; do [ -x "$x" ] || fail "no $x"; done
for x in curl psql haproxy python3; do
    command -v "$x" >/dev/null || fail "$x is required (scripts/setup.sh installs it)"
done
trap 'stop_all; strata_pg_stop; rm -rf "$WORK"' EXIT
export OMP_WAIT_POLICY=passive
NC=20
SECRET="failover-s3cret-$$"
LEASE=2
C=(curl -sS --max-time 5)
T_START=$SECONDS
DEADLINE=$((SECONDS + 240))

strata_pg_start || fail "cannot start PostgreSQL"
DB=$STRATA_TEST_PG_URL
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PA=$(free_port)
PB=$(free_port)
PF=$(free_port)

# start_coordinator NAME PORT LOG: sets CPID.
start_coordinator() {
    "$SERVER" --database "$DB" --state-dir "$WORK/state-$3" --coordinator-name "$1" --lease $LEASE \
        --model mlp --data "$DATA" --port "$2" --rounds 1000 --min-clients $NC --policy uniform \
        --density 0.01 --enrolment-secret "$SECRET" --upload-rate 1000000 --threads 1 \
        --round-deadline 600 >"$WORK/$3.out" 2>"$WORK/$3.err" &
    CPID=$!
    PIDS+=("$CPID")
}
logged() { grep -q "$2" "$WORK/$1.err" 2>/dev/null; }
acks() { ACKED=0 && [ ! -f "$WORK/acks.txt" ] || ACKED=$(wc -l <"$WORK/acks.txt"); }
acked_over() { acks && [ "$ACKED" -ge "$1" ]; }
now_ms() { echo $((${EPOCHREALTIME/[.,]/} / 1000)); }
leader_is() { "${C[@]}" "http://127.0.0.1:$PF/v1/health" 2>/dev/null | grep -q "\"holder\":\"$1\""; }

# 1. A leads, B stands by, HAProxy in front.
start_coordinator A "$PA" a1
A=$CPID
wait_until 60 "A listening" logged a1 "leading the store as A"
wait_until 30 "A's listening line" grep -q "listening on" "$WORK/a1.out"
start_coordinator B "$PB" b
B=$CPID
wait_until 30 "B following" logged b "following: A leads"
haproxy_coordinators "$WORK/haproxy.log" "$PF" "$PA" "$PB"
wait_until 30 "HAProxy routing to A" leader_is A

"$BENCH" --server "http://127.0.0.1:$PF" --clients $NC --rounds 100000 --secret "$SECRET" \
    --persist --acks "$WORK/acks.txt" --tokens "$WORK/tokens.txt" --timeout 200 \
    >"$WORK/bench.out" 2>"$WORK/bench.err" &
BPID=$!
PIDS+=("$BPID")
wait_until 60 "100 acknowledgements through A" acked_over 100

# 2. A killed: B takes over once A's session ends.
acks
before=$ACKED
t0=$(now_ms)
kill -KILL "$A"
reap "$A"
wait_until 30 "B leading" leader_is B
FAIL1=$(($(now_ms) - t0))
wait_until 60 "acknowledgements through B" acked_over $((before + 100))

# 3. A again, as a follower.
start_coordinator A "$PA" a2
A=$CPID
wait_until 30 "A following" logged a2 "following: B leads"

# 4. B paused past its lease: A takes over when it runs out.
acks
before=$ACKED
t0=$(now_ms)
kill -STOP "$B"
wait_until 60 "A leading" leader_is A
FAIL2=$(($(now_ms) - t0))
wait_until 60 "acknowledgements through A" acked_over $((before + 100))

# A's /metrics: its lead, with the epoch of GET /v1/health, renewed within
# the lease, and the renewal's duration once it renewed.
a_metric() { "${C[@]}" "http://127.0.0.1:$PA/metrics" | sed -n "s/^$1 //p"; }
a_renewed() { awk -v x="$(a_metric strata_store_renewal_seconds)" 'BEGIN { exit !(x > 0 && x < 5) }'; }
wait_until 10 "a renewal of A's lease in its /metrics" a_renewed
ep=$(json_field "$("${C[@]}" "http://127.0.0.1:$PA/v1/health")" epoch)
[ -n "$ep" ] && [ "$(a_metric strata_lease_epoch)" = "$ep" ] ||
    fail "A's strata_lease_epoch is '$(a_metric strata_lease_epoch)', its health says epoch '$ep'"
age=$(a_metric strata_lease_renewal_age_seconds)
awk -v a="$age" -v l="$LEASE" 'BEGIN { exit !(a >= 0 && a < l) }' ||
    fail "A's strata_lease_renewal_age_seconds is '$age' (lease $LEASE s)"
[ -n "$(a_metric strata_lease_renewal_failures_total)" ] || fail "no strata_lease_renewal_failures_total"

# 5. B continued: fenced, it stops.
kill -CONT "$B"
wait_until 30 "B stopping" exited "$B"
reap "$B"
grep -q "no longer leads the store" "$WORK/b.err" || fail "B's log does not say it was fenced: $(tail -n 5 "$WORK/b.err")"
wait_until 60 "acknowledgements after B stopped" acked_over $((ACKED + 50))
kill -INT "$BPID"
reap "$BPID"
kill -TERM "$A"
reap "$A"

# The store.
pg() { psql "$DB" -X -A -t -q -F ' ' -v ON_ERROR_STOP=1 -c "$1"; }
pg "SELECT round, client_id, receipt FROM updates ORDER BY round, client_id" >"$WORK/stored.txt"
cut -d' ' -f1-3 "$WORK/acks.txt" | sort -u >"$WORK/acked.txt"
missing=$(comm -23 "$WORK/acked.txt" <(sort "$WORK/stored.txt") | head -n 5)
[ -z "$missing" ] || fail "acknowledged but not stored with that receipt: $missing"
twice=$(pg "SELECT round, client_id FROM updates GROUP BY 1, 2 HAVING count(*) > 1")
[ -z "$twice" ] || fail "stored twice: $twice"
bad=$(pg "SELECT r.round, (r.summary::json->>'participants'), count(u.seq) FROM rounds r
          LEFT JOIN updates u ON u.round = r.round WHERE r.state = 1 GROUP BY r.round
          HAVING (r.summary::json->>'participants')::bigint <> count(u.seq)")
[ -z "$bad" ] || fail "closed rounds whose summary does not count their stored updates: $bad"
CLOSED=$(pg "SELECT count(*) FROM rounds WHERE state = 1")
[ "$CLOSED" -ge 3 ] || fail "only $CLOSED rounds closed"
dup=$(cat "$WORK"/a1.out "$WORK"/b.out "$WORK"/a2.out | grep -oE '^round [0-9]+/' | sort | uniq -d)
[ -z "$dup" ] || fail "rounds closed by two coordinators: $dup"
acks
echo "PASS test_failover_postgres: failover after a SIGKILL ${FAIL1} ms, after a SIGSTOP" \
    "${FAIL2} ms (lease ${LEASE} s); $ACKED acknowledged, all stored once; $CLOSED rounds" \
    "closed, each once, each counting its stored updates ($((SECONDS - T_START)) s)"
