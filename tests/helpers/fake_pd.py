"""A fake prefill (kv_producer) and decode (kv_consumer) vLLM server pair on free ports, as
Endpoints, for the tests that drive the wave engine, the transport and waves against them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from rig.transport.endpoint import Endpoint

FAKE = Path(__file__).resolve().parents[1] / "fake_vllm.py"

MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(role: str, port: int, env: dict[str, str], blocks: int, block_size: int, max_model_len: int,
           log: Path | None) -> subprocess.Popen:
    kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": role})
    argv = [sys.executable, str(FAKE), "--model", MODEL, "--served-model-name", MODEL, "--port", str(port),
            "--block-size", str(block_size), "--max-model-len", str(max_model_len),
            "--num-gpu-blocks-override", str(blocks), "--kv-transfer-config", kv]
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - the server writes to it
    try:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        if log:
            out.close()


@contextmanager
def fake_pd(p_env: dict[str, str] | None = None, d_env: dict[str, str] | None = None, *, p_blocks: int = 1000,
            d_blocks: int = 1000, block_size: int = 16, max_model_len: int = 2048, token_latency: float = 0.0,
            log_dir: Path | None = None):
    """A fake P (kv_producer) and D (kv_consumer) on free ports; yields (P, D) Endpoints and
    stops both (only the processes started here) on exit."""
    base = {**os.environ, "FAKE_VLLM_STARTUP_DELAY": "0", "FAKE_VLLM_TOKEN_LATENCY": str(token_latency)}
    for k in ("FAKE_VLLM_FAULT", "FAKE_VLLM_FAULT_ARG"):
        base.pop(k, None)
    procs: list[subprocess.Popen] = []
    eps = []
    try:
        for name, role, extra, blocks in (("prefill", "kv_producer", p_env, p_blocks),
                                          ("decode", "kv_consumer", d_env, d_blocks)):
            port = free_port()
            env = {**base, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()), **(extra or {})}
            procs.append(_spawn(role, port, env, blocks, block_size, max_model_len,
                                log_dir / f"{name}.log" if log_dir else None))
            eps.append(Endpoint(name, f"http://127.0.0.1:{port}"))
        deadline = time.monotonic() + 20
        for ep, pr in zip(eps, procs, strict=True):
            while True:
                assert pr.poll() is None, f"fake {ep.name} exited with {pr.returncode}"
                try:
                    if httpx.get(ep.url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"fake {ep.name} not ready"
                time.sleep(0.05)
        yield eps[0], eps[1]
    finally:
        for pr in procs:
            pr.terminate()
        for pr in procs:
            try:
                pr.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pr.kill()
                pr.wait()

