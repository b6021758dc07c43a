#!/usr/bin/env bash
# strata-sim starts that fail: each prints a clear message (the
# coordinator's own error line when the coordinator refuses), exits
# non-zero, leaves no process behind and nothing in --out that it created.
source "$(dirname "$0")/lib.sh"

SIM="$BUILD/strata-sim"

# expect_fail RC PATTERN ARGS...: strata-sim ARGS exits RC and its standard
# error matches PATTERN.
expect_fail() {
    local want=$1 pattern=$2 rc=0
    shift 2
    timeout 120 "$SIM" "$@" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
    [ "$rc" = "$want" ] || fail "strata-sim $* exited $rc, expected $want: $(cat "$WORK/err.txt")"
    grep -q -- "$pattern" "$WORK/err.txt" || fail "strata-sim $*: no '$pattern' in: $(cat "$WORK/err.txt")"
    if pgrep -f -- "$WORK/" >/dev/null 2>&1; then
        fail "strata-sim $* left processes: $(pgrep -af -- "$WORK/")"
    fi
}

# A data directory that does not exist: the coordinator's message, and the
# --out it would have created (with a parent) does not exist.
expect_fail 1 "the coordinator did not start: strata-server: cannot open directory $WORK/nope" \
    --clients 2 --rounds 1 --data "$WORK/nope" --out "$WORK/new/out"
[ ! -e "$WORK/new" ] || fail "a failed start left $WORK/new behind"

# A value the coordinator refuses; an --out that existed (empty) stays empty.
mkdir "$WORK/empty"
expect_fail 1 'strata-server: --momentum: "abc" is not a number' \
    --clients 2 --rounds 1 --data "$DATA" --out "$WORK/empty" --momentum abc
[ -z "$(ls -A "$WORK/empty")" ] || fail "a failed start left $(ls -A "$WORK/empty") in --out"

# A data set with a test split but no training split: the coordinator
# starts, the shards cannot be cut; nothing is left behind.
mkdir "$WORK/testonly"
ln -s "$DATA"/t10k-* "$WORK/testonly/"
expect_fail 1 "train" --clients 2 --rounds 1 --data "$WORK/testonly" --out "$WORK/t"
[ ! -e "$WORK/t" ] || fail "a failed start left $WORK/t behind"

# Usage errors, found before anything starts.
expect_fail 2 "give either --clients-per-round or --fraction" \
    --clients 4 --clients-per-round 2 --fraction 0.5 --data "$DATA" --out "$WORK/u"
expect_fail 2 "holds no run to resume" --data "$DATA" --out "$WORK/u" --resume
expect_fail 2 "unknown option" --clients 2 --data "$DATA" --out "$WORK/u" --no-such-option 1
# A client option out of the clients' range is refused here, not by every
# client once the run has started.
expect_fail 2 "ef-beta: 2 is above the maximum 1" --clients 2 --data "$DATA" --out "$WORK/u" \
    --ef-beta 2
expect_fail 2 "ef-max-staleness: -1 is below the minimum 0" --clients 2 --data "$DATA" \
    --out "$WORK/u" --ef-max-staleness -1
expect_fail 2 "ef-beta: 0 must be above 0" --clients 2 --data "$DATA" --out "$WORK/u" --ef-beta 0
[ ! -e "$WORK/u" ] || fail "a usage error created $WORK/u"
# strata-client refuses the same values with the same words (both parse
# them with the same option rows).
client_refuses() {
    local want=$1 rc=0
    shift
    timeout 60 "$BUILD/strata-client" --server http://127.0.0.1:9 --state-dir "$WORK/c" \
        --data "$DATA" "$@" 2>"$WORK/err.txt" || rc=$?
    [ "$rc" = 2 ] || fail "strata-client $* exited $rc, expected 2: $(cat "$WORK/err.txt")"
    grep -q -- "$want" "$WORK/err.txt" || fail "strata-client $*: no '$want' in: $(cat "$WORK/err.txt")"
}
client_refuses "ef-beta: 0 must be above 0" --ef-beta 0
client_refuses "ef-beta: 2 is above the maximum 1" --ef-beta 2
client_refuses "ef-max-staleness: -1 is below the minimum 0" --ef-max-staleness -1
[ ! -e "$WORK/c" ] || fail "a usage error of strata-client created $WORK/c"
echo "PASS: failed starts leave nothing behind"
