#!/usr/bin/env bash
# Moving a federation from SQLite to PostgreSQL (strata-server migrate), in
# a throw-away PostgreSQL cluster (tests/unit/with_postgres.sh):
#  1. a coordinator on SQLite runs 2 of 3 rounds with 16 clients
#     (bench_load), then is stopped with round 2 open;
#  2. migrate with a state directory that has no store is refused;
#  3. migrate copies the store: the clients (ids, token hashes), rounds,
#     updates (receipts, SHA-256, payload bytes) and counters in the
#     database equal those of state.db, row for row;
#  4. a second migrate into the now non-empty database is refused and
#     changes nothing;
#  5. the coordinator restarted with --database answers GET /v1/rounds and
#     GET /v1/rounds/R as before the move (the open round's age aside),
#     and a client's re-upload
#     of its stored round-1 payload with its old token is answered as a
#     duplicate with the stored receipt.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/../unit/with_postgres.sh"
SERVER=${STRATA_SERVER_BIN:-$BUILD/strata-server}
BENCH="$BUILD/bench_load"
for x in "$SERVER" "$BENCH"; do [ -x "$x" ] || fail "no $x"; done
for x in curl sqlite3 psql python3; do command -v "$x" >/dev/null || fail "$x is required"; done
trap 'stop_all; strata_pg_stop; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
export OMP_WAIT_POLICY=passive
NC=16
SECRET="migrate-s3cret-$$"
STATE="$WORK/state"
C=(curl -sS --max-time 10)

strata_pg_start || fail "cannot start PostgreSQL"
DB=$STRATA_TEST_PG_URL

start_server() { # start_server LOG [OPTIONS...]: sets SPID and URL
    local log=$1
    shift
    "$SERVER" --state-dir "$STATE" --model mlp --data "$DATA" --port 0 --rounds 3 \
        --min-clients $NC --policy uniform --density 0.01 --enrolment-secret "$SECRET" \
        --threads 1 "$@" >"$WORK/$log.out" 2>"$WORK/$log.err" &
    SPID=$!
    PIDS+=("$SPID")
    wait_listening "$SPID" "$WORK/$log.out" "$WORK/$log.err"
}
round_state() { [ "$(json_field "$(get "/v1/rounds/$1")" state)" = "$2" ]; }
round_closed() { round_state "$1" closed; }

# 1. Two rounds on SQLite.
start_server sqlite
timeout 60 "$BENCH" --server "$URL" --clients $NC --rounds 2 --secret "$SECRET" \
    --tokens "$WORK/tokens.txt" --timeout 50 --json >"$WORK/bench.out" 2>"$WORK/bench.err" ||
    fail "bench_load: $(tail -n 5 "$WORK/bench.err")"
wait_until 60 "round 1 closed" round_closed 1
wait_until 30 "round 2 open" round_state 2 open
for r in "" /0 /1 /2; do get "/v1/rounds$r" >"$WORK/before$(tr -d / <<<"$r").json"; done
kill -TERM "$SPID"
reap "$SPID"
[ "$REAPED_RC" = 0 ] || fail "the SQLite coordinator exited with $REAPED_RC"

# 2. No store to migrate.
set +e
"$SERVER" migrate --state-dir "$WORK/nothing" --database "$DB" >"$WORK/m0.out" 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || fail "migrate without a store: exit $rc (1 expected): $(cat "$WORK/m0.out")"
grep -q "no SQLite store to migrate" "$WORK/m0.out" || fail "migrate without a store: $(cat "$WORK/m0.out")"

# 3. The move, row for row.
"$SERVER" migrate --state-dir "$STATE" --database "$DB" >"$WORK/m1.out" 2>&1 ||
    fail "migrate: $(cat "$WORK/m1.out")"
grep -q "migrated .*: $NC clients, 3 rounds, $((2 * NC)) updates" "$WORK/m1.out" ||
    fail "migrate's report: $(cat "$WORK/m1.out")"
lite() { sqlite3 -readonly -batch -noheader -separator ' ' "$STATE/state.db" "$1"; }
pg() { psql "$DB" -X -A -t -q -F ' ' -v ON_ERROR_STOP=1 -c "$1"; }
same() { # same WHAT SQLITE_SQL PG_SQL
    lite "$2" >"$WORK/lite.txt" || fail "sqlite3: $2"
    pg "$3" >"$WORK/pg.txt" || fail "psql: $3"
    [ -s "$WORK/lite.txt" ] || fail "$1: nothing in state.db"
    cmp -s "$WORK/lite.txt" "$WORK/pg.txt" ||
        fail "$1 differ: $(diff "$WORK/lite.txt" "$WORK/pg.txt" | head -n 5)"
}
same clients "SELECT id, hex(token_hash), name, created_ms, last_seen_ms FROM clients ORDER BY id" \
    "SELECT id, upper(encode(token_hash, 'hex')), convert_from(name, 'UTF8'), created_ms,
        last_seen_ms FROM clients ORDER BY id"
same rounds "SELECT round, model_version, state, opened_ms, deadline_ms, closed_ms,
        length(task), length(summary) FROM rounds ORDER BY round" \
    "SELECT round, model_version, state, opened_ms, deadline_ms, closed_ms, length(task),
        length(summary) FROM rounds ORDER BY round"
same updates "SELECT u.round, u.client_id, u.receipt, hex(u.sha256), u.bytes, u.samples,
        1 FROM updates u JOIN payloads p ON p.seq = u.seq ORDER BY u.seq" \
    "SELECT u.round, u.client_id, u.receipt, upper(encode(u.sha256, 'hex')), u.bytes, u.samples,
        1 FROM updates u JOIN payloads p ON p.seq = u.seq ORDER BY u.seq"
same payloads "SELECT hex(body) FROM payloads ORDER BY seq" \
    "SELECT upper(encode(body, 'hex')) FROM payloads ORDER BY seq"
same counters "SELECT name, value FROM counters ORDER BY name" \
    "SELECT name, value FROM counters ORDER BY name"

# 4. Not twice.
set +e
"$SERVER" migrate --state-dir "$STATE" --database "$DB" >"$WORK/m2.out" 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || fail "a second migrate: exit $rc (1 expected): $(cat "$WORK/m2.out")"
grep -q "not empty" "$WORK/m2.out" || fail "a second migrate: $(cat "$WORK/m2.out")"
[ "$(pg "SELECT count(*) FROM updates")" = $((2 * NC)) ] || fail "the second migrate changed the database"

# 5. The run continues on PostgreSQL.
start_server postgres --database "$DB"
grep -q "(postgresql store" "$WORK/postgres.err" "$WORK/postgres.out" ||
    fail "the coordinator does not say it uses PostgreSQL: $(head -n 5 "$WORK/postgres.err")"
# The open round's duration_ms is its age, so it is left out of the
# comparison; everything else must be equal.
norm() {
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for r in d.get("rounds", [d]):
    if r.get("state") == "open":
        r.pop("duration_ms", None)
print(json.dumps(d, sort_keys=True))' "$1"
}
for r in "" /0 /1 /2; do
    f="$WORK/after$(tr -d / <<<"$r").json"
    get "/v1/rounds$r" >"$f"
    [ "$(norm "$WORK/before$(tr -d / <<<"$r").json")" = "$(norm "$f")" ] ||
        fail "GET /v1/rounds$r differs after the move: $(head -c 300 "$f")"
done
cmp -s "$WORK/before0.json" "$WORK/after0.json" || fail "GET /v1/rounds/0 is not byte for byte the same"
read -r cid token < <(head -n 1 "$WORK/tokens.txt")
stored_payloads "$STATE" "$WORK" 1 "$cid" # from state.db
[ -s "$WORK/1-$cid.bin" ] || fail "no stored round-1 payload of client $cid in state.db"
receipt=$(lite "SELECT receipt FROM updates WHERE round = 1 AND client_id = $cid")
body=$("${C[@]}" -H "Authorization: Bearer $token" -H "Content-Type: application/octet-stream" \
    --data-binary "@$WORK/1-$cid.bin" "$URL/v1/rounds/1/updates")
grep -q '"duplicate":true' <<<"$body" && grep -q "\"receipt\":\"$receipt\"" <<<"$body" ||
    fail "re-upload after the move: $body (receipt $receipt expected)"
stop_all
echo "PASS test_migrate_postgres: $NC clients, 3 rounds, $((2 * NC)) updates moved; the run" \
    "answers as before on PostgreSQL"
