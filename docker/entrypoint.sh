#!/bin/sh
# Container entry point: "server ARGS..." runs strata-server, "client ARGS..."
# runs strata-client, "tool ARGS..." runs strata-tool, anything else prints
# help. Both roles take the federation's enrolment secret from
# STRATA_ENROLMENT_SECRET when it is set. A scaled client service gets its data share from STRATA_NUM_CLIENTS
# and STRATA_CLIENT_INDEX; without an index, one is derived from the
# container's host name (replicas of one service then get spread, not
# disjoint, shares).
set -eu
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
server)
    if [ -n "${STRATA_ENROLMENT_SECRET:-}" ]; then
        set -- --enrolment-secret "$STRATA_ENROLMENT_SECRET" "$@"
    fi
    exec strata-server "$@"
    ;;
client)
    n=${STRATA_NUM_CLIENTS:-1}
    if [ -z "${STRATA_CLIENT_INDEX:-}" ]; then
        sum=$(hostname | cksum | cut -d' ' -f1)
        STRATA_CLIENT_INDEX=$((sum % n))
    fi
    if [ -n "${STRATA_ENROLMENT_SECRET:-}" ]; then
        set -- --enrolment-secret "$STRATA_ENROLMENT_SECRET" "$@"
    fi
    exec strata-client --num-clients "$n" --client-index "$STRATA_CLIENT_INDEX" "$@"
    ;;
tool)
    exec strata-tool "$@"
    ;;
*)
    echo "usage: (server|client|tool) ARGS...   (see strata-server --help, strata-client --help)"
    exit 0
    ;;
esac
