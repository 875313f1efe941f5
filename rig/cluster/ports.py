"""Host-wide port reservations: two runs on one host refuse at once instead of colliding late.

Checking that a port is free before launch cannot see a server of another run that has not
bound its port yet: vLLM listens on its HTTP port only after loading the model, so two runs on
one config used to start both topologies and collide minutes later (before/after in
docs/explanation/evidence.md). So a run *reserves* every TCP port it will use (HTTP, NIXL side
channels, Mooncake's master and store-client ports) before it starts anything, for its whole life:

- one lock file per port, ``<lock_dir>/<port>.lock`` (``ports.lock_dir``, default
  ``/tmp/pdrig-ports``), held with an exclusive ``flock``; the file names the holder (its run
  directory and pid), so a second run refuses naming the first's run directory;
- a lock is released when the run closes the file (:meth:`PortReservation.release`, on every
  exit path of the runner and ``pdrig up``) and, whatever happens, when its process dies: the
  kernel drops a process's flocks with its open files, SIGKILL included. The servers do not
  inherit the lock files (Python opens files non-inheritable; ``subprocess`` closes them), so a
  lock never outlives the run that took it;
- with ``ports.free: true`` the run takes free ports instead: every port of the config shifted
  by the smallest offset at which all of them can be locked and then bound (the layout, e.g.
  Mooncake's client ranges derived from ``mooncake.rpc_port``, is kept); the plan then records
  the ports really used. The locks are taken *before* the bind test and held while it runs: a
  port is chosen only while this run already holds it, so two choosers can never both take it,
  even when the first one's servers bind minutes later (vLLM listens only after loading the
  model). Testing bindability first and locking afterwards left a window in which both saw the
  port free.

Lock files stay in the directory after release (an unlocked file is free); only the lock counts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rig.cluster.probes import bindable
from rig.config import ConfigError, RigConfig
from rig.errors import ClusterError

FREE_SEARCH_STEPS = 2000  # offsets tried by ports.free before giving up


class PortConflict(ClusterError):
    """A port the run needs is reserved by another run (``holder`` names it) or is in use."""

    def __init__(self, message: str, port: int, holder: str):
        super().__init__(message)
        self.port = port
        self.holder = holder


def config_ports(cfg: RigConfig) -> dict[int, str]:
    """Every TCP port a run of ``cfg`` may bind, ``{port: label}``: each instance's HTTP port and
    NIXL side channel (RigConfig.side_channel_port) and, in store modes, Mooncake's master and
    store-client ports (RigConfig.mooncake_ports)."""
    out: dict[int, str] = {}
    for _, inst in cfg.instances():
        out.setdefault(inst.port, f"{inst.name}.port")
        out.setdefault(cfg.side_channel_port(inst), f"{inst.name} NIXL side channel")
    for label, port in cfg.mooncake_ports().items():
        out.setdefault(port, label)
    return out


class PortReservation:
    """The port locks one run holds. ``holder`` (the run directory) is written into each lock
    file so a refused run can name it. Use :meth:`acquire` once, then :meth:`release` (also a
    context manager)."""

    def __init__(self, lock_dir: str | os.PathLike[str], holder: str):
        self.lock_dir = Path(lock_dir)
        self.holder = holder
        self._fds: dict[int, int] = {}

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    @property
    def ports(self) -> list[int]:
        """The ports held now, sorted."""
        return sorted(self._fds)

    def acquire(self, ports: dict[int, str]) -> None:
        """Lock every port of ``ports`` (``{port: label}``), all or none.

        Raises PortConflict naming the port, what the config uses it for and the run that
        holds it (its run directory and pid, as written in the lock file). Raises ConfigError
        when the lock directory cannot be created or written (``ports.lock_dir``).
        """
        try:
            self.lock_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"ports.lock_dir: cannot create {str(self.lock_dir)!r} ({e}); "
                              "point it at a writable directory shared by the host's runs") from e
        try:
            for port in sorted(ports):
                holder = self._lock(port)
                if holder is not None:
                    raise PortConflict(
                        f"port {port} ({ports[port]}) is reserved by another run: {holder}. "
                        "Wait for it to end or stop it, change the ports in the config, or set "
                        "ports.free=true to take free ports", port, holder)
        except BaseException:
            self.release()
            raise

    def _lock(self, port: int) -> str | None:
        """Take the lock of ``port``; None on success, else what its file says about the holder.

        A lock taken on a file that ``pdrig clean`` unlinked meanwhile (:func:`remove_stale_locks`)
        would guard nothing: the inode locked must still be the one at the path, else retry."""
        path = self.lock_dir / f"{port}.lock"
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as e:
                raise ConfigError(f"ports.lock_dir: cannot open {path} ({e})") from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
                os.close(fd)
                return holder or "a run that has not written its name yet"
            if _same_file(fd, path):
                break
            os.close(fd)  # unlinked between open and flock: lock the new file
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"run directory {self.holder} (pid {os.getpid()})\n".encode(), 0)
        self._fds[port] = fd
        return None

    def release(self) -> None:
        """Drop every lock this reservation holds (safe to call more than once)."""
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the last descriptor releases the flock
        self._fds.clear()


def shifted(cfg: RigConfig, offset: int) -> RigConfig:
    """``cfg`` with every port field moved by ``offset`` (instances' ``port`` and explicit
    ``side_channel_port``, ``nixl.side_channel_base_port``, Mooncake's ports); the relative layout,
    hence the config's own collision checks, is unchanged. Raises ConfigError when a moved port
    passes 65535."""
    def move(inst):
        side = inst.side_channel_port
        return inst.model_copy(update={"port": inst.port + offset,
                                       "side_channel_port": None if side is None else side + offset})

    mc = cfg.mooncake
    moved = cfg.model_copy(update={
        "prefill": [move(i) for i in cfg.prefill], "decode": [move(i) for i in cfg.decode],
        "nixl": cfg.nixl.model_copy(update={"side_channel_base_port": cfg.nixl.side_channel_base_port + offset}),
        "mooncake": mc.model_copy(update={k: getattr(mc, k) + offset for k in
                                          ("rpc_port", "http_metadata_port", "metrics_port", "lookup_rpc_base_port")}),
    })
    top = max(config_ports(moved))
    if top > 65535:
        raise ConfigError(f"ports.free: ports moved by {offset} pass 65535 (up to {top})")
    return moved


def reserve(cfg: RigConfig, holder: str) -> tuple[RigConfig, PortReservation]:
    """Reserve the ports of a run of ``cfg`` (:func:`config_ports`) for ``holder`` (its run dir).

    ``ports.free`` false: exactly the config's ports, else PortConflict at once. True: the
    config with every port moved by the smallest offset >= 0 whose ports are all lockable and,
    once locked, bindable on ``launch.host``; returns that config (the caller plans with it). Raises PortConflict
    when no offset within :data:`FREE_SEARCH_STEPS` works.
    """
    res = PortReservation(cfg.ports.lock_dir, holder)
    if not cfg.ports.free:
        res.acquire(config_ports(cfg))
        return cfg, res
    for offset in range(FREE_SEARCH_STEPS):
        try:
            moved = cfg if offset == 0 else shifted(cfg, offset)
        except ConfigError:
            break  # past the top of the port range
        ports = config_ports(moved)
        try:
            res.acquire(ports)  # locked first: no other chooser can take them from here on
        except PortConflict:
            continue
        if all(bindable(p, cfg.launch.host) for p in ports):
            return moved, res
        res.release()  # bound by a process that holds no lock (another tool, a stray server)
    raise PortConflict(f"ports.free: no free set of {len(config_ports(cfg))} ports found by moving the "
                       f"config's ports up to {FREE_SEARCH_STEPS - 1} up", 0, "")


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


# What a holder writes into its lock file (PortReservation._lock).
HOLDER_LINE = re.compile(r"run directory (?P<run_dir>.*) \(pid (?P<pid>\d+)\)")


@dataclass(frozen=True)
class LockFile:
    """One ``<port>.lock`` file of a lock directory: the ``port``, its ``path``, the pid holding
    its flock now (``held_by``, from ``/proc/locks``; None: nobody, the file is stale) and what
    the file says (``run_dir``, ``pid``: the last holder's, None when unreadable)."""

    port: int
    path: Path
    held_by: int | None
    run_dir: str | None
    pid: int | None


def flock_holders() -> dict[int, int] | None:
    """``{inode: pid}`` of every flock held on this host (Linux ``/proc/locks``); None when it
    cannot be read (then nothing can be called stale)."""
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    out: dict[int, int] = {}
    for line in text.splitlines():
        f = line.split()
        # "1: FLOCK  ADVISORY  WRITE 32653 fe:00:2147098 0 EOF" (blocked waiters have "->" first)
        if len(f) >= 6 and f[1] == "FLOCK":
            with contextlib.suppress(ValueError, IndexError):
                out[int(f[5].rsplit(":", 1)[1])] = int(f[4])
    return out


def lock_files(lock_dir: str | os.PathLike[str]) -> list[LockFile] | None:
    """Every ``<port>.lock`` in ``lock_dir`` (sorted by port) with its holder; [] when the
    directory does not exist; None when ``/proc/locks`` is unreadable (holders unknown). Reads
    only: probing a lock by taking it could make a starting run refuse."""
    holders = flock_holders()
    if holders is None:
        return None
    d = Path(lock_dir)
    if not d.is_dir():
        return []
    out = []
    for path in d.glob("*.lock"):
        if not path.stem.isdigit():
            continue
        try:
            ino = path.stat().st_ino
            text = path.read_text(errors="replace")
        except OSError:
            continue  # removed meanwhile
        m = HOLDER_LINE.search(text)
        out.append(LockFile(int(path.stem), path, holders.get(ino), m["run_dir"] if m else None,
                            int(m["pid"]) if m else None))
    return sorted(out, key=lambda lf: lf.port)


def remove_stale_locks(lock_dir: str | os.PathLike[str]) -> list[int]:
    """Delete the lock files of ``lock_dir`` no process holds and that hold the rig's holder line
    (:data:`HOLDER_LINE`: an unheld ``<digits>.lock`` with anything else in it is not the rig's and
    stays); returns their ports. Each is
    unlinked while this process holds its flock, and a run that locked the old inode meanwhile
    retries on the new file (:meth:`PortReservation._lock`), so a live run's lock is never lost
    (a run locking the same port in the same instant may find it taken and refuse once).
    Nothing is removed when ``/proc/locks`` is unreadable."""
    removed = []
    for lf in lock_files(lock_dir) or []:
        if lf.held_by is not None or lf.run_dir is None:
            continue
        try:
            fd = os.open(lf.path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            mine = HOLDER_LINE.search(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
            if mine and _same_file(fd, lf.path):
                lf.path.unlink()
                removed.append(lf.port)
        except OSError:
            pass  # taken meanwhile: live after all
        finally:
            os.close(fd)
    return removed
