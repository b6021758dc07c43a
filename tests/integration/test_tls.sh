#!/usr/bin/env bash
# HTTPS end to end with a certificate made here: a private CA signs the
# coordinator's certificate (for 127.0.0.1). A client given that CA
# registers and completes a one-round federation; curl and strata-client
# without the CA, or with another CA, are refused and register nothing; a
# plain-HTTP request to the HTTPS port gets no answer; a key that does not
# match the certificate stops the coordinator at start-up with an error.
. "$(dirname "$0")/lib.sh"
SERVER="$BUILD/strata-server"
CLIENT="$BUILD/strata-client"
command -v openssl >/dev/null || fail "openssl is required (scripts/setup.sh installs it)"
command -v curl >/dev/null || fail "curl is required"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
SECRET=tls-s3cret
SPID=""
cleanup() {
    [ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

# make_ca NAME: a self-signed CA in $WORK/NAME.pem and $WORK/NAME.key.
make_ca() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$WORK/$1.key" -out "$WORK/$1.pem" -days 2 -subj "/CN=$1" 2>/dev/null ||
        fail "openssl: CA $1"
}
make_ca ca
make_ca other-ca
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$WORK/srv.key" \
    -out "$WORK/srv.csr" -subj "/CN=localhost" 2>/dev/null || fail "openssl: server key"
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$WORK/san.ext"
openssl x509 -req -in "$WORK/srv.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" \
    -CAcreateserial -out "$WORK/srv.pem" -days 2 -extfile "$WORK/san.ext" 2>/dev/null ||
    fail "openssl: sign"

# A key that does not belong to the certificate: refused at start-up.
if "$SERVER" --state-dir "$WORK/bad" --model mlp --data "$DATA" --port 0 \
    --enrolment-secret "$SECRET" --tls-cert "$WORK/srv.pem" --tls-key "$WORK/other-ca.key" \
    >"$WORK/bad.out" 2>"$WORK/bad.err"; then
    fail "the coordinator started with a key that does not match its certificate"
fi
grep -q "tls\|TLS\|certificate" "$WORK/bad.err" || fail "no TLS error: $(cat "$WORK/bad.err")"
# Half a TLS configuration is a configuration error.
"$SERVER" --state-dir "$WORK/bad2" --model mlp --data "$DATA" --enrolment-secret "$SECRET" \
    --tls-cert "$WORK/srv.pem" >/dev/null 2>"$WORK/bad2.err" && fail "--tls-cert alone accepted"
grep -q "tls_key" "$WORK/bad2.err" || fail "no tls_key error: $(cat "$WORK/bad2.err")"

"$SERVER" --state-dir "$WORK/state" --model mlp --data "$DATA" --port 0 --rounds 1 \
    --min-clients 1 --clients-per-round 1 --max-steps 20 --enrolment-secret "$SECRET" \
    --tls-cert "$WORK/srv.pem" --tls-key "$WORK/srv.key" >"$WORK/server.out" 2>"$WORK/server.err" &
SPID=$!
wait_listening "$SPID" "$WORK/server.out" "$WORK/server.err"
case "$URL" in https://127.0.0.1:*) ;; *) fail "expected an https URL, got '$URL'" ;; esac
PLAIN=${URL/https:/http:}

[ "$(curl -sS --max-time 10 --cacert "$WORK/ca.pem" "$URL/healthz")" = ok ] ||
    fail "healthz over HTTPS with the CA"
rc=0
curl -sS --max-time 10 "$URL/healthz" >/dev/null 2>"$WORK/curl.err" || rc=$?
[ $rc -eq 60 ] || fail "curl without the CA: exit $rc, expected 60 (certificate refused)"
rc=0
curl -sS --max-time 10 --cacert "$WORK/other-ca.pem" "$URL/healthz" >/dev/null 2>&1 || rc=$?
[ $rc -eq 60 ] || fail "curl with another CA: exit $rc, expected 60"
code=$(curl -s --max-time 10 -o /dev/null -w '%{http_code}' "$PLAIN/healthz" || true)
[ "$code" != 200 ] || fail "plain HTTP answered on the HTTPS port"

# strata-client without the CA, and with the wrong one: refused, not retried.
for ca in "" "$WORK/other-ca.pem"; do
    args=()
    [ -n "$ca" ] && args=(--ca-cert "$ca")
    rc=0
    timeout 60 "$CLIENT" --server "$URL" --state-dir "$WORK/c-bad" --data "$DATA" \
        --enrolment-secret "$SECRET" --poll-wait 1 "${args[@]}" >"$WORK/c-bad.log" 2>&1 || rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "client with CA '${ca:-none}': exit $rc"
    grep -qi "certificate\|ca-cert" "$WORK/c-bad.log" || fail "no certificate error: $(cat "$WORK/c-bad.log")"
    rm -rf "$WORK/c-bad"
done
STATUS=$(curl -sS --max-time 10 --cacert "$WORK/ca.pem" "$URL/v1/status")
[ "$(json_field "$STATUS" registered_clients)" = 0 ] || fail "a refused client registered: $STATUS"

# With the CA: registers, trains, uploads, and the federation finishes.
timeout 120 "$CLIENT" --server "$URL" --state-dir "$WORK/c1" --data "$DATA" \
    --enrolment-secret "$SECRET" --ca-cert "$WORK/ca.pem" --poll-wait 2 >"$WORK/c1.log" 2>&1 ||
    fail "client with the CA: $(tail -n 5 "$WORK/c1.log")"
STATUS=$(curl -sS --max-time 10 --cacert "$WORK/ca.pem" "$URL/v1/status")
[ "$(json_field "$STATUS" state)" = finished ] || fail "not finished: $STATUS"
ROUND=$(curl -sS --max-time 10 --cacert "$WORK/ca.pem" "$URL/v1/rounds/0")
[ "$(json_field "$ROUND" participants)" = 1 ] || fail "round 0: $ROUND"
echo "PASS: TLS (CA-verified client finished; no-CA and wrong-CA clients refused)"
