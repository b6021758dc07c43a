#!/usr/bin/env bash
# A seeded run at a fixed thread count is bit-for-bit reproducible; another
# seed gives another model; a saved checkpoint evaluates to the accuracy the
# training run reported.
source "$(dirname "$0")/lib.sh"

train() { # seed threads model out
    "$TOOL" train --model "$3" --data "$DATA" --epochs 1 --limit 2000 --threads "$2" \
        --seed "$1" --out "$4" --json | tail -n 1
}
for model in mlp cnn; do
    a=$(train 5 2 $model "$WORK/a.safetensors")
    b=$(train 5 2 $model "$WORK/b.safetensors")
    c=$(train 6 2 $model "$WORK/c.safetensors")
    cmp -s "$WORK/a.safetensors" "$WORK/b.safetensors" || fail "$model: same seed, different checkpoints"
    [ "$(json_field "$a" test_loss)" = "$(json_field "$b" test_loss)" ] || fail "$model: same seed, different loss"
    if cmp -s "$WORK/a.safetensors" "$WORK/c.safetensors"; then fail "$model: seeds 5 and 6 gave the same model"; fi
    ev=$("$TOOL" eval --model "$WORK/a.safetensors" --data "$DATA" --threads 2 --json)
    want=$(json_field "$a" test_accuracy)
    got=$(json_field "$ev" test_accuracy)
    awk -v a="$want" -v b="$got" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-9) }' ||
        fail "$model: checkpoint evaluates to $got, training reported $want"
    echo "PASS: $model reproducible (test accuracy $want)"
done

# Bad inputs give clear errors and a non-zero exit.
if "$TOOL" train --model nosuch --data "$DATA" --epochs 1 2>"$WORK/err"; then fail "unknown model accepted"; fi
grep -q "nosuch" "$WORK/err" || fail "unknown-model error does not name the model"
if "$TOOL" train --model mlp --data "$WORK" --epochs 1 2>"$WORK/err"; then fail "missing data accepted"; fi
grep -q "$WORK" "$WORK/err" || fail "missing-data error does not name the path"
if "$TOOL" train --model mlp --data "$DATA" --epochs 0 2>/dev/null; then fail "--epochs 0 accepted"; fi
printf 'garbage' >"$WORK/bad.safetensors"
if "$TOOL" eval --model "$WORK/bad.safetensors" --data "$DATA" 2>"$WORK/err"; then fail "garbage checkpoint accepted"; fi
[ -s "$WORK/err" ] || fail "garbage checkpoint: no message"
printf '{"input":[1,28,28],"layers":[{"type":"flatten"},{"type":"linear","name":"fc","out_features":5}]}' >"$WORK/five.json"
if "$TOOL" train --model "$WORK/five.json" --data "$DATA" --epochs 1 --limit 100 2>"$WORK/err"; then
    fail "a model with 5 outputs trained on 10 classes"
fi
grep -q "5 outputs" "$WORK/err" || fail "output-count message: $(cat "$WORK/err")"
if "$TOOL" eval --model mlp --data "$DATA" 2>/dev/null; then fail "eval of an untrained built-in accepted"; fi
if "$TOOL" train --model mlp --data "$DATA" --epochs 1 --limit 100 --out "$WORK/nodir/x.safetensors" \
    2>"$WORK/err"; then fail "unwritable --out accepted"; fi
grep -q "cannot write" "$WORK/err" || fail "unwritable --out: $(cat "$WORK/err")"
echo "PASS: bad inputs rejected"
