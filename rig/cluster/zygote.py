"""The zygote layout's fork server: one process imports torch and vLLM once, then forks each server.

A CPU ``vllm serve`` spends its first ~9 s (8 CPU-s) importing torch, transformers and vLLM before
it parses an argument (``python -X importtime``; docs/measurements.md). With ``launch.layout:
zygote`` the local backend (rig.cluster.backends.local) starts this module once per deployment:
it imports the server's modules (:data:`VLLM_PRELOAD` and the ``-m`` module of the argv), then
for each instance forks a child that becomes exactly what ``Popen(argv, env=...)`` would have
started, minus the imports: its own session and process group (pgid == pid, so the rig's
``killpg`` SIGSTOP / SIGTERM / SIGKILL reach it and the EngineCore it spawns), stdin from
``/dev/null``, stdout and stderr appended to the instance's log, the instance's environment,
``sys.argv`` and CPU affinity, then the argv's module (``runpy``, as ``python -m``) or script.

What a fork keeps from the zygote, and why it is safe here (checked, docs/measurements.md):

- **threads**: only the main thread is forked. After the imports the zygote has two native
  threads more, both OpenBLAS thread servers (numpy's and OpenCV's), which re-create themselves
  after a fork (OpenBLAS's ``pthread_atfork`` handlers); no OpenMP pool exists (libgomp starts
  its threads at the first parallel region; no torch op runs in the zygote). The zygote starts
  no Python thread: its loop is ``select`` and ``waitpid``.
- **environment read at import**: vllm/envs.py reads lazily (module ``__getattr__``), but other
  modules read variables at import (huggingface_hub's ``HF_HUB_OFFLINE``, the platform's
  ``VLLM_TARGET_DEVICE``). The zygote records every key read through ``os.environ`` while it
  imports (:data:`READY` line's ``env_read``); :meth:`Zygote.spawn` refuses an instance whose
  environment gives one of those keys (or one the interpreter or a native library reads at
  start, :data:`START_ENV`) another value than the zygote had. The backend starts the zygote
  with what every instance's environment shares, so only per-instance keys (the NIXL side
  channel port, the store's files) differ, and vLLM reads those later, in EngineCore.
- **vLLM's own processes**: the OpenAI server still spawns its EngineCore (vLLM's CPU platform
  forces ``VLLM_WORKER_MULTIPROC_METHOD=spawn``, vllm/platforms/cpu.py
  ``check_and_update_config``), a fresh interpreter that imports everything again; the zygote
  saves the API server's imports, not EngineCore's.

Protocol (one JSON object a line): the zygote writes ``{"ready": PID, "env_read": [...],
"threads": N}`` once imported; the client writes ``{"argv", "env", "log", "cpus", "cwd",
"first_line"}`` (``first_line``: written to the log first, ``{pid}`` replaced by the child's) and
reads ``{"pid": N}`` (or ``{"error": "..."}``); the zygote writes ``{"exit": PID, "code": C}``
when a child ends (``C`` as ``Popen.returncode``: negative = killed by that signal). At EOF on its
stdin (the rig closed it or died) the zygote SIGTERMs, then SIGKILLs, every child's group still
alive and exits; the rig's reaper (rig.cluster.reaper) holds the zygote's and every child's group
too. Stdlib only: the zygote runs under a build's interpreter, where the rig is not importable.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

# What `vllm serve` (python -m vllm.entrypoints.openai.api_server) imports before it parses its
# arguments, beyond the module itself: the lazy imports of its main()
# (vllm/entrypoints/launchers/api_server/entry.py). One that does not exist (another vLLM) is skipped.
VLLM_PRELOAD = ("uvloop", "vllm.entrypoints.serve.utils.api_utils", "vllm.utils.argparse_utils",
                "vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.launchers.api_server.entry")
# Read when the interpreter or a native library starts, before any import the zygote could watch:
# an instance may not change them (its fork would not see the change).
START_ENV_PREFIXES = ("PYTHON", "LD_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "MALLOC_")
READY = "ready"
_SENTINEL = "PDRIG_ZYGOTE_SENTINEL"  # in the zygote's environment while it imports, read by no one by name


def main(argv: list[str] | None = None) -> int:
    """``python rig/cluster/zygote.py [--preload a,b] [--label TEXT]``: import, then serve (module
    docstring). ``--label`` only shows in ``ps``: the children keep the zygote's command line, so
    the run directory there finds them as it finds the run's other processes."""
    args = list(sys.argv[1:] if argv is None else argv)
    preload: list[str] = []
    while args[:1] in (["--preload"], ["--label"]):
        if args[0] == "--preload":
            preload = [m for m in args[1].split(",") if m]
        args = args[2:]
    # Run by path, sys.path[0] is this file's folder: drop it, so `python -m` runs find what they
    # would from the working directory (runpy puts the cwd first for -m, as the interpreter does).
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path[0] = os.getcwd()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the rig's; EOF ends the zygote
    read = _import_watching_env(preload + args)
    _send({READY: os.getpid(), "env_read": sorted(read), "threads": len(os.listdir("/proc/self/task"))})
    return _serve()


def _import_watching_env(modules: Iterable[str]) -> set[str]:
    """Import ``modules`` (one that is missing is skipped, on stderr), recording every key read
    by name through ``os.environ`` (``[]``, ``get``, ``in``, ``os.getenv``) meanwhile.

    Reads that walk the whole environment (``items()``, ``copy()``, ``dict(os.environ)``:
    tqdm's and networkx's prefix scans, platform's subprocess environment, seen with vLLM 0.32.0)
    name every key; they are told apart by a sentinel key nobody reads by name: a place in the
    code (caller's code object and line) that read the sentinel walks, and its reads do not count."""
    sites: dict[str, set[tuple]] = {}
    base = type(os.environ)

    def note(key: object) -> None:
        if isinstance(key, str):
            caller = sys._getframe(2)
            sites.setdefault(key, set()).add((caller.f_code, caller.f_lineno))

    class Watching(base):  # type: ignore[misc,valid-type]
        def __getitem__(self, key):
            note(key)
            return base.__getitem__(self, key)

        def __contains__(self, key):
            note(key)
            return base.__contains__(self, key)

    os.environ[_SENTINEL] = "1"
    os.environ.__class__ = Watching
    try:
        for mod in modules:
            try:
                __import__(mod)
            except ImportError as e:
                print(f"zygote: {mod} not preloaded: {e}", file=sys.stderr, flush=True)
    finally:
        os.environ.__class__ = base
        os.environ.pop(_SENTINEL, None)
    walks = sites.pop(_SENTINEL, set())
    return {key for key, at in sites.items() if at - walks}


def _send(msg: dict) -> None:
    os.write(1, (json.dumps(msg) + "\n").encode())


def _serve() -> int:
    """Fork a child per request line on stdin, report each child's exit; at EOF stop them all."""
    children: set[int] = set()
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.1)
        _reap(children)
        if not ready:
            continue
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                pid = _fork(json.loads(line))
            except Exception as e:  # a bad request is answered, never the end of the zygote
                _send({"error": f"{type(e).__name__}: {e}"})
                continue
            children.add(pid)
            _send({"pid": pid})
    stop_groups(children, grace_s=10.0, reap=lambda: _reap(children))
    return 0


def _reap(children: set[int]) -> None:
    """Report every child that ended (without blocking)."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def stop_groups(pgids: set[int], grace_s: float, reap: Callable[[], object]) -> None:
    """SIGTERM (and SIGCONT, for a frozen one) each group, SIGKILL what is left after ``grace_s``
    (rig.cluster.reaper.kill_groups's rule; repeated here because the zygote imports no rig module)."""
    for pg in list(pgids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pg, signal.SIGTERM)
            os.killpg(pg, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    while pgids and time.monotonic() < deadline:
        reap()
        time.sleep(0.1)
    for pg in list(pgids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pg, signal.SIGKILL)
    end = time.monotonic() + 5
    while pgids and time.monotonic() < end:
        reap()
        time.sleep(0.05)


def _fork(req: dict) -> int:
    """Fork one child for ``req``; in the child, never return (``os._exit`` with the run's code)."""
    argv = [str(a) for a in req["argv"]]
    if len(argv) < 2 or (argv[1] == "-m" and len(argv) < 3):
        raise ValueError(f"argv {argv!r} is neither PYTHON -m MODULE ... nor PYTHON SCRIPT ...")
    log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.fork()
    if pid:
        os.close(log)
        return pid
    code = 1
    try:
        os.setsid()  # its own session and group: pgid == pid, as Popen(start_new_session=True)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the zygote's request pipe is closed in the child by these dup2s
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        if req.get("first_line"):  # the rig's start marker, before anything the program writes
            os.write(1, req["first_line"].replace("{pid}", str(os.getpid())).encode())
        code = _become(argv, req["env"], req.get("cpus") or (), req.get("cwd"), req.get("hooks") or ())
        _finalize()
    except BaseException:  # noqa: BLE001 - a child must end by os._exit, whatever happened
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    raise AssertionError("unreachable")


def _finalize() -> None:
    """What the interpreter does at a normal exit before the process ends, which ``os._exit``
    skips: join the non-daemon threads, run the ``atexit`` handlers (vLLM's engine-client
    shutdown among them)."""
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()


def _become(argv: list[str], env: dict[str, str], cpus: Iterable[int], cwd: str | None,
            hooks: Iterable[str] = ()) -> int:
    """In the child: the instance's signals, environment, CPUs and argv, the ``hooks`` (Python
    files run first), then its program; returns its exit code as the interpreter would
    (``sys.exit`` codes, 1 after an uncaught exception)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if cwd:
        os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if cpus:
        os.sched_setaffinity(0, set(cpus))
    try:
        for hook in hooks:
            runpy.run_path(hook, run_name="__zygote_hook__")
        if argv[1] == "-m":
            # Preloaded, the module is in sys.modules; under -m it is only __main__ (and runpy
            # warns of a module found before its execution): run it fresh, its imports cached.
            sys.modules.pop(argv[2], None)
            sys.argv = [argv[2], *argv[3:]]  # runpy sets argv[0] to the module's file, as -m does
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv[1:]
            sys.path[0] = str(Path(argv[1]).resolve().parent)  # as `python SCRIPT` does
            runpy.run_path(argv[1], run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


# ------------------------------------------------------------------ the rig's side


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class ZygoteError(RuntimeError):
    """The zygote could not start, died, or refused an instance (the backend raises ClusterError)."""


class ForkedChild:
    """A child of the zygote as the rig holds it: ``Popen``'s ``pid``, ``returncode``, ``poll``
    and ``wait``, the code read from the zygote's ``exit`` line (the rig is not its parent and
    cannot ``waitpid`` it). A child whose zygote died without reporting it is gone with code -1
    (the Backend protocol's "gone, code unknown") once its group is empty."""

    def __init__(self, pid: int, zygote_alive: Callable[[], bool]):
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()
        self._zygote_alive = zygote_alive

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        """None while it runs, else its exit code."""
        if self.returncode is None and not self._zygote_alive() and not _group_alive(self.pid):
            self._end(-1)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; raises subprocess.TimeoutExpired after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None and not self._ended.wait(0.1):
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class Zygote:
    """Start the fork server and ask it for children (the module docstring's protocol).

    ``python`` runs ``rig/cluster/zygote.py`` by path with ``env`` (the environment every child
    shares; the run's marker included, so /proc shows it in every child: a fork keeps the exec'd
    environment block), stderr appended to ``log_path``, in a session of its own (pgid == pid).
    ``preload``: modules imported once, e.g. :data:`VLLM_PRELOAD` and the ``-m`` module;
    ``label``: put on its command line (default ``log_path``), which every child keeps.
    """

    def __init__(self, python: str, preload: Iterable[str], env: dict[str, str], log_path: str | Path,
                 label: str = ""):
        self.env = dict(env)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([python, str(Path(__file__).resolve()), "--preload", ",".join(preload),
                                          "--label", label or str(log_path)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=self.env,
                                         start_new_session=True)
        self.log_path = str(log_path)
        self.env_read: set[str] = set()
        self.threads: int | None = None
        self._ready = threading.Event()
        self._replies: list[dict] = []
        self._reply = threading.Condition()
        self._children: dict[int, ForkedChild] = {}
        self._early_exits: dict[int, int] = {}
        self._lock = threading.Lock()  # one request at a time
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        """The zygote's PID (its group's id)."""
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            msg = json.loads(raw)
            if READY in msg:
                self.env_read, self.threads = set(msg["env_read"]), msg["threads"]
                self._ready.set()
            elif "exit" in msg:
                with self._reply:
                    child = self._children.get(msg["exit"])
                    if child is None:  # ended before its pid reply was handled
                        self._early_exits[msg["exit"]] = msg["code"]
                    else:
                        child._end(msg["code"])
            else:
                with self._reply:
                    self._replies.append(msg)
                    self._reply.notify_all()
        with self._reply:  # the zygote is gone: its children's codes will never come
            self._reply.notify_all()
        self._ready.set()

    def wait_ready(self, timeout_s: float) -> float:
        """Block until the zygote has imported (seconds waited); raises ZygoteError when it exits
        first or is not ready within ``timeout_s``."""
        t0 = time.monotonic()
        if not self._ready.wait(timeout_s):
            raise ZygoteError(f"the zygote did not finish its imports within {timeout_s:.0f} s (see {self.log_path})")
        if self.threads is None:
            raise ZygoteError(f"the zygote exited with {self.proc.wait()} before it was ready (see {self.log_path})")
        return time.monotonic() - t0

    def refused_keys(self, env: dict[str, str]) -> list[str]:
        """The keys of ``env`` that differ from the zygote's and that a fork cannot change: read at
        the zygote's imports (``env_read``) or at an interpreter's start (:data:`START_ENV_PREFIXES`)."""
        changed = {k for k in set(env) | set(self.env) if env.get(k) != self.env.get(k)}
        return sorted(k for k in changed if k in self.env_read or k.startswith(START_ENV_PREFIXES))

    def spawn(self, argv: list[str], env: dict[str, str], log_path: str, cpus: Iterable[int] = (),
              first_line: str = "", hooks: Iterable[str] = (), timeout_s: float = 1200.0) -> ForkedChild:
        """Fork one child running ``argv`` (``PYTHON -m MODULE ...`` or ``PYTHON SCRIPT ...``) with
        exactly ``env``, its output appended to ``log_path`` after ``first_line`` (``{pid}`` = its PID),
        on ``cpus`` (() = the zygote's).
        Waits for the zygote's imports first (up to ``timeout_s``). Raises ZygoteError when
        ``env`` changes a key the fork cannot (:meth:`refused_keys`), or when the zygote refuses or
        is gone."""
        self.wait_ready(timeout_s)
        bad = self.refused_keys(env)
        if bad:
            raise ZygoteError(f"the zygote cannot give this instance its own {', '.join(bad)}: read when the "
                              "zygote started or imported; use launch.layout fast, or the same value for "
                              "every instance")
        req = {"argv": list(argv), "env": env, "log": log_path, "cpus": sorted(cpus), "cwd": os.getcwd(),
               "first_line": first_line, "hooks": list(hooks)}
        with self._lock:
            with self._reply:
                self._replies.clear()
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write((json.dumps(req) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError) as e:
                raise ZygoteError(f"the zygote is gone (exit {self.proc.poll()}); see {self.log_path}") from e
            with self._reply:
                if not self._reply.wait_for(lambda: self._replies or not self._reader.is_alive(), 30.0):
                    raise ZygoteError("the zygote did not answer a spawn within 30 s")
                if not self._replies:
                    raise ZygoteError(f"the zygote died (exit {self.proc.poll()}); see {self.log_path}")
                msg = self._replies.pop(0)
                if "error" in msg:
                    raise ZygoteError(f"the zygote refused {argv[:3]}: {msg['error']}")
                child = self._children[msg["pid"]] = ForkedChild(msg["pid"], lambda: self.proc.poll() is None)
                if msg["pid"] in self._early_exits:
                    child._end(self._early_exits.pop(msg["pid"]))
        return child

    def close(self, grace_s: float = 10.0) -> int | None:
        """Close the request pipe: the zygote stops its live children (SIGTERM, SIGKILL after its
        own 10 s) and exits; its group is SIGKILLed after ``grace_s`` + 15 s if it has not.
        Returns its exit code (None if it had to be killed and did not end)."""
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=grace_s + 15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        self._reader.join(timeout=5)
        return self.proc.returncode


if __name__ == "__main__":
    sys.exit(main())
