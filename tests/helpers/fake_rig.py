"""Rig configs whose instances are fake vLLM servers (tests/fake_vllm.py), and the repository's paths.

Nothing here starts a server. Fake-server configs use ports the OS hands out (bound to port 0 and
released), so they never collide with the 8100/8200/5600 ports of live CPU runs."""

from __future__ import annotations

import socket
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]  # the repository
FAKE = ROOT / "tests" / "fake_vllm.py"
DATA = ROOT / "tests" / "data"


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

