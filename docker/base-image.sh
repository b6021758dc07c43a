#!/usr/bin/env bash
# Builds a Debian 12 (bookworm) base image for docker/Dockerfile without a
# container registry: debootstrap into a temporary folder from Debian's
# package archive, with every package the Dockerfile's build and runtime
# stages need already installed, then `docker import`. Prints the image's
# tag on stdout (everything else goes to stderr).
#
# The tag carries a hash of the package list, the suite and this script's
# recipe version, so a second call with the same list finds the image and
# returns at once: debootstrap runs once per machine and package list.
#
#   docker/base-image.sh                 # -> strata-base:bookworm-<hash>
#   docker build -f docker/Dockerfile --build-arg BASE_IMAGE=$(docker/base-image.sh) \
#       --build-arg RUNTIME_IMAGE=$(docker/base-image.sh) -t strata:latest .
#
# Environment: STRATA_DEBIAN_MIRROR (default http://deb.debian.org/debian).
# Needs root (debootstrap), debootstrap and a Docker engine.
set -euo pipefail

SUITE=bookworm
RECIPE=1 # bump when the recipe below changes what the image holds
MIRROR=${STRATA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The Dockerfile's build stage and runtime stage, together (keep in step
# with the apt-get lines there).
PACKAGES=(
    build-essential cmake pkg-config
    libmicrohttpd-dev libcurl4-openssl-dev libjansson-dev libzstd-dev
    libopenblas-openmp-dev libdnnl-dev libsqlite3-dev libpq-dev zlib1g-dev libcunit1-dev
    libmicrohttpd12 libcurl4 libjansson4 libzstd1 libopenblas0-openmp libdnnl2 libsqlite3-0 libpq5
    zlib1g libgomp1 ca-certificates curl
)

key=$(printf '%s\n' "$SUITE" "$RECIPE" "${PACKAGES[@]}" | sha256sum | cut -c1-12)
tag="strata-base:$SUITE-$key"
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "base-image: $tag is cached" >&2
    echo "$tag"
    exit 0
fi
command -v debootstrap >/dev/null || {
    echo "base-image: debootstrap is not installed (apt-get install debootstrap)" >&2
    exit 1
}
[ "$(id -u)" -eq 0 ] || {
    echo "base-image: debootstrap needs root" >&2
    exit 1
}

root=$(mktemp -d /tmp/strata-base.XXXXXX)
cleanup() { rm -rf "$root"; }
trap cleanup EXIT
include=$(
    IFS=,
    echo "${PACKAGES[*]}"
)
echo "base-image: debootstrap $SUITE with ${#PACKAGES[@]} packages (a few minutes)" >&2
debootstrap --variant=minbase --include="$include" "$SUITE" "$root" "$MIRROR" >&2 ||
    {
        tail -n 20 "$root/debootstrap/debootstrap.log" >&2 2>/dev/null || true
        exit 1
    }
# The image's own package sources, then a slim-like clean-up: no package
# lists or caches, which the Dockerfile's apt step would refetch if needed.
cat >"$root/etc/apt/sources.list" <<EOF
deb http://deb.debian.org/debian $SUITE main
deb http://deb.debian.org/debian $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
EOF
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb \
    "$root"/usr/share/doc/* "$root"/usr/share/man/*
tar -C "$root" --numeric-owner -c . |
    docker import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$tag" >&2
echo "base-image: built $tag" >&2
echo "$tag"
