#!/usr/bin/env bash
# strata-sim with client sampling: 20 clients, 5 per round, 3 rounds, with
# learning options passed through to the coordinator. Only the selected
# clients train each round (their receipts add up to 5 per round), every
# client loads only its own shard, an idle client stays small, the report
# is complete, and the same seed selects the same clients again. The first
# run evaluates rounds 0 and 1 on 500 test images (--eval-samples), the
# last on all: its final accuracy equals the second run's, evaluated fully.
source "$(dirname "$0")/lib.sh"

SIM="$BUILD/strata-sim"
OUT="$WORK/sim"

# --help lists every option it passes through, in two sections: each of
# the first is the coordinator's, each of the second the client's.
"$SIM" --help >"$WORK/help.txt"
# check_passed HEADING PROGRAM MIN: the options under HEADING (at least MIN)
# are all options of PROGRAM.
check_passed() {
    local opt passed
    "$BUILD/$2" --help >"$WORK/$2.help"
    passed=$(sed -n "/^$1/,/^[A-Z]/p" "$WORK/help.txt" | grep -o '^  --[a-z-]*' | tr -d ' ')
    [ "$(echo "$passed" | wc -l)" -ge "$3" ] || fail "strata-sim --help lists too few $2 options"
    for opt in $passed; do
        grep -q -- "^  $opt " "$WORK/$2.help" || fail "$opt is not a $2 option"
    done
}
check_passed "Passed to the coordinator" strata-server 18
check_passed "Passed to every client" strata-client 2

# Peak resident memory (VmHWM, kB) of each client of this run (its command
# line names its shard), sampled while the run lasts.
sample_clients() {
    local sim=$1 pid idx hwm
    while kill -0 "$sim" 2>/dev/null; do
        for pid in $(pgrep -f -- "--data $OUT/shards/" 2>/dev/null || true); do
            idx=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" |
                grep -o -- '--client-index [0-9]*' | cut -d' ' -f2) || continue
            hwm=$(awk '/^VmHWM/ { print $2 }' 2>/dev/null <"/proc/$pid/status") || continue
            [ -n "$idx" ] && [ -n "$hwm" ] && echo "$idx $hwm"
            if [ -n "$idx" ] && [ ! -s "$WORK/cmdline.$idx" ]; then
                tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" >"$WORK/cmdline.$idx" || true
            fi
        done
        sleep 0.2
    done
}

timeout 300 "$SIM" --clients 20 --clients-per-round 5 --rounds 3 --model mlp --data "$DATA" \
    --partition iid --seed 3 --momentum 0.5 --clip-norm 50 --server-opt fedavgm \
    --ef-beta 0.5 --ef-max-staleness 5 --eval-samples 500 --out "$OUT" --json >"$WORK/out.txt" 2>"$WORK/err.txt" &
sim=$!
PIDS+=("$sim")
sample_clients "$sim" >"$WORK/rss.txt"
reap "$sim"
[ "$REAPED_RC" = 0 ] || { tail -n 20 "$WORK/err.txt" "$OUT/server.log" >&2; fail "strata-sim exited $REAPED_RC"; }
summary=$(tail -n 1 "$WORK/out.txt")
echo "$summary"
[ "$(json_field "$summary" rounds)" = 3 ] || fail "rounds is not 3"
assert_gt "$(json_field "$summary" final_accuracy)" 0.3 "final accuracy"

# The report: a header and 3 rounds of 5 participants each.
[ "$(wc -l <"$OUT/report.csv")" -eq 4 ] || fail "report.csv should have a header and 3 rounds"
[ "$(awk -F, 'NR > 1 && $2 == 5' "$OUT/report.csv" | wc -l)" -eq 3 ] ||
    fail "every round should have 5 participants: $(cut -d, -f1-2 "$OUT/report.csv" | tr '\n' ' ')"
grep -q "20 clients (5 per round)" "$OUT/report.md" || fail "report.md does not state the sampling"
grep -q "; coordinator options --momentum 0.5 --server-opt fedavgm --clip-norm 50 --eval-samples 500; client options --ef-beta 0.5 --ef-max-staleness 5$" \
    "$OUT/report.md" || fail "report.md does not list the coordinator and client options given: $(sed -n 3p "$OUT/report.md")"
grep -q "fc1.weight" "$OUT/report.md" || fail "report.md lacks per-layer densities"
col=$(head -n 1 "$OUT/report.csv" | tr , '\n' | grep -nx eval_samples | cut -d: -f1)
[ -n "$col" ] || fail "report.csv has no eval_samples column"
evals=$(awk -F, -v c="$col" 'NR > 1 { printf "%s ", $c }' "$OUT/report.csv")
[ "$evals" = "500 500 10000 " ] || fail "test images per round: $evals (--eval-samples 500)"
grep -q "round 2 are on 10000 test images, those of earlier rounds on 500" "$OUT/report.md" ||
    fail "report.md does not say which rounds were evaluated on a subset"

# Only the selected clients trained: 5 receipts per round, at most one per
# client and round, spread over more than 5 clients.
total=0 trained=0
for i in $(seq 0 19); do
    n=0
    [ -f "$OUT/clients/$i/receipts.log" ] && n=$(wc -l <"$OUT/clients/$i/receipts.log")
    [ "$n" -le 3 ] || fail "client $i has $n receipts for 3 rounds"
    if [ "$n" -gt 0 ]; then
        trained=$((trained + 1))
        [ "$(cut -d' ' -f1 "$OUT/clients/$i/receipts.log" | sort -u | wc -l)" -eq "$n" ] ||
            fail "client $i has two receipts for one round"
    else
        [ ! -e "$OUT/clients/$i/residual.safetensors" ] || fail "idle client $i has residuals"
    fi
    total=$((total + n))
done
[ "$total" -eq 15 ] || fail "$total receipts, expected 15 (5 per round)"
[ "$trained" -gt 5 ] || fail "only $trained clients were ever selected"

# Every client loaded only its shard, and the shards cover the training set.
labels=0
for i in $(seq 0 19); do
    f="$OUT/shards/$i/train-labels-idx1-ubyte"
    [ -s "$f" ] || fail "shard $i missing"
    n=$(($(stat -c %s "$f") - 8))
    grep -q "$n training samples (share $i of 20, partition none)" "$OUT/clients/$i.log" ||
        fail "client $i did not load its shard of $n samples"
    labels=$((labels + n))
done
[ "$labels" -eq 60000 ] || fail "the shards hold $labels samples, not 60000"

# The learning options reached the coordinator.
cfg="$OUT/coordinator.json"
grep -q '"clients_per_round": 5' "$cfg" || fail "clients_per_round not passed: $(cat "$cfg")"
grep -q '"momentum": 0.5' "$cfg" || fail "momentum not passed"
grep -q '"clip_norm": 50' "$cfg" || fail "clip_norm not passed"
grep -q '"server_opt": "fedavgm"' "$cfg" || fail "server_opt not passed"
# coordinator.json is a config file strata-server reads back: a
# coordinator started from it (with the secret, a state directory and the
# data, which it leaves out) reports the same settings.
grep -q '"fraction": null' "$cfg" || fail "an unset fraction is not null: $(cat "$cfg")"
! grep -q enrolment_secret "$cfg" || fail "coordinator.json names the enrolment secret"
"$BUILD/strata-server" --config "$cfg" --enrolment-secret-file "$OUT/enrolment.secret" \
    --state-dir "$WORK/reload" --data "$DATA" >"$WORK/reload.out" 2>"$WORK/reload.err" &
reload=$!
PIDS+=("$reload")
wait_listening "$reload" "$WORK/reload.out" "$WORK/reload.err"
C=(curl -sS --max-time 10)
get /v1/status >"$WORK/reload.json"
python3 - "$cfg" "$WORK/reload.json" <<'PY' || fail "the reloaded coordinator's settings differ"
import json, sys
want = json.load(open(sys.argv[1]))
got = json.load(open(sys.argv[2]))["config"]
got.pop("enrolment_secret")
diff = sorted(k for k in set(want) | set(got) if want.get(k, "-") != got.get(k, "-"))
if diff or len(want) < 40:
    sys.exit("keys %s: file %s, coordinator %s" % (diff, [want.get(k) for k in diff], [got.get(k) for k in diff]))
PY
kill "$reload"
reap "$reload"
# The client options reached every client sampled.
n=0
for f in "$WORK"/cmdline.*; do
    [ -s "$f" ] || continue
    grep -q -- " --ef-beta 0.5 --ef-max-staleness 5 " "$f" ||
        fail "a client ran without --ef-beta 0.5 --ef-max-staleness 5: $(cat "$f")"
    n=$((n + 1))
done
[ "$n" -gt 0 ] || fail "no client command line sampled"

# An idle client (never selected) stayed under 40 MB.
[ -s "$WORK/rss.txt" ] || fail "no client memory sampled"
idle_max=0
for i in $(seq 0 19); do
    [ -f "$OUT/clients/$i/receipts.log" ] && continue
    m=$(awk -v i="$i" '$1 == i && $2 > m { m = $2 } END { print m + 0 }' "$WORK/rss.txt")
    [ "$m" -gt "$idle_max" ] && idle_max=$m
done
all_max=$(awk '$2 > m { m = $2 } END { print m + 0 }' "$WORK/rss.txt")
echo "peak RSS: idle client $idle_max kB, any client $all_max kB"
[ "$idle_max" -gt 0 ] && [ "$idle_max" -lt 40960 ] || fail "an idle client peaked at $idle_max kB"
# The same seed samples the same clients: a second run selects the same
# shares every round and ends with the same accuracy.
timeout 300 "$SIM" --clients 20 --clients-per-round 5 --rounds 3 --model mlp --data "$DATA" \
    --partition iid --seed 3 --momentum 0.5 --clip-norm 50 --server-opt fedavgm \
    --ef-beta 0.5 --ef-max-staleness 5 --out "$WORK/again" --json >"$WORK/out2.txt" 2>"$WORK/err2.txt" ||
    { tail -n 20 "$WORK/err2.txt" >&2; fail "the second strata-sim run failed"; }
rounds_of() { # rounds_of RECEIPTS: the rounds a client was acknowledged for
    if [ -f "$1" ]; then cut -d' ' -f1 "$1" | tr '\n' ' '; fi
}
for i in $(seq 0 19); do
    a=$(rounds_of "$OUT/clients/$i/receipts.log")
    b=$(rounds_of "$WORK/again/clients/$i/receipts.log")
    [ "$a" = "$b" ] || fail "client $i trained in rounds '$a', then '$b' with the same seed"
done
[ "$(json_field "$(tail -n 1 "$WORK/out2.txt")" final_accuracy)" = \
    "$(json_field "$summary" final_accuracy)" ] || fail "the same seed ended with another accuracy"
echo "PASS: sampled simulation"
