#!/bin/sh
# Container entry point.
#   server ARGS...  strata-server ARGS (with $STRATA_TLS_CERT and
#                   $STRATA_TLS_KEY: --tls-cert and --tls-key)
#   client ARGS...  strata-client ARGS, in a state directory of its own: the
#                   first free "replica-K" folder of $STRATA_CLIENT_STATE
#                   (default /client-state, a volume all replicas of the
#                   service share). A replica holds a lock on its folder
#                   while it runs, so two never share one; a replica that is
#                   recreated finds its folder free again and resumes that
#                   identity, data share and residuals instead of
#                   registering anew. $STRATA_CA_CERT adds --ca-cert,
#                   $STRATA_SERVER_URL overrides --server.
#   report ARGS...  strata-sim --report-from ARGS (the run's report)
#   health [URL]    exits 0 when the coordinator's /healthz answers
#                   (default http://127.0.0.1:8080/healthz; trusts
#                   $STRATA_CA_CERT when set), or, for a client, when it
#                   holds a folder and has registered
#   tool ARGS...    strata-tool ARGS
# Secrets come from files (--enrolment-secret-file), never from the
# environment or the command line.
set -eu
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
server)
    if [ -n "${STRATA_TLS_CERT:-}" ]; then
        set -- "$@" --tls-cert "$STRATA_TLS_CERT" --tls-key "${STRATA_TLS_KEY:?STRATA_TLS_KEY}"
    fi
    exec strata-server "$@"
    ;;
client)
    base=${STRATA_CLIENT_STATE:-/client-state}
    k=0
    while :; do
        dir="$base/replica-$k"
        mkdir -p "$dir"
        chmod 0700 "$dir"
        exec 9>>"$dir/.lock"
        if flock -n 9; then
            break
        fi
        exec 9>&-
        k=$((k + 1))
        if [ "$k" -ge 10000 ]; then
            echo "strata-entrypoint: no free client state folder in $base" >&2
            exit 1
        fi
    done
    echo "$dir" >/tmp/strata-client-state
    echo "strata-entrypoint: client state in $dir"
    if [ -n "${STRATA_CA_CERT:-}" ]; then
        set -- "$@" --ca-cert "$STRATA_CA_CERT"
    fi
    if [ -n "${STRATA_SERVER_URL:-}" ]; then
        set -- "$@" --server "$STRATA_SERVER_URL" # the last --server wins
    fi
    # The lock stays with descriptor 9, which strata-client inherits.
    exec strata-client --state-dir "$dir" "$@"
    ;;
report)
    exec strata-sim --report-from "$@"
    ;;
health)
    if [ -f /tmp/strata-client-state ]; then
        test -s "$(cat /tmp/strata-client-state)/identity.json"
        exit $?
    fi
    url=${1:-${STRATA_HEALTH_URL:-http://127.0.0.1:8080/healthz}}
    if [ -n "${STRATA_CA_CERT:-}" ]; then
        exec curl -fsS --max-time 5 --cacert "$STRATA_CA_CERT" -o /dev/null "$url"
    fi
    exec curl -fsS --max-time 5 -o /dev/null "$url"
    ;;
tool)
    exec strata-tool "$@"
    ;;
*)
    echo "usage: (server|client|report|health|tool) ARGS...   (see strata-server --help, strata-client --help)"
    exit 0
    ;;
esac
