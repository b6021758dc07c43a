#!/usr/bin/env bash
# strata-sim --link-up/--link-down: every client in its own network
# namespace behind a veth pair with tbf on each end.
#  1. 2 clients, 2 dense rounds at 2mbit up / 20mbit down: each round takes
#     at least the time one dense update (about 640 kB) needs at 2 Mbit/s;
#     --target-accuracy reports the time to reach it; every namespace and
#     interface is gone afterwards.
#  2. SIGINT during the run: the run stops (exit 130) and removes them too.
#  3. A bad rate is refused (exit 2) before anything is made; without root
#     the run stops with a clear message (exit 1), nothing made.
# Needs root, ip and tc; exits 77 (skipped) when it cannot make a namespace.
. "$(dirname "$0")/lib.sh"
SIM="$BUILD/strata-sim"
[ -x "$SIM" ] || fail "no $SIM"
skip() {
    echo "SKIP test_sim_links: $*"
    exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root for network namespaces"
command -v ip >/dev/null && command -v tc >/dev/null || skip "needs iproute2 (ip, tc)"
probe="strata-probe-$$"
ip netns add "$probe" 2>/dev/null || skip "this machine does not allow network namespaces"
ip netns del "$probe"
T_START=$SECONDS
left() { # namespaces and interfaces of strata-sim pid $1 still present
    { ip netns list | grep -c "^strata-$1-" || true; } | tr -d '\n'
    printf ' '
    { ip -o link | grep -c ": s$(printf %x "$1")[hc]" || true; } | tr -d '\n'
}
OPTS=(--model mlp --data "$DATA" --policy none --max-steps 10 --link-up 2mbit --link-down 20mbit)

# 1. A capped run.
"$SIM" --clients 2 --rounds 2 "${OPTS[@]}" --target-accuracy 0.2 --out "$WORK/a" --json \
    >"$WORK/a.out" 2>"$WORK/a.err" &
pid=$!
wait $pid || fail "the run failed: $(tail -n 5 "$WORK/a.err")"
grep -q "2 clients behind their own links: uplink 2mbit, downlink 20mbit" "$WORK/a.err" ||
    fail "no link line: $(cat "$WORK/a.err")"
grep -q "coordinator at http://10.213.0.1:" "$WORK/a.err" || fail "the coordinator is not on the link"
summary=$(tail -n 1 "$WORK/a.out")
up=$(json_field "$summary" uplink_bytes)
t=$(json_field "$summary" time_s)
tt=$(json_field "$summary" time_to_target_s)
# Two rounds of two clients: each client's update alone needs 8 * bytes / 2e6 s.
need=$(awk -v u="$up" 'BEGIN { printf "%.2f", 8 * u / 4 / 2e6 * 2 * 0.8 }')
assert_gt "$t" "$need" "the rounds were faster than a 2mbit uplink allows"
[ -n "$tt" ] && [ "$tt" != null ] || fail "no time to target: $summary"
grep -q "Every client behind its own link" "$WORK/a/report.md" || fail "report.md lacks the links"
grep -q "first reached after" "$WORK/a/report.md" || fail "report.md lacks the time to target"
[ "$(left $pid)" = "0 0" ] || fail "left behind after the run: $(left $pid)"

# 2. SIGINT during the run.
"$SIM" --clients 2 --rounds 20 "${OPTS[@]}" --out "$WORK/b" >"$WORK/b.out" 2>"$WORK/b.err" &
pid=$!
for _ in $(seq 1 100); do
    grep -q "coordinator at" "$WORK/b.err" 2>/dev/null && break
    sleep 0.1
done
[ "$(left $pid)" = "2 2" ] || fail "expected 2 namespaces and 2 host interfaces: $(left $pid)"
kill -INT $pid
rc=0
wait $pid || rc=$?
[ "$rc" = 130 ] || fail "exit status $rc after SIGINT: $(tail -n 5 "$WORK/b.err")"
[ "$(left $pid)" = "0 0" ] || fail "left behind after SIGINT: $(left $pid)"

# 3. Refusals: a bad rate; no root.
rc=0
"$SIM" --clients 2 --rounds 2 --model mlp --data "$DATA" --link-up fast --out "$WORK/c" \
    >/dev/null 2>"$WORK/c.err" || rc=$?
[ "$rc" = 2 ] || fail "a bad rate: exit $rc"
grep -q "expected a rate such as 1mbit" "$WORK/c.err" || fail "bad rate message: $(cat "$WORK/c.err")"
[ ! -e "$WORK/c" ] || fail "a refused run left $WORK/c"
if command -v setpriv >/dev/null; then
    chmod 0711 "$WORK"
    mkdir -m 0777 "$WORK/d"
    rc=0
    setpriv --reuid=65534 --regid=65534 --clear-groups "$SIM" --clients 2 --rounds 2 \
        --model mlp --data "$DATA" --link-up 1mbit --out "$WORK/d/run" >/dev/null 2>"$WORK/d.err" ||
        rc=$?
    [ "$rc" = 1 ] || fail "without root: exit $rc: $(cat "$WORK/d.err")"
    grep -q "need root" "$WORK/d.err" || fail "without root: $(cat "$WORK/d.err")"
    [ ! -e "$WORK/d/run" ] || fail "a run without root left $WORK/d/run"
fi
echo "PASS test_sim_links ($((SECONDS - T_START)) s)"
