#!/bin/sh
# strata-need PACKAGE...: installs the Debian packages named unless every
# one is installed already (as in a base image from docker/base-image.sh,
# which then needs no package archive).
set -eu
if dpkg-query -W -f='${db:Status-Abbrev}\n' "$@" >/tmp/strata-need.status 2>/dev/null &&
    ! grep -qv '^ii' /tmp/strata-need.status; then
    echo "strata-need: already installed: $*"
else
    apt-get update
    apt-get install -y --no-install-recommends "$@"
    rm -rf /var/lib/apt/lists/*
fi
rm -f /tmp/strata-need.status
