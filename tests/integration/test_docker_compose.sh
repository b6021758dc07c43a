#!/usr/bin/env bash
# The federation of docker/docker-compose.yml, run for real with the Docker
# engine (skipped, exit 77, where none answers):
#  0. The base image is built locally (docker/base-image.sh: debootstrap and
#     docker import, cached by its package list) and the image is built from
#     docker/Dockerfile on it; no registry is needed.
#  1. A clean run: `compose up --scale client=5`, 5 rounds to completion;
#     the report (written by the `report` service into the coordinator's
#     volume) lists 5 clients on 5 distinct data shares.
#  2. A run with faults across containers (8 rounds): a client container is
#     frozen (docker pause) so that rounds stay open until their deadline,
#     the coordinator container is killed (SIGKILL) mid-round and started
#     again, the frozen client is thawed and rejoins; a client is
#     disconnected from the network for a while and reconnected; a client
#     container is removed and recreated (it resumes its identity and share
#     from the client-states volume: no ghost client). The run completes;
#     every receipt the clients hold is the coordinator's receipt for exactly
#     one accepted update (a re-upload of the stored payload answers it as a
#     duplicate), the receipts of each round equal its participants, and
#     nothing is counted twice.
#  3. The TLS override (docker-compose.tls.yml, certificates from
#     docker/make-certs.sh): 2 clients, 2 rounds over HTTPS; the coordinator
#     refuses plain HTTP and answers HTTPS for its CA.
# Every docker command has a timeout; a trap removes the containers,
# networks and volumes of the test's Compose projects, also on failure.
. "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
T_START=$SECONDS

skip() {
    echo "SKIP: $*"
    exit 77
}
command -v docker >/dev/null || skip "no docker command"
timeout 20 docker info >/dev/null 2>&1 || skip "no Docker engine answers"
if timeout 20 docker compose version >/dev/null 2>&1; then
    DC=(docker compose)
elif command -v docker-compose >/dev/null; then
    DC=(docker-compose)
else
    skip "neither 'docker compose' nor docker-compose is installed (scripts/setup.sh)"
fi
command -v curl >/dev/null || fail "curl is required"
IMAGE=${STRATA_TEST_IMAGE:-strata:compose-test}
COMPOSE="$root/docker/docker-compose.yml"
PROJECTS=()

cleanup() {
    local p
    for p in "${PROJECTS[@]}"; do
        COMPOSE_PROJECT_NAME=$p timeout 120 "${DC[@]}" -f "$COMPOSE" --profile report \
            down -v --remove-orphans -t 5 >/dev/null 2>&1 || true
        # (a TLS project's secrets are files of $WORK; down needs no override)
        # A container the test froze and did not thaw (it failed first).
        timeout 60 docker ps -q --filter status=paused --filter "label=com.docker.compose.project=$p" |
            xargs -r timeout 60 docker unpause >/dev/null 2>&1 || true
        # Whatever compose left (a container it no longer tracks).
        timeout 60 docker ps -aq --filter "label=com.docker.compose.project=$p" |
            xargs -r timeout 60 docker rm -f -v >/dev/null 2>&1 || true
        timeout 60 docker volume ls -q --filter "label=com.docker.compose.project=$p" |
            xargs -r timeout 60 docker volume rm >/dev/null 2>&1 || true
        timeout 60 docker network ls -q --filter "label=com.docker.compose.project=$p" |
            xargs -r timeout 60 docker network rm >/dev/null 2>&1 || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

# ---- 0. images -----------------------------------------------------------------
t0=$SECONDS
base=$(timeout 1200 bash "$root/docker/base-image.sh") || fail "cannot build the base image"
T_BASE=$((SECONDS - t0))
t0=$SECONDS
timeout 1500 docker build -q -f "$root/docker/Dockerfile" --build-arg "BASE_IMAGE=$base" \
    --build-arg "RUNTIME_IMAGE=$base" -t "$IMAGE" "$root" >"$WORK/build.log" 2>&1 ||
    fail "docker build: $(tail -n 30 "$WORK/build.log")"
T_BUILD=$((SECONDS - t0))
echo "base image $base (${T_BASE} s), image $IMAGE built in ${T_BUILD} s"

# The enrolment secret, readable by the image's user only.
printf '%s\n' "compose-$RANDOM$RANDOM$RANDOM" >"$WORK/secret"
chown 10001 "$WORK/secret" 2>/dev/null || chmod 0444 "$WORK/secret"
chmod go-w "$WORK/secret"

free_port() {
    local p
    # Below Linux's ephemeral range (32768 up), and not in use by any socket.
    for p in $(shuf -i 20000-32000 -n 50); do
        [ -n "$(ss -tanH "sport = :$p" 2>/dev/null)" ] || {
            echo "$p"
            return
        }
    done
    fail "no free port"
}

# ---- helpers for one Compose project --------------------------------------------
# start_project NAME ROUNDS DEADLINE: a new project and its exported settings.
start_project() {
    PROJECT="$1-$$-$RANDOM"
    PROJECTS+=("$PROJECT")
    export COMPOSE_PROJECT_NAME=$PROJECT STRATA_IMAGE=$IMAGE STRATA_CLIENTS=5 STRATA_ROUNDS=$2
    export STRATA_ROUND_DEADLINE=$3 STRATA_SECRET_FILE="$WORK/secret" STRATA_DATA_DIR=$DATA
    export STRATA_PORT
    STRATA_PORT=$(free_port)
    URL="http://127.0.0.1:$STRATA_PORT"
    DEADLINE=$((SECONDS + 420)) # every wait of the run also stops here
}
dc() { timeout 180 "${DC[@]}" -f "$COMPOSE" "$@"; }
dump() {
    dc logs --no-color --tail 20 >&2 2>/dev/null || true
}
die() {
    dump
    fail "$*"
}
WAIT_POLL=0.2 # wait_until (lib.sh) polls this often
C=(curl -sS --max-time 5)
round_field() { json_field "$(get "/v1/rounds/$1")" "$2"; }
ids_of() { timeout 30 docker ps -aq --no-trunc --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=$1" | sort; }
running() { [ "$(timeout 30 docker inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" = true ]; }
coordinator() { ids_of coordinator | head -n 1; }
status_is() { [ "$(json_field "$(get /v1/status)" state)" = "$1" ]; }
clients_done() { # every client container exited 0
    local c n=0
    for c in $(ids_of client); do
        [ "$(timeout 30 docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$c")" = "exited 0" ] || return 1
        n=$((n + 1))
    done
    [ "$n" -eq 5 ]
}

# finish_run: waits for the run to end, checks receipts against the
# coordinator's records, stops the coordinator and has the report written;
# the report is then $WORK/$PROJECT/report.md.
finish_run() {
    local out="$WORK/$PROJECT" rounds=$STRATA_ROUNDS
    mkdir -p "$out"
    wait_until 400 "the federation to finish" status_is finished
    wait_until 120 "every client to exit 0" clients_done
    [ "$(metric strata_rounds_completed_total)" = "$rounds" ] ||
        die "rounds completed: $(metric strata_rounds_completed_total)"
    [ "$(metric strata_registered_clients)" = 5 ] ||
        die "registered clients: $(metric strata_registered_clients) (a ghost?)"
    # The clients' state folders (one volume) and the coordinator's state
    # directory (idle now: every client has exited).
    timeout 120 docker cp "$(ids_of client | head -n 1):/client-state" "$out/cs" ||
        die "cannot copy the client states"
    timeout 120 docker cp "$(coordinator):/state" "$out/state" ||
        die "cannot copy the coordinator's state directory"
    local accepted total=0 r s n
    accepted=$(metric strata_updates_accepted_total)
    for ((r = 0; r < rounds; r++)); do
        s=$(get "/v1/rounds/$r")
        [ "$(json_field "$s" state)" = closed ] || die "round $r: $s"
        n=$(cat "$out"/cs/replica-*/receipts.log 2>/dev/null | grep -c "^$r " || true)
        [ "$n" = "$(json_field "$s" participants)" ] || die "round $r: $n receipts, $s"
        [ "$(stored_count "$out/state" "$r")" = "$n" ] || die "round $r: stored updates"
        total=$((total + n))
    done
    [ "$total" = "$accepted" ] || die "$total receipts, $accepted accepted updates"
    local dir id tok receipt body shares=""
    RECEIPTS=0
    for dir in "$out"/cs/replica-*; do
        [ -f "$dir/identity.json" ] || continue
        id=$(json_field "$(cat "$dir/identity.json")" client_id)
        tok=$(json_field "$(cat "$dir/identity.json")" token)
        shares+="$(json_field "$(cat "$dir/identity.json")" data_share) "
        while read -r r receipt; do
            stored_payload "$out/state" "$r" "$id" "$out/resend.bin" ||
                die "client $id round $r: no stored payload"
            body=$("${C[@]}" -H "Authorization: Bearer $tok" \
                -H "Content-Type: application/octet-stream" \
                --data-binary @"$out/resend.bin" "$URL/v1/rounds/$r/updates")
            [ "$(json_field "$body" receipt)" = "$receipt" ] || die "client $id round $r: $body vs $receipt"
            [ "$(json_field "$body" duplicate)" = true ] || die "client $id round $r: $body"
            RECEIPTS=$((RECEIPTS + 1))
        done <"$dir/receipts.log"
    done
    [ "$RECEIPTS" = "$accepted" ] || die "$RECEIPTS receipts checked, $accepted accepted"
    [ "$(metric strata_updates_accepted_total)" = "$accepted" ] || die "re-uploads were counted"
    [ "$(printf '%s\n' $shares | sort -n | tr '\n' ' ')" = "0 1 2 3 4 " ] ||
        die "the identities' data shares: $shares"
    ACCEPTED=$accepted
    # The report, from the stopped coordinator's volume.
    dc stop -t 20 coordinator >/dev/null 2>&1 || die "cannot stop the coordinator"
    timeout 180 "${DC[@]}" -f "$COMPOSE" --profile report run --rm report >"$out/report.log" 2>&1 ||
        die "report: $(cat "$out/report.log")"
    timeout 120 "${DC[@]}" -f "$COMPOSE" --profile report run --rm --entrypoint cat report \
        /state/report/report.md >"$out/report.md" 2>"$out/report.err" ||
        die "no report in the coordinator's volume: $(cat "$out/report.err")"
    local rows
    rows=$(grep -E '^\| [0-9]+ \| [0-9]+ \| [0-9]+ \|$' "$out/report.md" | awk -F'|' '$4 + 0 > 0 { print $3 + 0 }' | sort -n | tr '\n' ' ')
    [ "$rows" = "0 1 2 3 4 " ] || fail "report: clients with updates on shares '$rows': $(cat "$out/report.md")"
    grep -q "^| $((rounds - 1)) | " "$out/report.md" || fail "report lacks round $((rounds - 1))"
    echo "report.md of $PROJECT, clients (id | data share | accepted updates):" \
        $(grep -E '^\| [0-9]+ \| [0-9]+ \| [0-9]+ \|$' "$out/report.md" | tr -d ' ' | tr '\n' ' ')
}

# ---- 1. a clean run ---------------------------------------------------------------
start_project strata-clean 5 60
t0=$SECONDS
dc up -d --no-build --scale client=5 >"$WORK/up.log" 2>&1 || die "compose up: $(cat "$WORK/up.log")"
finish_run
T_CLEAN=$((SECONDS - t0))
echo "clean run: 5 rounds, 5 clients on shares 0-4, $ACCEPTED updates = $RECEIPTS receipts (${T_CLEAN} s)"
dc --profile report down -v -t 5 >/dev/null 2>&1 || die "compose down"

# ---- 2. faults across containers --------------------------------------------------
start_project strata-faults 8 20
t0=$SECONDS
dc up -d --no-build --scale client=5 >"$WORK/up.log" 2>&1 || die "compose up: $(cat "$WORK/up.log")"
round_open_with() { [ "$(round_field "$1" state)" = open ] && [ "$(round_field "$1" participants)" -ge "$2" ] 2>/dev/null; }
round_closed() { [ "$(round_field "$1" state)" = closed ]; }

# One client is frozen (docker pause) once round 0 has opened, so that the
# rounds it is selected for stay open until their 20 s deadline instead of
# closing within a second: the coordinator is then killed in a round that
# is surely open. It is thawed after the restart and must rejoin.
round_exists() { [ -n "$(round_field 0 state)" ]; }
wait_until 240 "round 0 to open" round_exists
FROZEN=$(ids_of client | sed -n 3p)
[ -n "$FROZEN" ] || die "fewer than 3 client containers"
timeout 30 docker pause "$FROZEN" >/dev/null || die "docker pause"

# The coordinator is killed mid-round: a round from 1 to 4 open with an
# accepted update (and so with others to come).
mid_round() {
    local r
    for r in 1 2 3 4; do
        round_open_with $r 1 && KROUND=$r && return 0
    done
    return 1
}
wait_until 240 "a round open with an accepted update" mid_round
COORD=$(coordinator)
timeout 30 docker kill -s KILL "$COORD" >/dev/null || die "docker kill"
KILLS=1
sleep 5
timeout 60 docker start "$COORD" >/dev/null || die "docker start"
wait_until 60 "the coordinator to answer again" status_is running
timeout 30 docker unpause "$FROZEN" >/dev/null || die "docker unpause"
FREEZES=1
wait_until 120 "round $KROUND to close after the restart" round_closed "$KROUND"

# A client is cut off the network for 15 s.
NET=$(timeout 30 docker network ls -q --filter "label=com.docker.compose.project=$PROJECT" | head -n 1)
NETNAME=$(timeout 30 docker network inspect -f '{{.Name}}' "$NET")
CUT=$(ids_of client | head -n 1)
timeout 30 docker network disconnect "$NETNAME" "$CUT" || die "network disconnect"
DISCONNECTS=1
sleep 15
timeout 30 docker network connect "$NETNAME" "$CUT" || die "network connect"

# Another client's container is removed and recreated.
GONE=$(ids_of client | sed -n 2p)
glog=$(timeout 30 docker logs "$GONE" 2>&1 || true)
slot=$(sed -n '/.*client state in /{s///p;q}' <<<"$glog")
cid=$(sed -n '/.*\(registered as\|resuming as\) client \([0-9]*\).*/{s//\2/p;q}' <<<"$glog")
[ -n "$slot" ] && [ -n "$cid" ] || die "client $GONE: no state folder or client id in its log"
ids_of client >"$WORK/before"
timeout 60 docker rm -f "$GONE" >/dev/null || die "docker rm"
dc up -d --no-build --no-recreate --scale client=5 >"$WORK/up2.log" 2>&1 ||
    die "compose up (recreate): $(cat "$WORK/up2.log")"
NEW=$(comm -13 "$WORK/before" <(ids_of client) | head -n 1)
[ -n "$NEW" ] || die "no new client container"
RECREATED=1
# (grep reads a captured log: with pipefail, a grep -q that stops early
# would fail the pipeline whenever docker logs is still writing)
new_log() { timeout 30 docker logs "$NEW" 2>&1 || true; }
resumed() { grep -q "resuming as client $cid\$" <<<"$(new_log)"; }
wait_until 60 "the recreated client to resume as client $cid" resumed
grep -q "client state in $slot\$" <<<"$(new_log)" || die "the recreated client took another folder"

finish_run
T_FAULTS=$((SECONDS - t0))
restarts=$(timeout 30 docker inspect -f '{{.RestartCount}}' $(ids_of client) | awk '{ n += $1 } END { print n + 0 }')
echo "fault run: 8 rounds; coordinator kills $KILLS (round $KROUND), network disconnects $DISCONNECTS," \
    "frozen clients $FREEZES, recreated containers $RECREATED, client restarts by the engine $restarts;" \
    "$RECEIPTS receipts = $ACCEPTED accepted updates, each matched once (${T_FAULTS} s)"
dc --profile report down -v -t 5 >/dev/null 2>&1 || die "compose down"

# ---- 3. TLS -------------------------------------------------------------------------
start_project strata-tls 2 60
export STRATA_CLIENTS=2 STRATA_CERTS_DIR="$WORK/certs"
t0=$SECONDS
bash "$root/docker/make-certs.sh" >/dev/null || fail "make-certs.sh"
TLS=(-f "$root/docker/docker-compose.tls.yml")
dc "${TLS[@]}" up -d --no-build --scale client=2 >"$WORK/up3.log" 2>&1 ||
    die "compose up (TLS): $(cat "$WORK/up3.log")"
C=(curl -sS --max-time 5 --cacert "$WORK/certs/ca.pem")
URL="https://127.0.0.1:$STRATA_PORT"
wait_until 240 "the TLS federation to finish" status_is finished
two_done() {
    local c n=0
    for c in $(ids_of client); do
        [ "$(timeout 30 docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$c")" = "exited 0" ] || return 1
        n=$((n + 1))
    done
    [ "$n" -eq 2 ]
}
wait_until 60 "both TLS clients to exit 0" two_done
curl -sS --max-time 5 -o /dev/null "http://127.0.0.1:$STRATA_PORT/healthz" 2>/dev/null &&
    die "the TLS coordinator answered plain HTTP"
[ "$(timeout 30 docker inspect -f '{{.State.Health.Status}}' "$(coordinator)")" = healthy ] ||
    die "the TLS coordinator is not healthy"
T_TLS=$((SECONDS - t0))
echo "TLS run: 2 clients, 2 rounds over HTTPS (${T_TLS} s)"
echo "PASS test_docker_compose ($((SECONDS - T_START)) s: base image ${T_BASE} s, build ${T_BUILD} s," \
    "clean run ${T_CLEAN} s, fault run ${T_FAULTS} s, TLS run ${T_TLS} s)"
