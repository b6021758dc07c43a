#!/usr/bin/env bash
# mlp trained for one epoch on 10,000 Fashion-MNIST images must score above
# 80% on the 10,000-image test set.
source "$(dirname "$0")/lib.sh"

out=$("$TOOL" train --model mlp --data "$DATA" --epochs 1 --limit 10000 --threads 2 --json)
echo "$out"
summary=$(echo "$out" | tail -n 1)
[ "$(json_field "$summary" params)" = 199210 ] || fail "params is not 199210"
[ "$(json_field "$summary" epochs)" = 1 ] || fail "epochs is not 1"
[ "$(json_field "$summary" train_samples)" = 10000 ] || fail "train_samples is not 10000"
acc=$(json_field "$summary" test_accuracy)
assert_gt "$acc" 0.80 "test accuracy after one epoch on 10,000 images"
assert_gt "$(json_field "$summary" images_per_second)" 0 "images per second"
echo "PASS: test accuracy $acc"
