#!/usr/bin/env bash
# Every compressor and values format reaches a real federation and the model
# learns with it (issue "budgets that adapt", must-show 2; that the
# coordinator's aggregate is the sample-weighted mean of the decoded updates
# for each of them is test_server_aggregation's): strata-sim, mlp, 3 clients,
# 3 rounds, seed 1, one run per compressor specification, with error
# feedback on every client. Each run must complete every round with every
# client's update accepted, its tasks must name the compressor and values
# format asked for, and the accuracy after the last round must be above the
# accuracy after the first.
source "$(dirname "$0")/lib.sh"
SIM="$BUILD/strata-sim"
[ -x "$SIM" ] || fail "no $SIM"

# policy values expected-budget-of-fc1.weight
cases=(
    "uniform fp16 topk:0.01:fp16"
    "uniform bf16 topk:0.01:bf16"
    "uniform int8 topk:0.01:int8"
    "uniform ternary topk:0.01:ternary"
    "randk int8 randk:0.01:int8"
    "qsgd:4 fp32 qsgd:4"
    "sign fp32 sign"
    "powersgd:2 fp32 powersgd:2"
    "powersgd:2 fp16 powersgd:2:fp16"
    "fp16 fp32 fp16"
    "bf16 fp32 bf16"
)
for c in "${cases[@]}"; do
    read -r policy values want <<<"$c"
    out="$WORK/${policy//:/_}-$values"
    res=$(timeout 600 "$SIM" --clients 3 --rounds 3 --model mlp --data "$DATA" --policy "$policy" \
        --values "$values" --density 0.01 --seed 1 --out "$out" --json) ||
        { tail -n 20 "$out/server.log" >&2; fail "$policy/$values: strata-sim failed"; }
    csv="$out/report.csv"
    [ "$(tail -n +2 "$csv" | wc -l)" = 3 ] || fail "$policy/$values: not 3 rounds: $(cat "$csv")"
    # every round: 3 participants (column 2)
    awk -F, 'NR > 1 && $2 != 3 { exit 1 }' "$csv" || fail "$policy/$values: missing updates: $(cat "$csv")"
    grep -q "| fc1.weight | [0-9.]* | $want |" "$out/report.md" ||
        fail "$policy/$values: fc1.weight is not $want: $(grep fc1.weight "$out/report.md")"
    first=$(awk -F, 'NR == 2 { print $3 }' "$csv")
    last=$(awk -F, 'NR == 4 { print $3 }' "$csv")
    echo "$policy --values $values: accuracy $first after round 0, $last after round 2"
    assert_gt "$last" "$first" "$policy/$values: accuracy after round 2 against round 0"
done
echo "PASS test_compressors"
