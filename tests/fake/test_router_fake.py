"""Router transforms between the hops and routes through a router (bug record R26, R27) against fake
vLLM servers (tests/fake_vllm.py).

- ``rt-transforms``: each transform on its own step (P's first token appended to D's prompt whose
  first block is in D's prefix cache, two decode hops from one P answer with ``max_tokens``
  rewritten, ``kv_transfer_params`` stripped), a later direct request for the prompt D got, and
  ``route: router`` through the ``pdrig proxy`` the rig starts: streams end with ``[DONE]``, D's
  refusal of a streamed body reaches the client unchanged. PASS.
- ``rt-r26``: D answers wrong tokens for an appended prompt and dies with the assert on the second
  one (the fake's ``append-mismatch``, modelled on vLLM 0.32.0): XFAIL under the
  ``appended-token`` known issue, which names both symptoms; the same scenario without the known
  issue FAILs naming the divergence and the death.
- ``rt-edge-via-proxy``: an edge scenario with ``router: {}``: every request through the proxy,
  judged on the client's stream and D's pulls. PASS.
- ``rt-bad-router``: a router the user runs that answers 200 where D refused: FAIL, and the
  ``refusal-relayed`` check names both statuses.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from rig.config import load_config
from rig.run.runner import SuiteRunner, new_run_dir
from rig.transport import aio
from tests.helpers.fake_rig import fake_config, free_ports, write_config
from tests.helpers.suites import fake_suite_fixtures

APPEND = {"append_first_token": True}
KNOWN = {"id": "r26", "title": "appended first token", "affects": ">=0.27",
         "symptom": {"kind": "appended-token", "excuses": ["idle-after"]}}


def seq(name: str, decode: str, steps: list[dict], **extra) -> dict:
    return {"name": name, "kind": "sequence", "decode": decode, "sequence": {"steps": steps, **extra.pop("seq", {})},
            **extra}


def r26_steps() -> list[dict]:
    return [
        {"id": "warm", "route": "decode", "prompt_tokens": 32, "max_tokens": 2},
        {"id": "app64", "route": "pd", "prompt_tokens": 64, "max_tokens": 4, "prefix_of": "warm",
         "transform": APPEND, "start": {"after": "warm", "event": "answered"}},
        {"id": "app65", "route": "pd", "prompt_tokens": 65, "max_tokens": 4, "transform": APPEND,
         "start": {"after": "app64", "event": "answered"}},
    ]


SCENARIOS = [
    seq("rt-transforms", "decode", [
        {"id": "warm", "route": "decode", "prompt_tokens": 32, "max_tokens": 2},
        {"id": "app", "route": "pd", "prompt_tokens": 64, "max_tokens": 4, "prefix_of": "warm",
         "transform": APPEND, "start": {"after": "warm", "event": "answered"}},
        {"id": "again", "route": "decode", "prompt_tokens": 65, "max_tokens": 4, "repeat_of": "app",
         "start": {"after": "app", "event": "answered"}},
        {"id": "twice", "route": "pd", "prompt_tokens": 40, "max_tokens": 6,
         "transform": {"decode_hops": 2, "set": {"max_tokens": 3}}},
        {"id": "forget", "route": "pd", "prompt_tokens": 40, "max_tokens": 4,
         "transform": {"strip": ["kv_transfer_params"]}},
        {"id": "via", "route": "router", "prompt_tokens": 40, "max_tokens": 5, "count": 2,
         "request": {"decode": {"stream": True}}},
        {"id": "refused", "route": "router", "prompt_tokens": 40, "max_tokens": 5, "expect_status": 400,
         "request": {"decode": {"stream": True, "prompt_logprobs": 1}}, "start": {"after": "via", "event": "answered"}},
    ]),
    {"name": "rt-edge-via-proxy", "decode": "decode", "prompt_tokens": 40, "max_tokens": 4, "concurrent": 2,
     "router": {}, "request": {"decode": {"stream": True}}},
    seq("rt-r26", "decode-r26", r26_steps(), known_issue=KNOWN),
    seq("rt-r26-unexpected", "decode-r26b", r26_steps()),
]
R26_ENV = {"env": {"FAKE_VLLM_FAULT": "append-mismatch", "FAKE_VLLM_FAULT_ARG": "2"}}
SUITE = Path(__file__).resolve().parents[2] / "configs" / "suites" / "regressions.yaml"
# The regression suite's own R27 scenario, on a fake D with the profile's smaller max_model_len.
R27 = next(s for s in yaml.safe_load(SUITE.read_text()) if s["name"] == "r27-router-relays-refusal")
SCENARIOS.append(R27)
DECODES = {"decode": {}, "decode-r26": R26_ENV, "decode-r26b": R26_ENV,
           "decode-mml112": {"max_model_len": 112}}


# suite: (RunResult, run_dir) of one run of SCENARIOS
base_dir, no_survivors, suite = fake_suite_fixtures("fake-router", decodes=DECODES, scenarios=SCENARIOS)


def verdict(suite, name):
    return next(v for v in suite[0].verdicts if v.scenario == name)


def records(suite, name) -> dict:
    obs = next(o for o in suite[0].observations if o.scenario == name)
    return {r.request_id: r for r in obs.records}


def checks(v) -> dict[str, tuple[bool | None, str]]:
    return {c.name: (c.ok, c.detail) for c in v.checks}


def test_transforms_and_router_pass(suite):
    v = verdict(suite, "rt-transforms")
    assert v.verdict == "PASS", (v.reason, checks(v))
    c = checks(v)
    assert c["repeat-equal"][0] is True and c["refusal-relayed"][0] is True
    assert "HTTP 400" in c["refusal-relayed"][1] and "prompt_logprobs" in c["refusal-relayed"][1]
    assert c["stream-complete"][0] is True


def test_append_first_token_sends_d_the_longer_prompt(suite):
    recs = records(suite, "rt-transforms")
    app = recs["rt-transforms-app-0"]
    warm = recs["rt-transforms-warm-0"]
    assert app.prompt[:32] == warm.prompt and len(app.prompt) == 64  # prefix_of: the warm prompt first
    assert app.decode_prompt == app.prompt + [app.prefill.token_ids[0]]
    assert app.decode.usage["prompt_tokens"] == 65
    again = recs["rt-transforms-again-0"]
    assert again.prompt == app.decode_prompt and again.decode.instance == "decode"
    assert again.decode.token_ids == app.decode.token_ids  # the same prompt, the same greedy answer


def test_several_decode_hops_and_set_fields(suite):
    recs = records(suite, "rt-transforms")
    a, b = recs["rt-transforms-twice-0"], recs["rt-transforms-twice-1"]
    assert a.prefill is b.prefill  # one P answer
    assert a.max_tokens == b.max_tokens == 3 and len(a.decode.token_ids) == len(b.decode.token_ids) == 3


def test_strip_removes_the_field_from_ds_body(suite):
    _, run_dir = suite
    log = (run_dir / "logs" / "decode.log").read_text() if (run_dir / "logs" / "decode.log").exists() else \
        "\n".join(p.read_text() for p in run_dir.rglob("decode*.log"))
    fields = [line.split("completion fields: ", 1)[1] for line in log.splitlines() if "completion fields: " in line]
    assert any("kv_transfer_params" not in f.split(",") for f in fields)
    recs = records(suite, "rt-transforms")
    assert recs["rt-transforms-forget-0"].outcome == "ok"


def test_router_route_goes_through_the_rigs_proxy(suite):
    _, run_dir = suite
    recs = records(suite, "rt-transforms")
    via = recs["rt-transforms-via-0"]
    assert via.decode.instance == "router" and via.prefill is None and via.decode.stream_problem == ""
    refused = recs["rt-transforms-refused-0"]
    assert refused.outcome == "http_error" and refused.decode.status == 400
    seq_json = json.loads((run_dir / "sequence-rt-transforms.json").read_text())
    assert seq_json["router_url"].startswith("http://127.0.0.1:")
    metrics = (run_dir / "proxy-rt-transforms.metrics.txt").read_text()
    assert 'status="400"' in metrics and 'failed_hop="decode"' in metrics


def test_an_edge_scenario_goes_through_the_rigs_proxy(suite):
    v = verdict(suite, "rt-edge-via-proxy")
    assert v.verdict == "PASS", (v.reason, checks(v))
    c = checks(v)
    assert c["kv-pulled"][0] is True and c["stream-complete"][0] is True  # D's metrics, the client's stream
    recs = records(suite, "rt-edge-via-proxy")
    assert all(r.prefill is None and r.decode.instance == "router" for r in recs.values())
    assert (suite[1] / "proxy-rt-edge-via-proxy.metrics.txt").exists()


def test_the_suites_r27_passes_on_a_relaying_router(suite):
    v = verdict(suite, "r27-router-relays-refusal")
    assert v.verdict == "PASS", (v.reason, checks(v))
    c = checks(v)
    assert c["refusal-relayed"][0] is True and "max_tokens must be at least 1, got 0" in c["refusal-relayed"][1]
    recs = records(suite, "r27-router-relays-refusal")
    assert {r.decode.status for k, r in recs.items() if "-refused" in k} == {400}


def test_r26_known_issue_names_wrong_tokens_then_the_death(suite):
    v = verdict(suite, "rt-r26")
    assert v.verdict == "XFAIL", (v.reason, checks(v))
    assert "rt-r26-app64-0" in v.reason and "num_decode_blocks" in v.reason
    recs = records(suite, "rt-r26")
    assert recs["rt-r26-app64-0"].outcome == "ok" and recs["rt-r26-app65-0"].outcome != "ok"


def test_r26_without_the_known_issue_fails_naming_the_death(suite):
    v = verdict(suite, "rt-r26-unexpected")
    assert v.verdict == "FAIL"
    c = checks(v)
    assert c["parity"][0] is False and c["alive"][0] is False
    # the death is named with the exception that ended it
    assert "died" in c["alive"][1] and "AssertionError: assert num_decode_blocks" in c["alive"][1]


class _BadRouter:
    """A router that calls D straight (no P hop) and answers 200 with D's error body when D refuses."""

    def __init__(self, decode_url: str, port: int):
        self.decode_url, self.port, self.url = decode_url, port, f"http://127.0.0.1:{port}"
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: aio.run(self._main()), daemon=True)

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        async with aiohttp.ClientSession() as s, s.post(self.decode_url + request.path, data=body,
                                                        headers={"Content-Type": "application/json"}) as r:
            raw = await r.read()
            return web.Response(status=200, body=raw, content_type=r.content_type)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application()
        app.add_routes([web.post("/v1/completions", self._handle)])
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> _BadRouter:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def test_a_router_that_reports_200_for_ds_refusal_fails(base_dir):
    tmp = base_dir / "bad-router"
    tmp.mkdir()
    data = fake_config(tmp, decodes={"decode": {}})
    port = free_ports(1)[0]
    data["scenarios"] = [seq("rt-bad-router", "decode", [
        {"id": "refused", "route": "router", "prompt_tokens": 40, "max_tokens": 5, "expect_status": 400,
         "request": {"decode": {"stream": True, "prompt_logprobs": 1}}}],
        seq={"router": {"url": f"http://127.0.0.1:{port}"}})]
    decode_url = f"http://127.0.0.1:{data['decode'][0]['port']}"
    with _BadRouter(decode_url, port):
        cfg = load_config(write_config(tmp, data))
        result = SuiteRunner(cfg, list(cfg.scenarios), new_run_dir(cfg), quiet=True).run()
    v = result.verdicts[0]
    assert v.verdict == "FAIL"
    c = checks(v)
    assert c["refusal-relayed"][0] is False and "HTTP 200" in c["refusal-relayed"][1] \
        and "HTTP 400" in c["refusal-relayed"][1]
    assert c["completed"][0] is False and "expected HTTP 400" in c["completed"][1]
