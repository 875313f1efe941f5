#!/usr/bin/env bash
# The base image `docker/Dockerfile.cpu` builds FROM, printed on stdout (the last line).
#
#   scripts/docker-base.sh [UPSTREAM_IMAGE]     (default python:3.11-slim, Dockerfile.cpu's default BASE)
#
#  1. UPSTREAM_IMAGE already in the engine: use it.
#  2. Else try `docker pull UPSTREAM_IMAGE` (bounded by BASE_PULL_TIMEOUT_S, 60): a reachable
#     registry gives the upstream image.
#  3. Else (no registry: detected by that failed pull, not guessed) make DEBIAN_BASE
#     (default pdrig-base:bookworm) from Debian's packages with mmdebstrap and `docker import`,
#     once: an existing DEBIAN_BASE is reused. It holds Debian bookworm's Python 3.11 (the version
#     of python:3.11-slim), pip, the libraries vLLM's CPU kernels and Mooncake load (libnuma,
#     libgomp, libibverbs, libnl), and this host's CA bundle (pip inside the build goes through the
#     same TLS setup as the host); pip may install into the system Python (EXTERNALLY-MANAGED
#     removed: the image is the environment). mmdebstrap is installed with apt-get if missing.
# Progress goes to stderr; exit 1 with the reason when no base can be had.
set -euo pipefail
UPSTREAM=${1:-python:3.11-slim}
DEBIAN_BASE=${DEBIAN_BASE:-pdrig-base:bookworm}
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
say() { printf '[docker-base] %s\n' "$*" >&2; }
have() { docker image inspect "$1" >/dev/null 2>&1; }

if have "$UPSTREAM"; then say "using $UPSTREAM (present)"; echo "$UPSTREAM"; exit 0; fi
if have "$DEBIAN_BASE"; then say "using $DEBIAN_BASE (made earlier from Debian packages)"; echo "$DEBIAN_BASE"; exit 0; fi
say "pulling $UPSTREAM"
if timeout "${BASE_PULL_TIMEOUT_S:-60}" docker pull -q "$UPSTREAM" >/dev/null 2>"${TMPDIR:-/tmp}/pdrig-pull.$$"; then
  rm -f "${TMPDIR:-/tmp}/pdrig-pull.$$"; say "using $UPSTREAM (pulled)"; echo "$UPSTREAM"; exit 0
fi
say "no registry: $(tail -1 "${TMPDIR:-/tmp}/pdrig-pull.$$" 2>/dev/null || echo 'pull timed out'); making $DEBIAN_BASE from Debian packages"
rm -f "${TMPDIR:-/tmp}/pdrig-pull.$$"
if ! command -v mmdebstrap >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { say "mmdebstrap is missing and not root: apt-get install mmdebstrap eatmydata"; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap eatmydata >&2 \
    || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap eatmydata >&2; } \
    || { say "could not install mmdebstrap"; exit 1; }
fi
[ -f "$CA_BUNDLE" ] || { say "CA_BUNDLE $CA_BUNDLE not found"; exit 1; }
hooks=()
if [ -d /usr/share/mmdebstrap/hooks/eatmydata ] && command -v eatmydata >/dev/null 2>&1; then
  hooks=(--hook-dir=/usr/share/mmdebstrap/hooks/eatmydata)  # no fsync while unpacking: ~2x faster
fi
start=$(date +%s)
mmdebstrap --variant=minbase --quiet "${hooks[@]}" \
  --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates,libnuma1,libgomp1,libibverbs1,libnl-3-200,libnl-route-3-200 \
  --customize-hook="upload $CA_BUNDLE /etc/ssl/certs/ca-certificates.crt" \
  --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  "$SUITE" - "$MIRROR" \
  | docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$DEBIAN_BASE" >/dev/null
say "made $DEBIAN_BASE in $(( $(date +%s) - start )) s ($(docker image inspect -f '{{.Size}}' "$DEBIAN_BASE" | awk '{printf "%.0f MB", $1/1e6}'))"
echo "$DEBIAN_BASE"
