#!/usr/bin/env bash
# test_kill_load.sh with the store in PostgreSQL and the database server as
# what goes down (STRATA_KILL_TARGET=database): at least 10 immediate
# shutdowns of a throw-away PostgreSQL 15 cluster (tests/unit/with_postgres.sh)
# under load, each followed by a start; the leading coordinator stays up,
# reconnects, and must acknowledge new uploads after each outage, and a
# following coordinator on the same store must never take the lead. The
# checks on the store are test_kill_load.sh's.
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/../unit/with_postgres.sh" bash -c \
    'STRATA_TEST_DATABASE=$STRATA_TEST_PG_URL STRATA_KILL_TARGET=database exec bash "$0" "$@"' \
    "$here/test_kill_load.sh" "$@"
