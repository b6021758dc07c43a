#!/usr/bin/env bash
# test_kill_load.sh with the coordinator's state in PostgreSQL: a throw-away
# PostgreSQL 15 cluster (tests/unit/with_postgres.sh) whose database
# `postgres` holds the store (--database), the same kills and the same
# checks, read with psql; every restart gets a new, empty state directory,
# so the coordinator resumes from the database alone.
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/../unit/with_postgres.sh" bash -c \
    'STRATA_TEST_DATABASE=$STRATA_TEST_PG_URL exec bash "$0" "$@"' "$here/test_kill_load.sh" "$@"
