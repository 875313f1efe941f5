#!/usr/bin/env bash
# `make e2e-docker`: engine, image, then the suite with every vLLM instance in its own container.
#
#   CONFIG=configs/cpu-tiny.yaml scripts/e2e-docker.sh [pdrig e2e args...]
#
# 1. engine  scripts/docker-engine.sh up: the running engine, or one installed and started here;
# 2. base    scripts/docker-base.sh: the upstream base if present or pullable, else one made from
#            Debian packages (cached as an image);
# 3. image   scripts/docker-image.sh: pdrig:cpu (layers cached: seconds when nothing changed);
# 4. suite   pdrig e2e --docker: P and D in separate containers on one Compose network; the rig
#            removes its containers, network and volumes itself, whatever happens;
# then, on every exit path (Ctrl-C, a failed build): containers and networks of the rig that
# appeared during this run and survived it are reported (and fail the run), then removed; the
# dockerd started in step 1 is stopped by its PID (DOCKER_KEEP_ENGINE=1 keeps it for the next run). Each step's seconds are printed at the end and
# written to .cache/docker/timings.txt. Exit code: the suite's, else the first failing step's.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-configs/cpu-tiny.yaml}
PDRIG=${PDRIG:-.venv/bin/pdrig}
STATE=${DOCKER_STATE:-.cache/docker/engine}
timings=()
step_start=0
begin() { step_start=$(date +%s); printf '[e2e-docker] == %s\n' "$1" >&2; }
end() { timings+=("$1 $(( $(date +%s) - step_start )) s"); }

finish() {
  rc=$?
  trap - EXIT INT TERM
  # Only what appeared during this run: another run's containers on a shared engine are not ours.
  survivors=$(comm -13 <(echo "$before_c") <(docker ps -aq --no-trunc --filter label=pdrig.role 2>/dev/null | sort) || true)
  if [ -n "$survivors" ]; then
    printf '[e2e-docker] FAIL: containers of the rig survived the run: %s\n' "$(echo $survivors)" >&2
    docker rm -f $survivors >/dev/null 2>&1 || true
    [ "$rc" = 0 ] && rc=1
  fi
  networks=$(comm -13 <(echo "$before_n") <(docker network ls -q --no-trunc --filter label=com.docker.compose.network=pdrig 2>/dev/null | sort) || true)
  if [ -n "$networks" ]; then
    printf '[e2e-docker] FAIL: networks of the rig survived the run: %s\n' "$(echo $networks)" >&2
    docker network rm $networks >/dev/null 2>&1 || true
    [ "$rc" = 0 ] && rc=1
  fi
  if [ "${DOCKER_KEEP_ENGINE:-0}" != 1 ]; then scripts/docker-engine.sh down "$STATE" || true; fi
  printf '[e2e-docker] %s\n' "${timings[@]}" "exit $rc" | tee .cache/docker/timings.txt >&2
  exit "$rc"
}
mkdir -p .cache/docker
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

before_c="" before_n=""
begin engine; scripts/docker-engine.sh up "$STATE"; end engine
before_c=$(docker ps -aq --no-trunc --filter label=pdrig.role | sort)
before_n=$(docker network ls -q --no-trunc --filter label=com.docker.compose.network=pdrig | sort)
begin "base image"; base=$(BASE_PULL_TIMEOUT_S=${BASE_PULL_TIMEOUT_S:-60} scripts/docker-base.sh | tail -1); end "base image ($base)"
begin "pdrig image"; BASE=$base scripts/docker-image.sh cpu; end "pdrig image"
begin suite; rc=0; "$PDRIG" e2e --docker --config "$CONFIG" "$@" || rc=$?; end "suite (exit $rc)"
exit "$rc"
