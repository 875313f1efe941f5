"""``pdrig proxy`` (rig/proxy.py) driven by real clients: the OpenAI Python SDK (streamed and not,
completions and chat) and httpx, against fake vLLM servers (tests/fake_vllm.py) started by the
rig's own Cluster, plus recording stubs where the test must see exactly what each hop received.
"""

from __future__ import annotations

import json
import os
import sys
import time

import httpx
import openai
import pytest
from aiohttp import web

from rig.cluster.processes import Cluster
from rig.config import RigConfig
from rig.observe.metrics import parse_metrics
from rig.plan.processes import build_plan
from rig.proxy import Backend, PDProxy, Picker, ProxyThread
from rig.transport.bodies import PREFILL_PARAMS
from tests.helpers.fake_rig import ROOT, fake_config, free_ports
from tests.helpers.survivors import kill_pids, wait_no_survivors


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    """Fake P (fast and slow) and fake D instances (two healthy, one answering 500, one slow)."""
    tmp = tmp_path_factory.mktemp("proxy")
    data = fake_config(tmp, decodes={"decode-a": {}, "decode-b": {},
                                     "decode-500": {"env": {"FAKE_VLLM_FAULT": "http500"}},
                                     "decode-slow": {"env": {"FAKE_VLLM_TOKEN_LATENCY": "0.05"}}})
    port, side = free_ports(2)
    data["prefill"].append({"name": "prefill-slow", "port": port, "side_channel_port": side,
                            "num_gpu_blocks_override": 64, "env": {"FAKE_VLLM_TOKEN_LATENCY": "3"}})
    cfg = RigConfig.model_validate(data)
    plan = build_plan(cfg, tmp / "run", str(tmp / "model"), sys.executable)
    with Cluster(plan, 30, 3) as cluster:
        cluster.start([p.name for p in plan.processes])
        yield cluster
    left = wait_no_survivors(str(tmp), within_s=10)
    kill_pids(left)
    assert left == {}, f"fake servers survived: {left}"


def proxy_over(cluster: Cluster, prefills: list[str], decodes: list[str], policy: str = "round-robin",
               **kw) -> ProxyThread:
    pools = [[(n, cluster.url(n)) for n in names] for names in (prefills, decodes)]
    return ProxyThread(PDProxy(*pools, policy=policy, **kw), port=free_ports(1)[0]).start()


@pytest.fixture(scope="module")
def proxy(fakes):
    front = proxy_over(fakes, ["prefill"], ["decode-a", "decode-b"])
    yield front
    front.stop()


def sdk(front: ProxyThread) -> openai.OpenAI:
    # max_retries=0: the SDK retries 5xx on its own, which would hide what the proxy answered.
    return openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=20)


def scrape(url: str):
    return parse_metrics(httpx.get(url + "/metrics", timeout=5).text)


def direct(cluster: Cluster, name: str, route: str, body: dict) -> httpx.Response:
    return httpx.post(cluster.url(name) + route, json=body, timeout=20)


def test_sdk_completion_is_pd_and_matches_direct(fakes, proxy):
    """Non-streamed completion through the proxy: D pulled the prompt from P (its
    external_kv_transfer counter grew by the prompt's tokens) and the text equals a direct request."""
    prompt = "disaggregated prefill then decode"
    before = {n: scrape(fakes.url(n)) for n in ("decode-a", "decode-b")}
    got = sdk(proxy).completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0)
    want = direct(fakes, "prefill", "/v1/completions",
                  {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0}).json()
    assert got.choices[0].text == want["choices"][0]["text"] and len(got.choices[0].text) == 6
    assert got.usage.completion_tokens == 6 and got.usage.prompt_tokens == len(prompt.encode())
    pulled = sum(scrape(fakes.url(n)).value("vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
                 - before[n].value("vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
                 for n in before)
    assert pulled == len(prompt.encode())


def test_sdk_stream_equals_non_stream_and_token_prompt(proxy):
    """A streamed completion (token-ID prompt, as the rig's own) has the same text and usage as
    the non-streamed one, delivered in one chunk per token."""
    client = sdk(proxy)
    prompt = list(range(40, 80))
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert sum(bool(c.choices) for c in chunks) == 5
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.prompt_tokens == 40


def test_sdk_chat_streamed_and_not(fakes, proxy):
    client = sdk(proxy)
    msgs = [{"role": "user", "content": "say something"}]
    whole = client.chat.completions.create(model="tiny", messages=msgs, max_completion_tokens=4, temperature=0)
    want = direct(fakes, "prefill", "/v1/chat/completions",
                  {"model": "tiny", "messages": msgs, "max_completion_tokens": 4}).json()
    assert whole.choices[0].message.content == want["choices"][0]["message"]["content"]
    assert whole.usage.completion_tokens == 4
    parts = [c.choices[0].delta.content for c in client.chat.completions.create(
        model="tiny", messages=msgs, max_completion_tokens=4, temperature=0, stream=True) if c.choices]
    assert "".join(parts) == whole.choices[0].message.content and len(parts) == 4


def test_round_robin_alternates_decodes_and_names_them(proxy):
    client = sdk(proxy)
    seen = [client.completions.with_raw_response.create(model="tiny", prompt="rr", max_tokens=1).headers
            for _ in range(4)]
    decodes = [h["x-pd-decode"] for h in seen]
    assert decodes in (["decode-a", "decode-b"] * 2, ["decode-b", "decode-a"] * 2)
    assert {h["x-pd-prefill"] for h in seen} == {"prefill"}


def test_least_outstanding_picks_the_idlest():
    a, b, c = Backend("a", "u"), Backend("b", "u"), Backend("c", "u")
    pick = Picker([a, b, c], "least-outstanding")
    assert pick.pick() is a  # ties: list order
    a.outstanding, b.outstanding, c.outstanding = 3, 1, 2
    assert pick.pick() is b
    b.outstanding = 5
    assert pick.pick() is c
    with pytest.raises(ValueError, match="least-busy"):
        Picker([a], "least-busy")


def test_prefill_error_relayed_unchanged(fakes, proxy):
    """P's 404 (unknown model) reaches the client with P's own status and body, and the hop named."""
    body = {"model": "no-such-model", "prompt": "x", "max_tokens": 2}
    want = direct(fakes, "prefill", "/v1/completions", body)
    r = httpx.post(proxy.url + "/v1/completions", json=body, timeout=20)
    assert (r.status_code, r.json()) == (want.status_code, want.json()) == (404, want.json())
    assert r.headers["x-pd-failed-hop"] == "prefill"
    with pytest.raises(openai.NotFoundError, match="no-such-model"):
        sdk(proxy).completions.create(**body)


def test_decode_error_relayed_unchanged(fakes):
    with proxy_over(fakes, ["prefill"], ["decode-500"]) as front:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 2}
        r = httpx.post(front.url + "/v1/completions", json=body, timeout=20)
        want = direct(fakes, "decode-500", "/v1/completions", body)
        assert (r.status_code, r.json()) == (500, want.json())
        assert r.headers["x-pd-failed-hop"] == "decode" and r.headers["x-pd-prefill"] == "prefill"
        with pytest.raises(openai.InternalServerError, match="EngineCore encountered an issue"):
            sdk(front).completions.create(**body)
        with pytest.raises(openai.InternalServerError):  # streamed requests fail the same way
            list(sdk(front).completions.create(**body, stream=True))
        m = scrape(front.url)
        assert m.value("pdrig_proxy_requests_total", route="/v1/completions", status="500", failed_hop="decode") == 3


def test_unreachable_decode_is_502_naming_the_hop(fakes):
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    with ProxyThread(PDProxy([("prefill", fakes.url("prefill"))], [("gone", dead)]), port=free_ports(1)[0]) as front:
        r = httpx.post(front.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 502 and r.headers["x-pd-failed-hop"] == "decode"
    assert r.json()["error"]["hop"] == "decode" and "gone" in r.json()["error"]["message"]


def test_prefill_without_kv_transfer_params_is_502(fakes):
    """A 'prefill' that is no KV producer (here a decode instance) cannot feed D: 502, hop prefill."""
    with proxy_over(fakes, ["decode-b"], ["decode-a"]) as front:
        r = httpx.post(front.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 502 and r.headers["x-pd-failed-hop"] == "prefill"
    assert "kv_producer" in r.json()["error"]["message"]


class Recorder:
    """A stub P or D that records every body it receives (P answers with fixed kv_transfer_params)."""

    P_KTP = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[7, 8]],
             "remote_engine_id": "p-engine", "remote_request_id": "p-req", "remote_host": "127.0.0.1",
             "remote_port": 5600}

    def __init__(self, is_prefill: bool):
        self.is_prefill, self.bodies, self.auth = is_prefill, [], []

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            self.bodies.append(await request.json())
            self.auth.append(request.headers.get("Authorization"))
            return web.json_response({"choices": [{"index": 0, "text": "t", "finish_reason": "length"}],
                                      "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                                      "kv_transfer_params": self.P_KTP if self.is_prefill else None})
        app = web.Application()
        app.add_routes([web.post("/v1/completions", handle)])
        return app


def test_client_kv_transfer_params_are_dropped():
    """A client's kv_transfer_params (another request's block IDs) reach neither hop: P gets the
    rig's prefill params, D exactly P's answer."""
    p, d = Recorder(True), Recorder(False)
    with ProxyThread(p, port=free_ports(1)[0]) as ps, ProxyThread(d, port=free_ports(1)[0]) as ds, \
            ProxyThread(PDProxy([("p", ps.url)], [("d", ds.url)]), port=free_ports(1)[0]) as front:
        stolen = {"do_remote_prefill": True, "remote_block_ids": [[1, 2, 3]], "remote_engine_id": "victim",
                  "remote_request_id": "victim-req", "remote_host": "127.0.0.1", "remote_port": 5600}
        sdk(front).completions.create(model="tiny", prompt="x", max_tokens=3, extra_body={"kv_transfer_params": stolen})
        m = scrape(front.url)
    assert p.bodies[0]["kv_transfer_params"] == PREFILL_PARAMS
    assert p.bodies[0]["max_tokens"] == 1 and "stream" not in p.bodies[0]
    assert d.bodies[0]["kv_transfer_params"] == Recorder.P_KTP and d.bodies[0]["max_tokens"] == 3
    assert m.value("pdrig_proxy_client_kv_transfer_params_dropped_total") == 1
    assert p.auth == d.auth == ["Bearer unused"]  # the client's API key reaches both hops


def wait_for(cond, within_s: float) -> float | None:
    """Seconds until ``cond()`` held, or None if it did not within ``within_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within_s:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def test_client_gone_during_decode_aborts_decode(fakes):
    """Closing the client's stream after its first token closes D's connection: the slow D (5 s
    of tokens) stops running at once and never counts the request as finished."""
    d = fakes.url("decode-slow")
    done_before = scrape(d).value("vllm:request_success_total", finished_reason="length")
    with proxy_over(fakes, ["prefill"], ["decode-slow"]) as front:
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 100, "stream": True}
        with httpx.stream("POST", front.url + "/v1/completions", json=body, timeout=20) as r:
            first = next(ln for ln in r.iter_lines() if ln.startswith("data: "))
        assert '"text"' in first
        assert wait_for(lambda: scrape(d).value("vllm:num_requests_running") == 0, 2.0) is not None
        assert wait_for(lambda: scrape(front.url).value("pdrig_proxy_client_disconnects_total", stage="decode") == 1,
                        2.0) is not None
    # No running request left on D: the request ended, and the fake counts a success before it
    # releases a request (tests/fake_vllm.py), so a finish would already show here, not later.
    assert scrape(d).value("vllm:request_success_total", finished_reason="length") == done_before


def test_client_gone_during_prefill_aborts_prefill_and_skips_decode(fakes):
    """A client that gives up while the slow P (3 s) works: P's request is aborted, D never asked."""
    p, d = fakes.url("prefill-slow"), fakes.url("decode-a")
    d_prompts = scrape(d).value("vllm:prompt_tokens_total")
    with proxy_over(fakes, ["prefill-slow"], ["decode-a"]) as front:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(front.url + "/v1/completions", json={"model": "tiny", "prompt": "slow", "max_tokens": 2},
                       timeout=httpx.Timeout(20, read=0.5))
        assert wait_for(lambda: scrape(p).value("vllm:num_requests_running") == 0, 1.5) is not None
        assert wait_for(lambda: scrape(front.url).value("pdrig_proxy_client_disconnects_total", stage="prefill") == 1,
                        1.5) is not None
    # P released the request within 1.5 s of its 3 s token: it was aborted, not finished (the fake
    # counts a success before it releases a request), so it can answer no one now; the proxy gave
    # up at the prefill stage, and D is asked only with P's answer.
    assert scrape(p).value("vllm:request_success_total", finished_reason="length") == 0
    assert scrape(d).value("vllm:prompt_tokens_total") == d_prompts


def test_cli_refuses_missing_instances(capsys):
    from rig import cli

    assert cli.main(["proxy", "--prefill", "http://127.0.0.1:1"]) == 2
    assert "at least one prefill and one decode" in capsys.readouterr().err


def _wait_listening(url: str, proc, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not come up within {within_s} s")


def test_cli_proxy_serves_and_stops_on_sigterm(fakes):
    import signal
    import subprocess

    port = free_ports(1)[0]
    proc = subprocess.Popen([sys.executable, "-m", "rig.cli", "proxy", "--prefill", fakes.url("prefill"),
                             "--decode", fakes.url("decode-a"), "--port", str(port)],
                            cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_listening(url, proc, 20)
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "cli", "max_tokens": 3}, timeout=20)
        assert r.status_code == 200 and r.headers["x-pd-decode"] == "decode-0"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_up_with_proxy_serves_pd_and_stops_everything(tmp_path):
    """`pdrig up --proxy PORT` starts the topology and the proxy in front of it; SIGTERM stops both."""
    import signal
    import subprocess

    from tests.helpers.fake_rig import write_config

    cfg = write_config(tmp_path, fake_config(tmp_path))
    port = free_ports(1)[0]
    proc = subprocess.Popen([sys.executable, "-m", "rig.cli", "up", "--config", str(cfg), "--proxy", str(port)],
                            cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_listening(url, proc, 60)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20)
        got = client.completions.create(model="tiny", prompt=list(range(3, 40)), max_tokens=4)
        assert got.usage.completion_tokens == 4
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = wait_no_survivors(str(tmp_path), within_s=10)
    kill_pids(left)
    assert left == {}, f"servers survived pdrig up: {left}"


def test_endpoints_file_of_pdrig_up(tmp_path):
    from rig.proxy import endpoints_from_file

    f = tmp_path / "endpoints.json"
    f.write_text(json.dumps({"mooncake-master": {"url": "http://127.0.0.1:8080", "role": "mooncake-master"},
                             "prefill": {"url": "http://127.0.0.1:8100", "role": "prefill"},
                             "decode": {"url": "http://127.0.0.1:8200", "role": "decode"}}))
    assert endpoints_from_file(str(f)) == ([("prefill", "http://127.0.0.1:8100")], [("decode", "http://127.0.0.1:8200")])
    f.write_text(json.dumps({"prefill": {"url": "http://127.0.0.1:8100", "role": "prefill"}}))
    with pytest.raises(ValueError, match="at least one prefill and one decode"):
        endpoints_from_file(str(f))
    with pytest.raises(ValueError, match="cannot read it"):
        endpoints_from_file(str(tmp_path / "missing.json"))
