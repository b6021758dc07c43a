#!/usr/bin/env bash
# The server optimisers' defaults converge: strata-sim with 4 clients, mlp,
# 10 rounds (the defaults otherwise: iid, uniform 1%), seed 1, once with
# each optimiser and no --server-lr. FedAdam and FedYogi must reach plain
# FedAvg's accuracy (within 0.5 points), FedAvgM within 2 points (with the
# published constants, lr 1 and tau 1e-3, FedAdam diverged here). Then a
# 3-round run with a falling server rate names each step's rate.
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

# --server-lr-final: each round's progress line names the rate of its step,
# 4 falling to 1 along a half cosine over 3 rounds (4, 2.5, 1).
timeout 300 "$BUILD/strata-sim" --clients 2 --rounds 3 --model mlp --data "$DATA" \
    --server-lr 4 --server-lr-final 1 --seed 1 --out "$WORK/schedule" >/dev/null 2>&1 ||
    { tail -n 20 "$WORK/schedule/server.log" >&2; fail "strata-sim --server-lr-final failed"; }
for want in "0 4" "1 2.5" "2 1"; do
    read -r r lr <<<"$want"
    grep -q "^round $r/3: .*, server lr $lr\$" "$WORK/schedule/server.log" ||
        fail "round $r should step at rate $lr: $(grep '^round' "$WORK/schedule/server.log")"
done
echo "PASS: server optimisers' defaults"
