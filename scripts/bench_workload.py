#!/usr/bin/env python3
"""Benchmark of the wave engine's client side (not a test): is the engine the bottleneck?

Starts a fake P and a fake D (tests/fake_vllm.py, FAKE_VLLM_TOKEN_LATENCY=0) and runs 2,048-request
waves against them with each HTTP client of rig/transport/client.py (aiohttp, httpx, fast), each
in a fresh child process so its peak RSS is its own. Reported per run:

- ``wall req/s``: P/D requests (two hops each) per second of wall time. Bounded by the fakes
  too, which are Python servers sharing the other core: a floor for the client, not its ceiling.
- ``req/CPU-s``: P/D requests per second of the client process's own CPU time
  (``time.process_time``): what the client does on one fully used core. The target is
  >= 5,000.
- ``peak RSS``: ``ru_maxrss`` of the client process (target <= 200 MB for a 2,048-request wave).

Modes: ``raw`` = the HTTP client alone, two bare aiohttp POST + read exchanges per request (the
ceiling any engine on that client has); ``engine`` = WaveEngine alone (stream never / always /
mixed); ``wave`` = the whole
pressure wave (rig.workload.waves.run_wave: 10 % cancels, 10 % parity sample, 1 s metrics
sampling, records file, timeline PNG). With two or more CPUs the client is pinned to CPU 0 and the
fakes to CPU 1. Load from other processes (e.g. live vLLM servers) lowers the wall numbers; the
load average is printed with the results.

    .venv/bin/python scripts/bench_workload.py                 # all clients, both modes
    .venv/bin/python scripts/bench_workload.py --clients aiohttp --repeats 5 --json out.json
    .venv/bin/python scripts/bench_workload.py --clients aiohttp,fast --loops uvloop --modes raw,engine,wave
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_vllm.py"
MODEL = "tiny"
TARGET_RPS, TARGET_RSS_MB = 5000, 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pin(cpu: int | None):
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def start_fakes(cpu: int | None) -> tuple[list[subprocess.Popen], str, str]:
    """A fake P (producer) and D (consumer); returns (processes, P url, D url)."""
    import httpx

    env = {**os.environ, "FAKE_VLLM_TOKEN_LATENCY": "0", "FAKE_VLLM_STARTUP_DELAY": "0"}
    env.pop("FAKE_VLLM_FAULT", None)
    procs, urls = [], []
    for role in ("kv_producer", "kv_consumer"):
        port = _free_port()
        argv = [sys.executable, str(FAKE), "--model", MODEL, "--port", str(port), "--block-size", "16",
                "--num-gpu-blocks-override", "100000", "--max-num-seqs", "1024",
                "--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": role})]
        procs.append(subprocess.Popen(argv, env={**env, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(_free_port())},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      preexec_fn=_pin(cpu)))
        urls.append(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 30
    for url in urls:
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"fake server {url} did not start")
            time.sleep(0.05)
    return procs, urls[0], urls[1]


# ------------------------------------------------------------------------------------ child


async def _child_engine(args: argparse.Namespace) -> dict:
    from rig.transport.client import make_transport
    from rig.transport.endpoint import Endpoint
    from rig.workload.engine import WaveEngine, WaveRequest
    from rig.workload.prompts import make_prompt

    p, d = Endpoint("prefill", args.p), Endpoint("decode", args.d)
    tr = make_transport(args.client, MODEL, 60.0, 2 * args.concurrency)
    eng = WaveEngine(tr, [p], [d], args.concurrency, 60.0)
    stream = {"never": lambda i: False, "always": lambda i: True, "mixed": lambda i: i % 2 == 1}[args.stream]
    reqs = [WaveRequest(i, f"b{i}", make_prompt(args.prompt_tokens, 1_000_000 + i), args.max_tokens, stream=stream(i))
            for i in range(args.requests)]
    await eng.run(reqs[:256])  # warm-up: connections, caches
    eng.counts.clear()
    cpu0, t0 = time.process_time(), time.monotonic()
    recs = await eng.run(reqs)
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    await tr.aclose()
    return {"ok": sum(r.outcome == "ok" for r in recs), "requests": len(recs), "wall_s": wall, "cpu_s": cpu}


async def _child_wave(args: argparse.Namespace) -> dict:
    import httpx

    from rig.config import ScenarioConfig
    from rig.observe.observations import SnapshotStore
    from rig.transport.endpoint import Endpoint
    from rig.workload.waves import run_wave

    p, d = Endpoint("prefill", args.p), Endpoint("decode", args.d)
    sc = ScenarioConfig.model_validate({
        "name": "bench-pressure", "kind": "pressure-wave", "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens, "seed": int(time.time()),
        "wave": {"requests": args.requests, "concurrency": args.concurrency, "cancel_fraction": 0.1,
                 "stream": args.stream, "client": args.client, "parity_fraction": 0.1}})
    with tempfile.TemporaryDirectory() as tmp:
        store = SnapshotStore(tmp)
        async with httpx.AsyncClient(timeout=10) as http:
            cpu0, t0 = time.process_time(), time.monotonic()
            res = await run_wave(sc, MODEL, [p], [d], http, store, Path(tmp) / "waves", deadline_s=60,
                                 block_size=16, progress="off")
            wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
        store.close()
    s = res.summary()
    # wall/cpu here include the parity sample (10 % more requests to P), sampling and the plot
    return {"ok": s["ok"], "requests": s["requests"], "cancelled": s["cancelled"], "errors": s["errors"],
            "wave_s": res.wall_s, "wave_cpu_s": res.client_cpu_s, "wall_s": wall, "cpu_s": cpu, "error": res.error}


async def _child_raw(args: argparse.Namespace) -> dict:
    """The ceiling of the HTTP client alone: two bare POST + read exchanges per "request" (no
    rig code), same connections and concurrency as the engine."""
    import aiohttp
    import msgspec

    from rig.workload.prompts import make_prompt

    bodies = [msgspec.json.encode({"model": MODEL, "prompt": make_prompt(args.prompt_tokens, 1_000_000 + i),
                                   "max_tokens": 1}) for i in range(args.requests)]
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * args.concurrency, limit_per_host=0),
                                    cookie_jar=aiohttp.DummyCookieJar(), skip_auto_headers=("User-Agent",))
    headers = {"Content-Type": "application/json"}

    async def wave(n: int) -> None:
        todo = iter(range(n))

        async def worker() -> None:
            for i in todo:
                for url in (args.p, args.d):
                    async with session.post(url + "/v1/completions", data=bodies[i], headers=headers) as r:
                        await r.read()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))

    await wave(256)  # warm-up
    cpu0, t0 = time.process_time(), time.monotonic()
    await wave(args.requests)
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    await session.close()
    return {"ok": args.requests, "requests": args.requests, "wall_s": wall, "cpu_s": cpu}


def child(args: argparse.Namespace) -> None:
    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    run = {"engine": _child_engine, "wave": _child_wave, "raw": _child_raw}[args.mode]
    out = asyncio.run(run(args))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


# ------------------------------------------------------------------------------------ parent


def run_child(args: argparse.Namespace, p: str, d: str, client: str, mode: str, stream: str, loop: str,
              cpu: int | None) -> dict:
    argv = [sys.executable, __file__, "--child", "--p", p, "--d", d, "--client", client, "--mode", mode,
            "--stream", stream, "--loop", loop, "--requests", str(args.requests),
            "--concurrency", str(args.concurrency), "--prompt-tokens", str(args.prompt_tokens),
            "--max-tokens", str(args.max_tokens)]
    r = subprocess.run(argv, capture_output=True, text=True, preexec_fn=_pin(cpu), cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    if r.returncode != 0:
        raise SystemExit(f"child failed ({client} {mode} {stream}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="aiohttp,fast,httpx")
    ap.add_argument("--modes", default="engine,wave")
    ap.add_argument("--streams", default="never,always,mixed", help="stream modes of the engine runs")
    ap.add_argument("--loops", default="uvloop,asyncio",
                    help="uvloop (what the rig uses, rig/transport/aio.py) and/or asyncio (comma list)")
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="runs per case; the median is reported")
    ap.add_argument("--json", help="also write the results here")
    # child-only
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--p", help=argparse.SUPPRESS)
    ap.add_argument("--d", help=argparse.SUPPRESS)
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--stream", default="mixed", help=argparse.SUPPRESS)
    ap.add_argument("--loop", default="asyncio", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0

    pin = os.cpu_count() is not None and os.cpu_count() >= 2 and hasattr(os, "sched_setaffinity")
    client_cpu, fake_cpu = (0, 1) if pin else (None, None)
    procs, p, d = start_fakes(fake_cpu)
    results = []
    try:
        print(f"# {args.requests}-request waves, concurrency {args.concurrency}, prompts {args.prompt_tokens} "
              f"tokens, max_tokens {args.max_tokens}; client on CPU {client_cpu}, fakes on CPU {fake_cpu}; "
              f"load average before {os.getloadavg()[0]:.1f}")
        print(f"{'client':8} {'loop':8} {'mode':7} {'stream':7} {'ok':>10} {'wall req/s':>10} {'req/CPU-s':>10} "
              f"{'peak RSS MB':>11}  target (>= {TARGET_RPS} req/CPU-s, <= {TARGET_RSS_MB} MB)")
        for loop in args.loops.split(","):
            for client in args.clients.split(","):
                for mode in args.modes.split(","):
                    if mode == "raw" and client != "aiohttp":
                        continue
                    for stream in (args.streams.split(",") if mode == "engine" else ["mixed"]):
                        runs = [run_child(args, p, d, client, mode, stream, loop, client_cpu)
                                for _ in range(args.repeats)]
                        n = runs[0]["requests"]
                        wall_rps = statistics.median(n / r.get("wave_s", r["wall_s"]) for r in runs)
                        cpu_rps = statistics.median(n / r.get("wave_cpu_s", r["cpu_s"]) for r in runs)
                        rss = max(r["peak_rss_mb"] for r in runs)
                        ok = f"{runs[0]['ok']}/{n}"
                        meets = (("yes" if cpu_rps >= TARGET_RPS else "no") + " / " +
                                 ("yes" if rss <= TARGET_RSS_MB else "no"))
                        print(f"{client:8} {loop:8} {mode:7} {stream:7} {ok:>10} {wall_rps:10.0f} {cpu_rps:10.0f} "
                              f"{rss:11.0f}  {meets}", flush=True)
                        results.append({"client": client, "loop": loop, "mode": mode, "stream": stream,
                                        "wall_req_s": wall_rps, "req_per_cpu_s": cpu_rps, "peak_rss_mb": rss,
                                        "runs": runs})
        print(f"# load average after {os.getloadavg()[0]:.1f}. 'wave' rows: the whole pressure wave "
              "(10 % cancels, metrics sampling every 1 s, progress off); req/s and req/CPU-s over the wave "
              "itself; peak RSS includes the parity sample, records file, matplotlib and the timeline PNG")
    finally:
        for pr in procs:
            pr.terminate()
        for pr in procs:
            pr.wait()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
