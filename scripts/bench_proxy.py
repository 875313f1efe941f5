#!/usr/bin/env python3
"""Benchmark of ``pdrig proxy`` against vLLM's toy proxy design (not a test).

Three paths from the same load generator to the same stub P/D backend:

- ``direct``: the load generator makes both hops itself (the floor: no proxy at all);
- ``pdrig``: through ``python -m rig.cli proxy`` (rig/proxy.py: aiohttp, uvloop, pooled
  upstream connections, no parsing of D's answer);
- ``toy``: through a minimal equivalent of vLLM's
  ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`` written below (``TOY PROXY``):
  FastAPI + uvicorn, an ``httpx.AsyncClient`` per pool, per request P with ``max_tokens: 1`` then
  D, D's body relayed as a ``StreamingResponse``. Our rewrite, not vLLM's file (vLLM's tests are
  not installed with the wheel).

The backend is a stub written below (``STUB``): one aiohttp process answering as P (with
``kv_transfer_params``) or as D (4 completion tokens, streamed as SSE when asked), in microseconds,
so the proxies are what is measured. With two or more CPUs the proxy under test runs on CPU 0 and
the stub and load generator on CPU 1.

Reported per path and mode (non-streamed / streamed): throughput (requests/s at concurrency
``--concurrency`` for ``--seconds``), the proxy process's own CPU time per request during it
(user + system, /proc: what the proxy costs whatever else runs on the host), and latency p50/p99
at concurrency 1; ``added`` is the path's latency minus ``direct``'s. On a loaded host the added
latency is mostly the proxy waiting for a CPU (three wake-ups per request), hence the CPU column.
Goal: pdrig >= 3x toy throughput and <= 1 ms added p50. Other load on the host (live
vLLM servers) lowers every figure; the load average is printed.

    .venv/bin/python scripts/bench_proxy.py                      # ~1 min
    .venv/bin/python scripts/bench_proxy.py --seconds 10 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = list(range(100, 132))  # 32 token IDs
BODY = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0}


# ----------------------------------------------------------------------------------- STUB
def stub_main(port: int) -> None:
    """A P/D stub: P answers (max_tokens 1 + do_remote_decode) with kv_transfer_params; D answers
    4 tokens, streamed (one SSE event per token, usage, [DONE]) when asked."""
    from aiohttp import web

    ktp = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1]],
           "remote_engine_id": "stub", "remote_request_id": "r", "remote_host": "127.0.0.1", "remote_port": 1}

    def choice(text: str, finish: str | None) -> dict:
        return {"index": 0, "text": text, "finish_reason": finish, "token_ids": [1] if text else None}

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        head = {"id": "cmpl-stub", "object": "text_completion", "created": 0, "model": "tiny"}
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": 4, "total_tokens": len(body["prompt"]) + 4}
        if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
            return web.json_response({**head, "choices": [choice("a", "length")], "kv_transfer_params": ktp,
                                      "usage": {**usage, "completion_tokens": 1}})
        if not body.get("stream"):
            return web.json_response({**head, "choices": [choice("abcd", "length")], "usage": usage,
                                      "kv_transfer_params": None})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        for i, t in enumerate("abcd"):
            chunk = {**head, "choices": [choice(t, "length" if i == 3 else None)]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions), web.get("/health", lambda _r: web.Response(text="ok"))])
    _uvloop_run(web._run_app(app, host="127.0.0.1", port=port, access_log=None, print=None))


# ------------------------------------------------------------------------------ TOY PROXY
def toy_main(port: int, prefill: str, decode: str) -> None:
    """vLLM's toy proxy design (toy_proxy_server.py), minimal: sequential httpx P then D."""
    import httpx
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    clients = {"p": httpx.AsyncClient(timeout=None, base_url=prefill),
               "d": httpx.AsyncClient(timeout=None, base_url=decode)}

    async def send_prefill(req_data: dict) -> dict:
        req = req_data.copy()
        req["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                     "remote_block_ids": None, "remote_host": None, "remote_port": None}
        req["stream"] = False
        req["max_tokens"] = 1
        req.pop("stream_options", None)
        r = await clients["p"].post("/v1/completions", json=req)
        r.raise_for_status()
        return r.json()

    async def stream_decode(req_data: dict):
        async with clients["d"].stream("POST", "/v1/completions", json=req_data) as r:
            r.raise_for_status()
            async for chunk in r.aiter_bytes():
                yield chunk

    async def completions(request):
        req_data = await request.json()
        p = await send_prefill(req_data)
        req_data["kv_transfer_params"] = p.get("kv_transfer_params", {})
        return StreamingResponse(stream_decode(req_data), media_type="application/json")
    completions.__annotations__ = {"request": Request}  # resolved types: this module has lazy annotations
    app.post("/v1/completions")(completions)

    @app.get("/health")
    async def health():
        return {"ok": True}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---------------------------------------------------------------------------- the harness
def _uvloop_run(coro) -> None:
    sys.path.insert(0, str(ROOT))
    from rig.transport import aio

    aio.run(coro)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(argv: list[str], cpu: int | None) -> subprocess.Popen:
    """A child pinned to ``cpu`` (None: unpinned), its output discarded."""
    pre = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pre,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def wait_up(url: str, proc: subprocess.Popen, within_s: float = 30) -> None:
    import httpx

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not up within {within_s} s")


async def one(session, url: str | None, stub: str, stream: bool) -> None:
    """One P/D request: through the proxy at ``url``, or both hops directly (``url`` None)."""
    body = {**BODY, "stream": stream}
    if url is None:
        async with session.post(stub + "/v1/completions", json={**BODY, "max_tokens": 1, "kv_transfer_params":
                                                                {"do_remote_decode": True}}) as r:
            ktp = (await r.json())["kv_transfer_params"]
        body["kv_transfer_params"] = ktp
        url = stub
    async with session.post(url + "/v1/completions", json=body) as r:
        raw = await r.read()
        if r.status != 200 or (b"[DONE]" not in raw if stream else b'"abcd"' not in raw):
            raise RuntimeError(f"bad answer {r.status}: {raw[:200]!r}")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of process ``pid`` so far (0 for None), from /proc/PID/stat."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(url: str | None, stub: str, stream: bool, concurrency: int, seconds: float,
                  latency_n: int, proxy_pid: int | None) -> dict:
    """Throughput at ``concurrency`` for ``seconds`` (and the proxy's CPU time per request in it),
    then latency at concurrency 1."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency + 4)) as session:
        for _ in range(50):  # warm connections and code paths
            await one(session, url, stub, stream)
        done, errors, t_end = 0, 0, time.monotonic() + seconds

        async def worker() -> None:
            nonlocal done, errors
            while time.monotonic() < t_end:
                try:
                    await one(session, url, stub, stream)
                    done += 1
                except (aiohttp.ClientError, RuntimeError):  # counted, not fatal: part of the comparison
                    errors += 1
        t0, cpu0 = time.monotonic(), cpu_seconds(proxy_pid)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        rps = done / (time.monotonic() - t0)
        cpu_ms = (cpu_seconds(proxy_pid) - cpu0) / max(done, 1) * 1e3
        lat = []
        for _ in range(latency_n):
            t = time.perf_counter()
            try:
                await one(session, url, stub, stream)
            except (aiohttp.ClientError, RuntimeError):
                errors += 1
                continue
            lat.append(time.perf_counter() - t)
    q = statistics.quantiles(lat, n=100)
    return {"rps": rps, "p50_ms": statistics.median(lat) * 1e3, "p99_ms": q[98] * 1e3, "proxy_cpu_ms": cpu_ms,
            "errors": errors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="throughput phase per path and mode")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--latency-requests", type=int, default=1000, help="sequential requests for p50/p99")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the proxies / the stub and load generator")
    ap.add_argument("--role", help=argparse.SUPPRESS)  # internal: stub / toy child processes
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "stub":
        stub_main(args.port)
        return 0
    if args.role == "toy":
        toy_main(args.port, args.upstream, args.upstream)
        return 0
    two = len(os.sched_getaffinity(0)) >= 2 and not args.no_pin
    cpu_proxy, cpu_rest = (0, 1) if two else (None, None)
    if cpu_rest is not None:
        os.sched_setaffinity(0, {cpu_rest})
    me = [sys.executable, str(Path(__file__).resolve())]
    sport, pport, tport = free_port(), free_port(), free_port()
    stub = f"http://127.0.0.1:{sport}"
    procs = {"stub": spawn([*me, "--role", "stub", "--port", str(sport)], cpu_rest),
             "pdrig": spawn([sys.executable, "-m", "rig.cli", "proxy", "--prefill", stub, "--decode", stub,
                             "--port", str(pport)], cpu_proxy),
             "toy": spawn([*me, "--role", "toy", "--port", str(tport), "--upstream", stub], cpu_proxy)}
    urls = {"direct": None, "pdrig": f"http://127.0.0.1:{pport}", "toy": f"http://127.0.0.1:{tport}"}
    results: dict[str, dict] = {}
    try:
        wait_up(stub, procs["stub"])
        wait_up(urls["pdrig"], procs["pdrig"])
        wait_up(urls["toy"], procs["toy"])
        sys.path.insert(0, str(ROOT))
        from rig.transport import aio

        for stream in (False, True):
            for path in ("direct", "pdrig", "toy"):
                key = f"{path} {'stream' if stream else 'json'}"
                pid = procs[path].pid if path in procs else None
                results[key] = aio.run(measure(urls[path], stub, stream, args.concurrency, args.seconds,
                                               args.latency_requests, pid))
                print(f"{key:14s} {results[key]['rps']:8.0f} req/s   p50 {results[key]['p50_ms']:6.2f} ms"
                      f"   p99 {results[key]['p99_ms']:6.2f} ms   proxy CPU {results[key]['proxy_cpu_ms']:.3f} ms/req"
                      f"   errors {results[key]['errors']}",
                      file=sys.stderr, flush=True)
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; concurrency {args.concurrency}, {args.seconds:g} s "
          f"per throughput run, {args.latency_requests} sequential requests for latency, "
          f"{'proxy on CPU 0, stub and load generator on CPU 1' if two else 'unpinned'}")
    print("| mode | path | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | proxy CPU ms/req | errors "
          "| vs toy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode in ("json", "stream"):
        base, toy = results[f"direct {mode}"], results[f"toy {mode}"]
        for path in ("direct", "pdrig", "toy"):
            r = results[f"{path} {mode}"]
            print(f"| {mode} | {path} | {r['rps']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                  f"{r['p50_ms'] - base['p50_ms']:+.2f} | {r['p99_ms'] - base['p99_ms']:+.2f} | "
                  f"{r['proxy_cpu_ms']:.3f} | {r['errors']} | {r['rps'] / toy['rps']:.1f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
