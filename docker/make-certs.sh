#!/usr/bin/env bash
# Makes the certificates of docker-compose.tls.yml in docker/certs/ (or
# $STRATA_CERTS_DIR, which docker-compose.tls.yml reads too): a
# private CA (ca.pem; its key ca.key stays here) and the coordinator's
# certificate (server.pem, server.key) for the names given (default:
# coordinator, localhost, 127.0.0.1), valid for 825 days. Files the
# containers read are given to uid 10001 (the image's user) when run as
# root. Clients on other machines trust ca.pem (strata-client --ca-cert).
#   docker/make-certs.sh [NAME|IP]...
set -euo pipefail
dir=${STRATA_CERTS_DIR:-"$(cd "$(dirname "$0")" && pwd)/certs"}
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(coordinator localhost 127.0.0.1)
san=""
for n in "${names[@]}"; do
    if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then san+="IP:$n,"; else san+="DNS:$n,"; fi
done
san=${san%,}
mkdir -p "$dir"
umask 077
openssl req -x509 -newkey rsa:3072 -nodes -days 825 -subj "/CN=Strata federation CA" \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
openssl req -newkey rsa:3072 -nodes -subj "/CN=${names[0]}" \
    -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" >"$dir/server.ext"
openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 825 -extfile "$dir/server.ext" -out "$dir/server.pem" 2>/dev/null
rm -f "$dir/server.csr" "$dir/server.ext" "$dir/ca.srl"
chmod 0444 "$dir/ca.pem" "$dir/server.pem"
chmod 0400 "$dir/server.key"
if [ "$(id -u)" -eq 0 ]; then chown 10001 "$dir/server.key"; fi
echo "certificates for $san in $dir"
