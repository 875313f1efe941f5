"""This host's runs, from the port lock files (rig/cluster/ports.py) and their run directories:
``pdrig ps`` lists the live ones, ``pdrig clean`` removes what dead ones left behind.

A run is live while a process holds the flock of one of its port lock files (``/proc/locks``;
the kernel drops it when the run's process dies, SIGKILL included). The lock file names the
run directory and pid that wrote it; the run directory's ``plan.json`` says which instance
listens on which port. What ``clean`` removes: lock files nobody holds (each an unlocked file
is free anyway; they only pile up), and run directories that hold no file at all (an attempt
that died before writing anything) and are older than ``min_age_s``, so a run that has just
created its directory and not yet written its plan is left alone. A live run's directory is
never removed.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from rig.cluster.ports import LockFile, lock_files, remove_stale_locks


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


def empty_run_dirs(run_root: str, keep: set[str], min_age_s: float) -> list[Path]:
    """Directories directly under ``run_root`` with no file anywhere inside, last modified more
    than ``min_age_s`` seconds ago, and not in ``keep`` (live runs' directories, resolved)."""
    root = Path(run_root)
    if not root.is_dir():
        return []
    now = time.time()
    out = []
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.is_symlink() or str(d.resolve()) in keep:
            continue
        try:
            if any(p.is_file() or p.is_symlink() for p in d.rglob("*")) or now - d.stat().st_mtime < min_age_s:
                continue
        except OSError:
            continue
        out.append(d)
    return out


def clean(lock_dir: str, run_root: str, min_age_s: float = 600.0) -> tuple[list[int], list[Path]] | None:
    """Remove stale lock files of ``lock_dir`` and empty run directories under ``run_root``
    (module docstring); returns (ports whose lock files went, directories removed), or None
    (nothing removed) when the host's locks cannot be read."""
    files: list[LockFile] | None = lock_files(lock_dir)
    if files is None:
        return None
    keep = {str(Path(lf.run_dir).resolve()) for lf in files if lf.held_by is not None and lf.run_dir}
    ports = remove_stale_locks(lock_dir)
    dirs = empty_run_dirs(run_root, keep, min_age_s)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return ports, dirs
