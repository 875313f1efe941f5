#!/usr/bin/env bash
# A Docker engine for `make e2e-docker`: use the one that runs, or install and start one, and stop
# only what this script started.
#
#   scripts/docker-engine.sh up STATE_DIR     engine reachable afterwards (exit 0) or a reason (exit 1)
#   scripts/docker-engine.sh down STATE_DIR   stop the dockerd that `up` started (by its PID), if any
#   scripts/docker-engine.sh status STATE_DIR  say whose engine is in use
#
# `up` on a host where `docker info` already answers touches nothing and records no PID, so `down`
# leaves that engine alone. Otherwise (root, Debian/Ubuntu, no systemd needed):
#  - installs Debian's docker.io, containerd, runc and iptables with apt-get when dockerd is missing;
#  - installs the Compose v2 and Buildx CLI plugins when `docker compose version` is not v2
#    (the Makefile uses `up --wait`, a v2 flag): Debian bookworm ships Compose v1 only, so the
#    `docker-compose` (2.26) and `docker-buildx` packages of Debian trixie are fetched with apt-get
#    from a private package list (the host's sources are not changed) and installed with apt-get;
#    both are static Go binaries needing libc6 >= 2.34;
#  - starts `dockerd` (overlay2, its own containerd) in the background, its output in
#    STATE_DIR/dockerd.log, its PID in STATE_DIR/dockerd.pid, and waits for `docker info`.
# `down` sends SIGTERM to that PID (dockerd stops its containers' shims and its containerd), waits
# up to DOCKERD_STOP_S (30) seconds, then SIGKILLs it, and removes the PID file.
set -euo pipefail
cmd=${1:-}; state=${2:-}
[ -n "$cmd" ] && [ -n "$state" ] || { echo "usage: $0 up|down|status STATE_DIR" >&2; exit 2; }
mkdir -p "$state"
state=$(cd "$state" && pwd)
pidfile=$state/dockerd.pid
DOCKER=${DOCKER:-docker}
TRIXIE_MIRROR=${TRIXIE_MIRROR:-http://deb.debian.org/debian}
say() { printf '[docker-engine] %s\n' "$*" >&2; }

engine_answers() { timeout 20 "$DOCKER" info >/dev/null 2>&1; }
ours() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

apt_install() {  # apt_install PKG... (root only)
  [ "$(id -u)" = 0 ] || { say "need root to install $* (or start a Docker engine yourself)"; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >"$state/apt.log" 2>&1 || {
    apt-get update -qq >>"$state/apt.log" 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >>"$state/apt.log" 2>&1
  } || { say "apt-get install $* failed: $state/apt.log"; tail -5 "$state/apt.log" >&2; exit 1; }
}

compose_v2() { "$DOCKER" compose version 2>/dev/null | grep -qE 'v?2\.'; }

install_plugins() {
  # Compose v2 + Buildx from Debian trixie, through a package list of its own (Dir::State::Lists
  # etc. in STATE_DIR): the host's apt sources and preferences are not touched.
  local d=$state/trixie
  mkdir -p "$d/lists/partial" "$d/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $TRIXIE_MIRROR trixie main" >"$d/sources.list"
  local o=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
           -o "Dir::State::Lists=$d/lists" -o "Dir::Cache::Archives=$d/archives")
  apt-get "${o[@]}" update -qq >"$state/apt-trixie.log" 2>&1 \
    && (cd "$d/archives" && apt-get "${o[@]}" download docker-compose docker-buildx >>"$state/apt-trixie.log" 2>&1) \
    || { say "could not fetch docker-compose/docker-buildx from trixie: $state/apt-trixie.log"; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$d"/archives/docker-compose_*.deb "$d"/archives/docker-buildx_*.deb \
    >>"$state/apt-trixie.log" 2>&1 || { say "installing the Compose v2/Buildx plugins failed: $state/apt-trixie.log"; exit 1; }
}

up() {
  if engine_answers && ! ours; then
    say "using the running engine ($("$DOCKER" info --format '{{.ServerVersion}}' 2>/dev/null)); nothing installed or started"
    compose_v2 || { say "this engine's client has no Compose v2 ('docker compose version'); install the compose plugin"; exit 1; }
    return 0
  fi
  if ours && engine_answers; then say "engine already started by this script (PID $(cat "$pidfile"))"; return 0; fi
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v iptables >/dev/null 2>&1; then
    say "installing docker.io containerd runc iptables (Debian packages)"
    apt_install docker.io containerd runc iptables
  fi
  compose_v2 || { say "installing the Compose v2 and Buildx CLI plugins"; install_plugins; }
  compose_v2 || { say "'docker compose version' is still not v2 after installing the plugin"; exit 1; }
  say "starting dockerd (log: $state/dockerd.log)"
  # setsid: its own session, so a Ctrl-C in the terminal reaches the rig, and the rig's trap stops dockerd.
  setsid dockerd --storage-driver=overlay2 --pidfile "$state/dockerd.own.pid" >"$state/dockerd.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  for _ in $(seq 1 120); do
    engine_answers && { say "engine ready (dockerd PID $(cat "$pidfile"))"; return 0; }
    kill -0 "$(cat "$pidfile")" 2>/dev/null || { say "dockerd exited: tail of $state/dockerd.log:"; tail -15 "$state/dockerd.log" >&2; rm -f "$pidfile"; exit 1; }
    sleep 0.5
  done
  say "dockerd did not answer within 60 s: $state/dockerd.log"; down; exit 1
}

down() {
  [ -f "$pidfile" ] || { say "no dockerd started by this script: nothing to stop"; return 0; }
  local pid; pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    say "stopping dockerd PID $pid"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 $(( ${DOCKERD_STOP_S:-30} * 2 ))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { say "dockerd $pid still alive: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
  fi
  rm -f "$pidfile"
}

status() {
  if ours; then echo "started by pdrig: dockerd PID $(cat "$pidfile")"
  elif engine_answers; then echo "external engine (not started by pdrig)"
  else echo "no engine"; fi
}

case "$cmd" in up) up ;; down) down ;; status) status ;; *) echo "unknown command $cmd" >&2; exit 2 ;; esac
