#!/usr/bin/env bash
# Installs every Debian package that Strata's build, tests and data need.
# Idempotent: does nothing when everything is already present.
# Usage: scripts/setup.sh [--bench]
#   --bench  also installs python3-torch, the PyTorch baseline of
#            scripts/bench.sh train (not needed to build or test).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  clang clang-format libclang-rt-14-dev libomp-dev
  libmicrohttpd-dev libcurl4-openssl-dev libssl-dev libjansson-dev libzstd-dev
  libopenblas0-openmp libopenblas-openmp-dev libdnnl-dev
  libsqlite3-dev sqlite3 zlib1g-dev libcunit1-dev
  libpq-dev postgresql-15 haproxy
  dataset-fashion-mnist
  curl libyaml-libyaml-perl openssl python3
)
case "${1:-}" in
  --bench) PACKAGES+=(python3-torch) ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--bench]" >&2; exit 2 ;;
esac

# The compose test (tests/integration/test_docker_compose.sh) builds its
# base image with debootstrap and needs Compose: the `docker compose` plugin
# when the engine has it, else Debian's docker-compose. Only where a Docker
# engine is installed.
if command -v docker >/dev/null 2>&1; then
  PACKAGES+=(debootstrap)
  if ! docker compose version >/dev/null 2>&1; then
    PACKAGES+=(docker-compose)
  fi
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

# Debian installs OpenBLAS's pthread variant by default; calling it from
# OpenMP regions oversubscribes. Select the OpenMP variant.
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
multi=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
for alt in "libblas.so.3-${multi}" "liblapack.so.3-${multi}" "libopenblas.so.0-${multi}"; do
  target="/usr/lib/${multi}/openblas-openmp/$(echo "$alt" | sed "s/-${multi}\$//")"
  if update-alternatives --query "$alt" >/dev/null 2>&1 && [ -e "$target" ]; then
    current=$(update-alternatives --query "$alt" | awk '/^Value:/{print $2}')
    if [ "$current" != "$target" ]; then
      SUDO=""
      if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
      $SUDO update-alternatives --set "$alt" "$target" >/dev/null
    fi
  fi
done
: "$arch"
exit 0
