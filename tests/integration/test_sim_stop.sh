#!/usr/bin/env bash
# strata-sim stopped by SIGINT after a few rounds: it stops its clients and
# its coordinator, writes the report of the finished rounds and exits 130.
# The same --out is then refused without --resume, and --resume continues
# the run to its end with a report of every round.
source "$(dirname "$0")/lib.sh"

SIM="$BUILD/strata-sim"
OUT="$WORK/sim"


# This run's processes: the coordinator and clients name $OUT on their
# command lines.
run_procs() { pgrep -f -- "$OUT/" 2>/dev/null | wc -l; }

"$SIM" --clients 4 --clients-per-round 2 --rounds 200 --model mlp --data "$DATA" --seed 5 \
    --out "$OUT" --json >"$WORK/out1.txt" 2>"$WORK/err1.txt" &
sim=$!
PIDS+=("$sim")
# Wait (at most 120 s) until two rounds have finished.
for _ in $(seq 1 600); do
    grep -q "round 1/200" "$WORK/err1.txt" 2>/dev/null && break
    kill -0 "$sim" 2>/dev/null || fail "strata-sim exited early: $(tail -n 5 "$WORK/err1.txt")"
    sleep 0.2
done
grep -q "round 1/200" "$WORK/err1.txt" || fail "no round finished in 120 s"
kill -INT "$sim"
for _ in $(seq 1 300); do
    kill -0 "$sim" 2>/dev/null || break
    sleep 0.2
done
kill -0 "$sim" 2>/dev/null && fail "strata-sim still runs 60 s after SIGINT"
reap "$sim"
[ "$REAPED_RC" = 130 ] || fail "strata-sim exited $REAPED_RC after SIGINT, expected 130"
grep -q -- "--resume" "$WORK/err1.txt" || fail "the interrupted run does not name --resume"
[ "$(run_procs)" = 0 ] || fail "processes of the run are left: $(pgrep -af -- "$OUT/")"
# The report covers the finished rounds, 0 .. K-1.
rows=$(($(wc -l <"$OUT/report.csv") - 1))
[ "$rows" -ge 2 ] || fail "the report holds $rows rounds, expected at least 2"
[ "$(awk -F, 'NR > 1 { if ($1 != NR - 2) bad = 1 } END { print bad + 0 }' "$OUT/report.csv")" = 0 ] ||
    fail "report rounds are not 0..$((rows - 1))"
[ "$(json_field "$(tail -n 1 "$WORK/out1.txt")" rounds)" = "$rows" ] ||
    fail "the JSON summary does not count the finished rounds"
cp "$OUT/report.csv" "$WORK/report1.csv"

# Without --resume the run is refused, and nothing changes.
set +e
"$SIM" --clients 4 --rounds 3 --data "$DATA" --out "$OUT" 2>"$WORK/err2.txt"
rc=$?
set -e
[ "$rc" = 2 ] || fail "a second run into the same --out exited $rc, expected 2"
grep -q -- "--resume" "$WORK/err2.txt" || fail "the refusal does not name --resume"
cmp -s "$OUT/report.csv" "$WORK/report1.csv" || fail "the refused run changed the report"
# A resumed run may not change the clients.
if "$SIM" --out "$OUT" --resume --clients 5 2>"$WORK/err3.txt"; then
    fail "--resume accepted another --clients"
fi
grep -q -- "--clients cannot change" "$WORK/err3.txt" || fail "no message for a changed --clients"

# --resume continues with the saved options, to a shorter end.
total=$((rows + 2))
timeout 300 "$SIM" --out "$OUT" --resume --rounds "$total" --json >"$WORK/out4.txt" \
    2>"$WORK/err4.txt" || { tail -n 20 "$WORK/err4.txt" "$OUT/server.log" >&2; fail "--resume failed"; }
[ "$(json_field "$(tail -n 1 "$WORK/out4.txt")" rounds)" = "$total" ] ||
    fail "the resumed run's summary does not count $total rounds"
[ "$(wc -l <"$OUT/report.csv")" -eq $((total + 1)) ] || fail "report.csv lacks rounds after --resume"
[ "$(awk -F, 'NR > 1 { if ($1 != NR - 2 || $2 != 2) bad = 1 } END { print bad + 0 }' "$OUT/report.csv")" = 0 ] ||
    fail "after --resume the rounds are not 0..$((total - 1)) with 2 updates each"
# The clients continued as themselves: 4 identities, no new registration.
[ "$(grep -h "registered as client" "$OUT"/clients/*.log | wc -l)" -eq 4 ] ||
    fail "clients registered again on --resume"
grep -q '"rounds": '"$total" "$OUT/run.json" || fail "run.json does not hold the new --rounds"
[ "$(run_procs)" = 0 ] || fail "processes of the run are left after --resume"
echo "PASS: interrupted and resumed simulation ($rows rounds, then $total)"
