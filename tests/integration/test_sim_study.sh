#!/usr/bin/env bash
# strata-sim --study: a grid of 2 runs (uniform and legacy, 4 clients, 2
# per round, 2 rounds) writes one CSV of every run and round, SVG plots
# (accuracy against uplink and total bytes; legacy's per-layer density heat
# map) linked from report.md and report.html. Running it again skips the
# finished runs; a stopped study resumes its run. A spec that is not valid
# runs nothing.
source "$(dirname "$0")/lib.sh"

SIM="$BUILD/strata-sim"
OUT="$WORK/study"

cat >"$WORK/spec.json" <<EOF
{
  "data": "$DATA",
  "model": "mlp",
  "partition": "dirichlet:0.5",
  "clients": 4,
  "clients_per_round": 2,
  "rounds": 2,
  "policy": ["uniform", "legacy"],
  "density": 0.05,
  "seed": [7]
}
EOF
timeout 600 "$SIM" --study "$WORK/spec.json" --out "$OUT" 2>"$WORK/err1.txt" ||
    { cat "$WORK/err1.txt" "$OUT"/runs/*.log >&2; fail "the study failed"; }
# Progress: each run's result as it ends, and what is left.
grep -q "run 1/2: uniform_7 finished: accuracy 0\.[0-9]*, [0-9.]* MB up, [0-9.]* MB in all; 1 run to go" \
    "$WORK/err1.txt" || fail "no progress line after run 1: $(cat "$WORK/err1.txt")"
grep -q "run 2/2: legacy_7 finished: .*; 0 runs to go, about 0 min" "$WORK/err1.txt" ||
    fail "no progress line after run 2: $(cat "$WORK/err1.txt")"
# One CSV: a header and 2 runs x 2 rounds, the axes as columns.
head -n 1 "$OUT/study.csv" | grep -q "^run,policy,seed,round,accuracy,loss,uplink_bytes,downlink_bytes,cum_uplink_bytes,cum_total_bytes,eval_samples$" ||
    fail "study.csv header: $(head -n 1 "$OUT/study.csv")"
[ "$(wc -l <"$OUT/study.csv")" -eq 5 ] || fail "study.csv should hold 4 rows"
[ "$(grep -c ',uniform,7,' "$OUT/study.csv")" -eq 2 ] || fail "study.csv lacks the uniform run"
[ "$(grep -c ',legacy,7,' "$OUT/study.csv")" -eq 2 ] || fail "study.csv lacks the legacy run"
awk -F, 'NR > 1 && !($9 > 0 && $10 > $9) { bad = 1 } END { exit bad }' "$OUT/study.csv" ||
    fail "cumulative bytes are not positive, total above uplink"
# The plots are SVG, linked from both reports.
for f in all-uplink.svg all-total.svg all-legacy-density.svg; do
    [ -s "$OUT/plots/$f" ] || fail "plots/$f missing"
    head -n 2 "$OUT/plots/$f" | grep -q "<svg" || fail "plots/$f is not SVG"
    grep -q "(plots/$f)" "$OUT/report.md" || fail "report.md does not link plots/$f"
    grep -q "src=\"plots/$f\"" "$OUT/report.html" || fail "report.html does not show plots/$f"
done
grep -q "<polyline" "$OUT/plots/all-uplink.svg" || fail "the uplink plot has no line"
grep -q "fc1.weight" "$OUT/plots/all-legacy-density.svg" || fail "the heat map names no layer"
[ ! -e "$OUT/plots/all-uniform-density.svg" ] || fail "uniform got a density heat map"
grep -q "| legacy | 1 |" "$OUT/report.md" || fail "report.md lacks legacy's row"

# Again: both runs are skipped.
"$SIM" --study "$WORK/spec.json" --out "$OUT" 2>"$WORK/err2.txt" || fail "the second study failed"
grep -q "2 of 2 runs finished (2 before), 0 failed" "$WORK/err2.txt" ||
    fail "finished runs were not skipped: $(cat "$WORK/err2.txt")"
[ "$(wc -l <"$OUT/study.csv")" -eq 5 ] || fail "study.csv changed on the second run"

# A round that was not evaluated (accuracy and loss empty in its report.csv,
# as strata-sim writes a round that closed without a new model) leaves the
# model as it was: the run's final accuracy is its last evaluated round's,
# not 0, and study.csv leaves the round's accuracy empty.
REP="$OUT/runs/legacy_7/report.csv"
acc0=$(awk -F, 'NR == 2 { print $3 }' "$REP")
awk -F, 'BEGIN { OFS = "," } NR == 3 { $3 = ""; $4 = "" } { print }' "$REP" >"$WORK/rep.csv"
cp "$WORK/rep.csv" "$REP"
"$SIM" --study "$WORK/spec.json" --out "$OUT" 2>"$WORK/err7.txt" || fail "the rebuilt study failed"
grep -qF "| legacy | 1 | $(LC_ALL=C printf '%.4f' "$acc0") ± 0.0000 |" "$OUT/report.md" ||
    fail "legacy's final accuracy should be round 0's $acc0: $(grep '| legacy |' "$OUT/report.md")"
grep -q '^legacy_7,legacy,7,1,,,' "$OUT/study.csv" ||
    fail "study.csv should leave the round's accuracy empty: $(grep '^legacy_7' "$OUT/study.csv")"

# SIGTERM stops a study in its run (exit 130, no process left); the same
# command resumes that run and finishes the study.
sed 's/"rounds": 2/"rounds": 300/; s/"uniform", "legacy"/"uniform"/' "$WORK/spec.json" >"$WORK/long.json"
"$SIM" --study "$WORK/long.json" --out "$WORK/stopped" 2>"$WORK/err5.txt" &
study=$!
PIDS+=("$study")
for _ in $(seq 1 600); do
    grep -q "round 1/300" "$WORK/stopped/runs/uniform_7.log" 2>/dev/null && break
    kill -0 "$study" 2>/dev/null || fail "the study exited early: $(cat "$WORK/err5.txt")"
    sleep 0.2
done
kill -TERM "$study"
reap "$study"
[ "$REAPED_RC" = 130 ] || fail "a stopped study exited $REAPED_RC, expected 130"
if pgrep -f -- "$WORK/stopped/" >/dev/null; then fail "the stopped study left processes"; fi
[ ! -e "$WORK/stopped/runs/uniform_7/study.done" ] || fail "the stopped run counts as finished"
# Its summary counts the runs that finished, not the runs planned.
grep -q "0 of 1 run finished (0 before), 0 failed" "$WORK/err5.txt" ||
    fail "the stopped study's summary: $(grep 'report in' "$WORK/err5.txt")"
stopped_rows=$(($(wc -l <"$WORK/stopped/runs/uniform_7/report.csv") - 1))
[ "$stopped_rows" -ge 2 ] || fail "the stopped run's report holds $stopped_rows rounds"
sed "s/\"rounds\": 300/\"rounds\": $((stopped_rows + 1))/" "$WORK/long.json" >"$WORK/short.json"
timeout 300 "$SIM" --study "$WORK/short.json" --out "$WORK/stopped" 2>"$WORK/err6.txt" ||
    fail "the resumed study failed: $(tail -n 5 "$WORK/err6.txt")"
[ -e "$WORK/stopped/runs/uniform_7/study.done" ] || fail "the resumed run did not finish"
[ "$(wc -l <"$WORK/stopped/study.csv")" -eq $((stopped_rows + 2)) ] ||
    fail "study.csv does not hold the resumed run's $((stopped_rows + 1)) rounds"

# A grid of dense runs only, over the clients' rate: each rate gets its own
# panel, table row and plots (dense runs otherwise join the compressed runs'
# panels), named without the density they ignore (one run per rate).
sed 's/"policy": \["uniform", "legacy"\]/"policy": "none", "lr": [0.05, 0.1]/; s/"density": 0.05/"density": [0.05, 0.1]/' \
    "$WORK/spec.json" >"$WORK/dense.json"
timeout 300 "$SIM" --study "$WORK/dense.json" --out "$WORK/dense" 2>"$WORK/err8.txt" ||
    fail "the dense study failed: $(tail -n 5 "$WORK/err8.txt")"
for lr in 0.05 0.1; do
    grep -q "^## lr $lr\$" "$WORK/dense/report.md" || fail "report.md has no panel for lr $lr"
    [ -s "$WORK/dense/plots/$lr-uplink.svg" ] || fail "no uplink plot for lr $lr"
done
[ "$(grep -c '^| none | 1 | 0\.[0-9]* ± 0\.0000 | [0-9]* | [0-9]* | reference |$' "$WORK/dense/report.md")" = 2 ] ||
    fail "report.md should hold one dense row per rate: $(cat "$WORK/dense/report.md")"
! grep -q "density" "$WORK/dense/report.md" || fail "a dense panel is named after a density"
# Beside compressed runs, the one dense run joins every panel that shares
# its other axes (here each density's), as the reference of its ratios.
sed 's/"uniform", "legacy"/"none", "uniform"/; s/"density": 0.05/"density": [0.05, 0.1]/' \
    "$WORK/spec.json" >"$WORK/mixed.json"
timeout 300 "$SIM" --study "$WORK/mixed.json" --out "$WORK/mixed" 2>"$WORK/err9.txt" ||
    fail "the mixed study failed: $(tail -n 5 "$WORK/err9.txt")"
grep -q "3 of 3 runs finished" "$WORK/err9.txt" || fail "the mixed study should run 3 runs"
[ "$(grep -c '^## ' "$WORK/mixed/report.md")" = 2 ] || fail "the mixed study should have 2 panels"
[ "$(grep -c '^| none | 1 | .* | reference |$' "$WORK/mixed/report.md")" = 2 ] ||
    fail "the dense run should be the reference of both panels: $(cat "$WORK/mixed/report.md")"
[ "$(grep -c '^| uniform | 1 | .* | [0-9.]*x fewer |$' "$WORK/mixed/report.md")" = 2 ] ||
    fail "each panel's uniform row should give its ratio to dense: $(cat "$WORK/mixed/report.md")"

# A spec with an option strata-sim does not know runs nothing.
sed 's/"rounds": 2/"roundz": 2/' "$WORK/spec.json" >"$WORK/bad.json"
rc=0
"$SIM" --study "$WORK/bad.json" --out "$WORK/bad" 2>"$WORK/err3.txt" || rc=$?
[ "$rc" = 2 ] || fail "a bad spec exited $rc, expected 2"
grep -q "roundz" "$WORK/err3.txt" || fail "the error does not name the bad key: $(cat "$WORK/err3.txt")"
[ ! -e "$WORK/bad" ] || fail "a bad spec created its --out"
# So does one with a client option out of the clients' range.
sed 's/"rounds": 2/"rounds": 2, "ef_beta": [0.5, 1.5]/' "$WORK/spec.json" >"$WORK/bad.json"
rc=0
"$SIM" --study "$WORK/bad.json" --out "$WORK/bad" 2>"$WORK/err3.txt" || rc=$?
[ "$rc" = 2 ] || fail "a spec with ef_beta 1.5 exited $rc, expected 2"
grep -q -- "--ef-beta: 1.5 is above the maximum 1" "$WORK/err3.txt" ||
    fail "the error does not name the bad client option: $(cat "$WORK/err3.txt")"
[ ! -e "$WORK/bad" ] || fail "a spec with a bad client option created its --out"
# Run options on the command line are refused with --study.
rc=0
"$SIM" --study "$WORK/spec.json" --out "$WORK/bad" --rounds 5 2>"$WORK/err4.txt" || rc=$?
[ "$rc" = 2 ] || fail "--study with --rounds exited $rc, expected 2"
grep -q "from its spec" "$WORK/err4.txt" || fail "no message for --rounds with --study"
[ ! -e "$WORK/bad" ] || fail "a refused study created its --out"
# So are the options of a single run's invocation.
for opt in --json "--report-from $WORK" "--data-shares 4"; do
    rc=0
    # shellcheck disable=SC2086
    "$SIM" --study "$WORK/spec.json" --out "$WORK/bad" $opt 2>"$WORK/err4.txt" || rc=$?
    [ "$rc" = 2 ] || fail "--study with $opt exited $rc, expected 2"
    grep -q "does not take ${opt%% *} " "$WORK/err4.txt" || fail "no message for $opt with --study"
    [ ! -e "$WORK/bad" ] || fail "a refused study created its --out"
done
echo "PASS: study of 2 runs"
