#!/usr/bin/env bash
# strata-tool compress / inspect / decode / policy on a real checkpoint:
# the payload keeps what the policy table says, fp16 values shrink it, the
# residual file carries error feedback between rounds, decoding restores the
# layout, and damaged payloads or bad options are refused with a message.
source "$(dirname "$0")/lib.sh"

"$TOOL" train --model cnn --data "$DATA" --epochs 1 --limit 300 --threads 2 \
    --out "$WORK/cnn.safetensors" >/dev/null 2>&1 || fail "training a checkpoint"

pol=$("$TOOL" policy --model cnn --policy legacy --density 0.01 --rounds 3 --json)
ratio=$(json_field "$pol" ratio_to_uniform)
awk -v r="$ratio" 'BEGIN { exit !(r > 0.995 && r < 1.005) }' || fail "legacy volume ratio $ratio"

"$TOOL" compress --in "$WORK/cnn.safetensors" --policy legacy --density 0.01 --rounds 3 \
    --out "$WORK/p32.bin" --residual "$WORK/res.safetensors" >/dev/null || fail "compress fp32"
[ -s "$WORK/res.safetensors" ] || fail "residual file not written"
"$TOOL" compress --in "$WORK/cnn.safetensors" --policy legacy --density 0.01 --rounds 3 \
    --round 1 --out "$WORK/p1.bin" --residual "$WORK/res.safetensors" >/dev/null ||
    fail "compress round 1 with the residual of round 0"
if "$TOOL" compress --in "$WORK/cnn.safetensors" --policy legacy --density 0.01 --rounds 3 \
    --round 1 --out "$WORK/x.bin" --residual "$WORK/res.safetensors" 2>/dev/null; then
    fail "round 1 compressed twice with the same residual"
fi
"$TOOL" compress --in "$WORK/cnn.safetensors" --policy legacy --density 0.01 --rounds 3 \
    --values fp16 --out "$WORK/p16.bin" >/dev/null || fail "compress fp16"

ins=$("$TOOL" inspect "$WORK/p32.bin" --json)
kept=$(json_field "$ins" kept)
# Round 0 of 3 is phase 0: the policy table's first phase gives the kept count.
want=$(printf '%s' "$pol" | grep -o '"kept":[0-9]*' | head -n 1 | cut -d: -f2)
[ "$kept" = "$want" ] || fail "payload keeps $kept elements, the policy table says $want"
s32=$(stat -c %s "$WORK/p32.bin")
s16=$(stat -c %s "$WORK/p16.bin")
[ "$s16" -lt "$s32" ] || fail "fp16 payload ($s16 bytes) not smaller than fp32 ($s32)"
bpe=$(awk -v s="$s32" -v k="$kept" 'BEGIN { printf "%.3f", s / k }')
echo "fp32 payload: $s32 bytes, $kept kept ($bpe bytes per kept element); fp16: $s16 bytes"

"$TOOL" decode --in "$WORK/p32.bin" --out "$WORK/dense.safetensors" >/dev/null || fail "decode"
a=$("$TOOL" info --model "$WORK/cnn.safetensors" --json)
b=$("$TOOL" info --model "$WORK/dense.safetensors" --json)
[ "$(json_field "$a" params)" = "$(json_field "$b" params)" ] || fail "decoded element count"
[ "${a#*\"tensors\"}" = "${b#*\"tensors\"}" ] || fail "decoded names or shapes differ"

# Damaged payloads and bad options.
head -c 500 "$WORK/p32.bin" >"$WORK/trunc.bin"
if "$TOOL" inspect "$WORK/trunc.bin" 2>"$WORK/err"; then fail "truncated payload accepted"; fi
[ -s "$WORK/err" ] || fail "truncated payload: no message"
if "$TOOL" decode --in "$WORK/cnn.safetensors" --out "$WORK/x.safetensors" 2>"$WORK/err"; then
    fail "a safetensors file decoded as a payload"
fi
if "$TOOL" compress --in "$WORK/cnn.safetensors" --policy nosuch --density 0.01 \
    --out "$WORK/x.bin" 2>"$WORK/err"; then fail "unknown policy accepted"; fi
grep -q nosuch "$WORK/err" || fail "unknown-policy message does not name it"
if "$TOOL" compress --in "$WORK/cnn.safetensors" --policy uniform --density 2 \
    --out "$WORK/x.bin" 2>/dev/null; then fail "density 2 accepted"; fi
if "$TOOL" compress --in "$WORK/cnn.safetensors" --policy uniform --density 0.01 \
    --out "$WORK/x.bin" --residual "$WORK/nodir/r.safetensors" 2>/dev/null; then
    fail "unwritable residual accepted"
fi

# Options: --help lists every option on stdout; a bad value, an unknown
# option or a stray argument exits with status 2 and a message naming it.
"$TOOL" compress --help >"$WORK/help" || fail "compress --help"
for o in in policy density out values residual round rounds seed level client-id model-version \
    samples; do
    grep -q -- "--$o " "$WORK/help" || fail "compress --help does not list --$o"
done
# usage_error PATTERN ARGS...: strata-tool ARGS exits 2 and its message matches PATTERN.
usage_error() {
    local pat=$1 rc=0
    shift
    "$TOOL" "$@" >/dev/null 2>"$WORK/err" || rc=$?
    [ "$rc" = 2 ] || fail "strata-tool $*: exit status $rc, not 2"
    grep -q -- "$pat" "$WORK/err" || fail "strata-tool $*: $(cat "$WORK/err")"
}
usage_error "--level" compress --in "$WORK/cnn.safetensors" --policy uniform --density 0.01 \
    --out "$WORK/x.bin" --level 20
usage_error "--values" compress --in "$WORK/cnn.safetensors" --policy uniform --density 0.01 \
    --out "$WORK/x.bin" --values fp8
usage_error "required" compress --in "$WORK/cnn.safetensors" --policy uniform --out "$WORK/x.bin"
usage_error "--epochs" train --model mlp --data "$DATA" --epochs x
usage_error "--nosuch" inspect --nosuch "$WORK/p32.bin"
usage_error "'extra'" policy --model cnn --policy legacy --density 0.01 --rounds 3 extra
usage_error "one payload file" inspect --json
usage_error "'$WORK/p16.bin'" inspect "$WORK/p32.bin" "$WORK/p16.bin"
[ -z "$(ls "$WORK" | grep '^x\.bin')" ] || fail "a refused command left an output file"
echo "PASS: compress tool"
