"""This host's runs, from the port lock files (rig/cluster/ports.py) and their run directories:
``pdrig ps`` lists the live ones, ``pdrig clean`` removes what dead ones left behind.

A run is live while a process holds the flock of one of its port lock files (``/proc/locks``;
the kernel drops it when the run's process dies, SIGKILL included). The lock file names the
run directory and pid that wrote it; the run directory's ``plan.json`` says which instance
listens on which port.

``clean`` removes only what it can prove the rig made, and lists everything else:

- lock files nobody holds whose content is the rig's holder line
  (``run directory <dir> (pid <n>)``, rig.cluster.ports.HOLDER_LINE); an unheld ``<digits>.lock``
  with anything else in it is some other tool's, and stays;
- run directories directly under ``run_root`` that carry the rig's marker file
  (:data:`RUN_MARKER_FILE`, written by :func:`make_run_dir` when the rig creates a run directory)
  and hold no other file, only folders or sockets (an attempt that died before writing
  anything), older than ``min_age_s`` (a run that has just created its directory is left alone).
  Such a folder without the marker (an empty folder, a folder of sockets) is listed, not deleted;
  a live run's directory is never touched.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from rig.cluster.ports import LockFile, lock_files, remove_stale_locks
from rig.config import ConfigError

# Written into every run directory the rig creates (make_run_dir): what lets `pdrig clean` tell the
# rig's own empty run directories from any other folder under run_root.
RUN_MARKER_FILE = ".pdrig-run"
MARKER_TEXT = "a pdrig run directory (pdrig clean may remove it once it holds nothing else)\n"


@dataclass
class HostRun:
    """One live run: its ``run_dir``, the ``pid`` holding its locks, the ``ports`` it holds,
    ``instances`` (``name:port`` from its plan.json, [] when it has none yet) and ``age_s``
    (seconds since that process started; None when unknown)."""

    run_dir: str
    pid: int
    ports: list[int] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)
    age_s: float | None = None


def _instances(run_dir: str, ports: list[int]) -> list[str]:
    try:
        plan = json.loads((Path(run_dir) / "plan.json").read_text())
    except (OSError, ValueError):
        return []
    return [f"{p['name']}:{p['port']}" for p in plan.get("processes", []) if p.get("port") in ports]


def live_runs(lock_dir: str) -> list[HostRun] | None:
    """The live runs holding locks in ``lock_dir``, oldest first; None when the host's locks
    cannot be read (``/proc/locks``)."""
    files = lock_files(lock_dir)
    if files is None:
        return None
    runs: dict[tuple[str, int], HostRun] = {}
    for lf in files:
        if lf.held_by is None:
            continue
        run_dir = lf.run_dir if lf.run_dir is not None and lf.pid == lf.held_by else f"(unnamed, pid {lf.held_by})"
        run = runs.setdefault((run_dir, lf.held_by), HostRun(run_dir, lf.held_by))
        run.ports.append(lf.port)
    now = time.time()
    for run in runs.values():
        run.instances = _instances(run.run_dir, run.ports)
        try:
            run.age_s = now - psutil.Process(run.pid).create_time()
        except psutil.Error:
            run.age_s = None
    return sorted(runs.values(), key=lambda r: -(r.age_s or 0))


def _age(s: float | None) -> str:
    if s is None:
        return "?"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def ps_lines(runs: list[HostRun]) -> list[str]:
    """``pdrig ps``'s output: one line per live run (age, pid, run directory, instances, ports)."""
    if not runs:
        return ["no live pdrig run on this host"]
    out = []
    for r in runs:
        inst = ", ".join(r.instances) or "no plan yet"
        out.append(f"{_age(r.age_s):>7}  pid {r.pid:<7} {r.run_dir}  instances: {inst}; ports "
                   + ",".join(map(str, sorted(r.ports))))
    return out


def make_run_dir(path: Path, field: str = "run_root") -> Path:
    """Create run directory ``path`` (and its ``logs/``) with the rig's marker file in it; never
    reuses one. Raises ConfigError naming ``field`` (where its parent came from) when it cannot be
    created: the parent is a file, not writable, or ``path`` exists already."""
    try:
        (path / "logs").mkdir(parents=True)
        (path / RUN_MARKER_FILE).write_text(MARKER_TEXT)
    except OSError as e:
        raise ConfigError(f"{field}: cannot create the run directory {path} ({e.strerror or e}); "
                          f"set {field} to a writable folder (--set {field}=DIR)") from None
    return path


def is_rig_run_dir(d: Path) -> bool:
    """True when ``d`` carries the marker :func:`make_run_dir` writes (a regular file, not a link)."""
    marker = d / RUN_MARKER_FILE
    return marker.is_file() and not marker.is_symlink()


@dataclass
class CleanResult:
    """What ``pdrig clean`` did: ``ports`` whose lock files it removed, ``dirs`` it removed, and
    what it ``kept`` (path, why) because it cannot prove the rig made it."""

    ports: list[int] = field(default_factory=list)
    dirs: list[Path] = field(default_factory=list)
    kept: list[tuple[Path, str]] = field(default_factory=list)


def _holds_nothing(d: Path) -> bool:
    """True when nothing under ``d`` but its marker is a regular file or a link (folders and
    sockets only: an attempt that died before writing anything)."""
    return not any(p.is_file() or p.is_symlink() for p in d.rglob("*") if p != d / RUN_MARKER_FILE)


def empty_run_dirs(run_root: str, keep: set[str], min_age_s: float) -> tuple[list[Path], list[tuple[Path, str]]]:
    """``(removable, kept)`` among the directories directly under ``run_root``: removable are the
    rig's own (:func:`is_rig_run_dir`) that hold nothing but their marker, folders and sockets, last
    modified more than ``min_age_s`` seconds ago, and not in ``keep`` (live runs' directories,
    resolved); kept are the empty ones it cannot prove are the rig's, with the reason."""
    root = Path(run_root)
    if not root.is_dir():
        return [], []
    now = time.time()
    out: list[Path] = []
    kept: list[tuple[Path, str]] = []
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.is_symlink() or str(d.resolve()) in keep:
            continue
        try:
            if not _holds_nothing(d) or now - d.stat().st_mtime < min_age_s:
                continue
            if not is_rig_run_dir(d):
                kept.append((d, "no pdrig run marker: not made by the rig"))
                continue
        except OSError:
            continue
        out.append(d)
    return out, kept


def clean(lock_dir: str, run_root: str, min_age_s: float = 600.0) -> CleanResult | None:
    """Remove the rig's stale lock files of ``lock_dir`` and its empty run directories under
    ``run_root`` (module docstring); None (nothing removed) when the host's locks cannot be read."""
    files: list[LockFile] | None = lock_files(lock_dir)
    if files is None:
        return None
    keep = {str(Path(lf.run_dir).resolve()) for lf in files if lf.held_by is not None and lf.run_dir}
    result = CleanResult(ports=remove_stale_locks(lock_dir))
    result.kept += [(lf.path, "not the rig's holder line") for lf in files if lf.held_by is None and lf.run_dir is None]
    result.dirs, kept = empty_run_dirs(run_root, keep, min_age_s)
    result.kept += kept
    for d in result.dirs:
        shutil.rmtree(d, ignore_errors=True)
    return result
