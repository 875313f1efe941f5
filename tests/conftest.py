"""Shared helpers: rig configs that launch tests/fake_vllm.py, free ports, survivor checks.

Nothing here starts a real vLLM server. Fake-server configs use ports the OS hands out (bound to
port 0 and released), so they never collide with the 8100/8200/5600 ports of live CPU runs.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_vllm.py"
DATA = ROOT / "tests" / "data"

# Test modules share helpers by module name (``from test_verdict import sc``) across the folders of
# tests/ (one per layer, fake/, live/, repo/): every folder is on sys.path, so a test file runs alone
# or in any order whichever folder holds the module it borrows from. Module names stay unique.
for _folder in sorted(p for p in Path(__file__).resolve().parent.iterdir()
                      if p.is_dir() and p.name not in ("data", "__pycache__")):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free a moment ago (bound to port 0, then released)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def fake_config(tmp: Path, *, decodes: dict[str, dict[str, Any]] | None = None,
                prefill_env: dict[str, str] | None = None, scenarios: list[dict] | None = None,
                timeouts: dict[str, float] | None = None, cache_dir: Path | None = None,
                name: str = "fake") -> dict[str, Any]:
    """A rig config (as a dict) whose instances are fake vLLM servers.

    ``decodes`` maps decode instance names to extra instance fields (e.g. ``{"env": {...}}``);
    ``tmp`` holds run_root (and cache_dir unless given), so every process the run starts has
    ``tmp`` in its argv (``--model <cache_dir>/...`` or the log path).
    """
    decodes = decodes if decodes is not None else {"decode": {}}
    ports = free_ports(2 * (1 + len(decodes)))
    prefill = {"name": "prefill", "port": ports[0], "side_channel_port": ports[1],
               "num_gpu_blocks_override": 64, "env": dict(prefill_env or {})}
    dec = []
    for i, (dname, extra) in enumerate(decodes.items()):
        dec.append({"name": dname, "port": ports[2 + 2 * i], "side_channel_port": ports[3 + 2 * i],
                    "num_gpu_blocks_override": 16, **extra})
    t = {"startup_s": 30, "request_s": 20, "stall_window_s": 2, "metrics_interval_s": 0.2,
         "drain_s": 5, "shutdown_grace_s": 3}
    t.update(timeouts or {})
    return {
        "name": name,
        "device": "cpu",
        "model": {"source": "tiny", "served_name": "tiny"},
        "block_size": 32,
        "max_model_len": 128,
        "launch": {"command": ["{python}", str(FAKE)], "nice": 0,
                   "env": {"FAKE_VLLM_STARTUP_DELAY": "0.3"}},
        "prefill": [prefill],
        "decode": dec,
        "timeouts": t,
        "scenarios": scenarios if scenarios is not None else [],
        "run_root": str(tmp / "runs"),
        "cache_dir": str(cache_dir or (tmp / "cache")),
        # OS-picked ports never collide with another test's; keep their lock files out of /tmp
        "ports": {"lock_dir": str(tmp / "port-locks")},
    }


def write_config(tmp: Path, data: dict[str, Any], name: str = "rig.yaml") -> Path:
    """Write ``data`` as YAML into ``tmp``; returns the path."""
    p = tmp / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def scenario(name: str, decode: str, prompt_tokens: int = 40, max_tokens: int = 4,
             **extra: Any) -> dict[str, Any]:
    """A scenario dict with exact token expectations (the fake never clamps below max_model_len)."""
    return {"name": name, "decode": decode, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
            "expect": {"completion_tokens": max_tokens, "total_tokens": prompt_tokens + max_tokens},
            **extra}


# The fake's stall has the livelock's gauges but no block arithmetic (no cache_config_info, no
# spec decode), so this signature leaves ``admission`` out.
LIVELOCK = {"id": "spec-admission-livelock", "title": "flat spec block reservation",
            "affects": ">=0.32.0,<0.33",
            "symptom": {"kind": "stall", "instance": "decode", "waiting_reason": "capacity",
                        "kv_fetch_stage": "waiting_to_start", "kv_usage_max": 0.05}}


def processes_mentioning(text: str) -> dict[int, str]:
    """``{pid: cmdline}`` of live (non-zombie) processes whose cmdline contains ``text``,
    other than this test process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            out[int(entry)] = cmd.strip()
    return out


def wait_no_survivors(text: str, within_s: float) -> dict[int, str]:
    """Wait up to ``within_s`` for every process mentioning ``text`` to be gone; return the rest."""
    deadline = time.monotonic() + within_s
    while True:
        left = processes_mentioning(text)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def kill_pids(pids) -> None:
    """SIGKILL leftover processes of a failed test by PID (never by name)."""
    for pid in pids:
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture()
def restore_signals():
    """cli.main installs SIGINT/SIGTERM/SIGHUP handlers; give pytest its own back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.fixture()
def fake_servers_dir(tmp_path) -> Path:
    """Per-test directory for fake-server configs and runs; after the test no process mentioning
    it may survive (leftovers are killed by PID, then the test fails)."""
    yield tmp_path
    assert_no_survivors(tmp_path, within_s=10)


def assert_no_survivors(path: Path, within_s: float) -> None:
    """Fail the test if a process mentioning ``path`` is still alive ``within_s`` seconds after
    it ended (leftovers are killed by PID first, so one leak does not spill into other tests)."""
    left = wait_no_survivors(str(path), within_s=within_s)
    kill_pids(left)
    assert left == {}, f"servers survived the test: {left}"


def run_on_fakes(tmp_path: Path, scenarios: list[dict], decodes: dict[str, dict[str, Any]] | None = None,
                 overrides: list[str] | None = None) -> tuple[Any, Path]:
    """Run scenario dicts ``scenarios`` on fake P and D (``decodes`` as in :func:`fake_config`,
    ``overrides`` as ``--set``); returns (result, run dir) and asserts nothing was left running."""
    from rig.config import load_config
    from rig.run.runner import SuiteRunner, new_run_dir

    cfg = load_config(write_config(tmp_path, fake_config(tmp_path, decodes=decodes, scenarios=scenarios)),
                      overrides or [])
    run_dir = new_run_dir(cfg)
    try:
        result = SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True).run()
    finally:
        left = wait_no_survivors(str(tmp_path), within_s=10)
        kill_pids(left)
    assert left == {}, f"fake servers survived: {left}"
    return result, run_dir


@pytest.fixture(autouse=True)
def _idle_host_for_fakes(request, monkeypatch):
    """Fake-server and recorded tests judge stalls as on an idle host: the stall evidence reads the
    host's load average (rig.cluster.proctree.host_load), and on a host at load 50 a fake's spinning
    EngineCore may get too little CPU to count as stepping, which would make their verdicts depend
    on other people's work. Live tests (marker ``e2e``) keep the real load; a test that needs a load
    patches it itself (tests/observe/test_stall_evidence.py)."""
    if request.node.get_closest_marker("e2e") is None:
        from rig.cluster import proctree

        monkeypatch.setattr(proctree, "host_load", lambda: (0.0, 0.0, 0.0))
    yield


def run_fake_suite(tmp: Path, overrides: list[str] | tuple[str, ...] = (), **cfg_kw: Any):
    """Run every scenario of a fake-server config written under ``tmp`` (``cfg_kw`` go to
    :func:`fake_config`, ``overrides`` are ``--set`` strings) with the suite runner, quietly.
    Returns ``(RunResult, run_dir)``."""
    from rig.config import load_config
    from rig.run.runner import SuiteRunner, new_run_dir

    tmp.mkdir(parents=True, exist_ok=True)
    cfg = load_config(write_config(tmp, fake_config(tmp, **cfg_kw)), list(overrides))
    run_dir = new_run_dir(cfg)
    return SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True).run(), run_dir


def fake_suite_fixtures(dirname: str, *, suite_of=None, overrides: list[str] | tuple[str, ...] = (),
                        **cfg_kw: Any):
    """The module fixtures of a test file that judges one fake-server suite run:

    - ``base_dir`` (module): a fresh directory ``dirname``-N holding every config, run and model
      cache of the module, so every fake server the module starts has it in its argv;
    - ``no_survivors`` (autouse): after each test no process mentioning ``base_dir`` may be alive
      (leftovers are killed by PID, then the test fails);
    - ``suite`` (module): :func:`run_fake_suite` of ``cfg_kw`` and ``overrides`` under
      ``base_dir/suite``, run once for the module; ``suite_of(result, run_dir)`` reshapes it.

    Use: ``base_dir, no_survivors, suite = fake_suite_fixtures("fake-x", decodes=..., scenarios=...)``.
    """
    @pytest.fixture(scope="module", name="base_dir")
    def base_dir_(tmp_path_factory) -> Path:
        return tmp_path_factory.mktemp(dirname)

    @pytest.fixture(autouse=True, name="no_survivors")
    def no_survivors_(base_dir):
        yield
        assert_no_survivors(base_dir, within_s=10)

    @pytest.fixture(scope="module", name="suite")
    def suite_(base_dir):
        result, run_dir = run_fake_suite(base_dir / "suite", overrides, **cfg_kw)
        return suite_of(result, run_dir) if suite_of else (result, run_dir)

    return base_dir_, no_survivors_, suite_
