#!/usr/bin/env bash
# strata-sim runs a real coordinator and real client processes over
# loopback: 3 clients, Dirichlet 0.5 split of Fashion-MNIST, mlp, legacy
# policy at 5% density, 3 rounds. The federation must finish, learn, upload
# far fewer bytes than dense updates, and write its report.
source "$(dirname "$0")/lib.sh"

out=$(timeout 300 "$BUILD/strata-sim" --clients 3 --rounds 3 --model mlp --data "$DATA" \
    --partition dirichlet:0.5 --policy legacy --density 0.05 --seed 2 --out "$WORK/sim" --json) ||
    { tail -n 20 "$WORK/sim/server.log" "$WORK"/sim/clients/*.log >&2; fail "strata-sim failed"; }
summary=$(echo "$out" | tail -n 1)
echo "$summary"
[ "$(json_field "$summary" rounds)" = 3 ] || fail "rounds is not 3"
assert_gt "$(json_field "$summary" final_accuracy)" 0.55 "final accuracy"
up=$(json_field "$summary" uplink_bytes)
dense=$(json_field "$summary" dense_uplink_bytes)
assert_gt "$dense" "$(awk -v u="$up" 'BEGIN { print u * 5 }')" "dense uplink vs compressed uplink"
down=$(json_field "$summary" downlink_bytes)
awk -v t="$(json_field "$summary" total_bytes)" -v u="$up" -v d="$down" 'BEGIN { exit !(t == u + d && d > 0) }' ||
    fail "total_bytes is not uplink + downlink: $summary"
awk -v t="$(json_field "$summary" dense_total_bytes)" -v x="$dense" 'BEGIN { exit !(t == 2 * x) }' ||
    fail "dense_total_bytes is not twice the dense uplink: $summary"
head -n 1 "$WORK/sim/report.csv" | grep -q "total_bytes,dense_total_bytes,downlink_ratio,total_ratio" ||
    fail "report.csv lacks the traffic columns"
for f in report.csv report.md; do [ -s "$WORK/sim/$f" ] || fail "$f missing"; done
[ "$(wc -l <"$WORK/sim/report.csv")" -eq 4 ] || fail "report.csv should have a header and 3 rounds"
grep -q "fc1.weight" "$WORK/sim/report.md" || fail "report.md lacks per-layer densities"
head -n 1 "$WORK/sim/report.csv" | grep -q "density:fc1.weight" || fail "report.csv lacks per-layer densities"
# Every client kept its receipts and residuals.
for i in 0 1 2; do
    [ "$(wc -l <"$WORK/sim/clients/$i/receipts.log")" -eq 3 ] || fail "client $i receipts"
    [ -s "$WORK/sim/clients/$i/residual.safetensors" ] || fail "client $i residuals"
done
# A second run into the same directory is refused.
if "$BUILD/strata-sim" --clients 1 --rounds 1 --data "$DATA" --out "$WORK/sim" 2>/dev/null; then
    fail "strata-sim reused an --out that holds a run"
fi
echo "PASS: simulated federation"
