#!/usr/bin/env bash
# The server optimisers' defaults converge: strata-sim with 4 clients, mlp,
# 10 rounds (the defaults otherwise: iid, uniform 1%), seed 1, once with
# each optimiser and no --server-lr. FedAdam and FedYogi must reach plain
# FedAvg's accuracy (within 0.5 points), FedAvgM within 2 points (with the
# published constants, lr 1 and tau 1e-3, FedAdam diverged here).
source "$(dirname "$0")/lib.sh"

accuracy() {
    local out
    out=$(timeout 600 "$BUILD/strata-sim" --clients 4 --rounds 10 --model mlp --data "$DATA" \
        --server-opt "$1" --seed 1 --out "$WORK/$1" --json) ||
        { tail -n 20 "$WORK/$1/server.log" >&2; fail "strata-sim --server-opt $1 failed"; }
    json_field "$(echo "$out" | tail -n 1)" final_accuracy
}

plain=$(accuracy plain)
echo "plain: $plain"
for opt in fedadam fedyogi fedavgm; do
    acc=$(accuracy "$opt")
    echo "$opt: $acc"
    margin=0.005
    [ "$opt" = fedavgm ] && margin=0.02
    assert_gt "$acc" "$(awk -v p="$plain" -v m="$margin" 'BEGIN { print p - m }')" \
        "$opt's accuracy against plain FedAvg's ($plain)"
done
echo "PASS: server optimisers' defaults"
