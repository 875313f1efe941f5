"""The drain check (rig.observe.drain) where `make mutation` found it untested: every field of the
result a verdict and its detail read, the leak in blocks as the user reads it, and the live wait
with each endpoint's own baseline. In-process: /metrics is an httpx.MockTransport, sleeps are
recorded, not slept."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest

from rig.observe import metrics as m
from rig.observe import observations
from rig.observe.drain import check_drains, describe_drain, drain_from_samples
from rig.observe.observations import KV_EPS, DrainResult
from rig.transport.endpoint import Endpoint
from tests.helpers.stall_metrics import IDLE, LIVELOCK, TEMPLATE

PAGE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting {waiting}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc {kv}
"""


def test_each_drain_result_carries_instance_time_baseline_and_state():
    idle = drain_from_samples("decode", [row(7.5, kv=0.2)], 0.25, t_end=5.0, drain_s=10.0)
    assert idle == DrainResult("decode", True, 2.5, 0.25, {"waiting": 0.0, "running": 0.0, "kv_usage": 0.2},
                               samples=1)
    r = row(6.0)
    r["kv_cache_usage_perc"] = None
    absent = drain_from_samples("decode", [r], 0.25, t_end=5.0, drain_s=10.0)
    assert absent == DrainResult("decode", None, 1.0, 0.25, {"waiting": 0.0, "running": 0.0, "kv_usage": None},
                                 "vllm:kv_cache_usage_perc absent from /metrics", 1)
    # samples before the end of the wave, after the window, or of another instance are not counted
    rows = [row(4.0), row(6.0, running=1), row(9.0, waiting=2), row(16.0), {**row(7.0), "instance": "prefill"}]
    busy = drain_from_samples("decode", rows, 0.25, t_end=5.0, drain_s=10.0)
    assert busy == DrainResult("decode", False, 10.0, 0.25, {"waiting": 2.0, "running": 0.0, "kv_usage": 0.0},
                               samples=2)
    none = drain_from_samples("decode", [], 0.25, t_end=5.0, drain_s=10.0)
    assert none == DrainResult("decode", False, 10.0, 0.25, {}, "no sample within 10 s after the wave")
    assert none.describe() == "decode not observed idle: no sample within 10 s after the wave"


def test_the_leak_in_blocks_is_said_only_above_the_baseline():
    at_eps = DrainResult("decode", False, 10.0, 0.25, {"waiting": 1.0, "running": 0.0, "kv_usage": 0.25 + KV_EPS})
    assert describe_drain(at_eps, 4) == "decode not idle after 10.0 s: waiting=1"
    over = DrainResult("decode", False, 10.0, 0.25, {"waiting": 0.0, "running": 0.0, "kv_usage": 0.5})
    assert describe_drain(over, None) == ("decode not idle after 10.0 s: kv_cache_usage_perc=50.0% (baseline 25.0%) "
                                          "(usable block count unknown)")
    assert describe_drain(over, 8) == ("decode not idle after 10.0 s: kv_cache_usage_perc=50.0% (baseline 25.0%) "
                                       "= 4.0 of 8 usable blocks held (2.0 blocks' worth above the baseline)")
    unknown_kv = DrainResult("decode", False, 10.0, 0.0, {"waiting": 2.0, "running": 0.0})
    assert describe_drain(unknown_kv, 4) == "decode not idle after 10.0 s: waiting=2"


def _sleeps(monkeypatch) -> list[float]:
    """Record wait_idle's sleeps instead of sleeping; its clock advances 1 s per reading."""
    now = [0.0]

    def monotonic() -> float:
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(observations, "time", SimpleNamespace(monotonic=monotonic))
    slept: list[float] = []
    real = asyncio.sleep

    async def sleep(s: float) -> None:
        slept.append(s)
        await real(0)

    monkeypatch.setattr(observations.asyncio, "sleep", sleep)
    return slept


def test_check_drains_gives_each_endpoint_its_baseline_and_polls_until_idle(monkeypatch):
    slept = _sleeps(monkeypatch)
    calls: dict[str, int] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        host = req.url.host
        calls[host] = calls.get(host, 0) + 1
        running = 1 if calls[host] < 3 else 0  # idle from the third scrape on
        return httpx.Response(200, text=PAGE.format(running=running, waiting=0, kv=0.5))

    async def go(**kw):
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return await check_drains(http, [Endpoint("decode", "http://d"), Endpoint("prefill", "http://p")],
                                      {"decode": 0.5}, drain_s=20.0, **kw)

    out = asyncio.run(go())
    assert [(d.instance, d.idle) for d in out] == [("decode", True), ("prefill", False)]  # prefill: KV above 0
    assert out[0].baseline_kv == 0.5 and out[1].baseline_kv == 0.0  # prefill: no baseline given -> 0
    assert calls["d"] == 3  # polled until idle, within drain_s (not given up after one interval)
    assert (out[0].samples, out[1].samples) == (3, calls["p"])  # every snapshot read is counted
    assert set(slept) == {0.5}  # the default poll interval
    slept.clear()
    calls.clear()
    asyncio.run(go(interval_s=0.01))
    assert set(slept) == {0.01}


@pytest.mark.parametrize("baseline", [{}, {"other": 0.9}])
def test_check_drains_without_a_baseline_compares_with_an_empty_pool(baseline, monkeypatch):
    _sleeps(monkeypatch)

    async def go():
        h = httpx.MockTransport(lambda r: httpx.Response(200, text=PAGE.format(running=0, waiting=0, kv=0.0)))
        async with httpx.AsyncClient(transport=h) as http:
            return await check_drains(http, [Endpoint("decode", "http://d")], baseline, drain_s=1.0)

    assert [(d.idle, d.baseline_kv) for d in asyncio.run(go())] == [(True, 0.0)]


# -------------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------- drain

def row(t: float, inst: str = "decode", waiting=0.0, running=0.0, kv=0.0) -> dict:
    return {"t": t, "instance": inst, "num_requests_waiting": waiting, "num_requests_running": running,
            "kv_cache_usage_perc": kv}


def test_drain_from_samples_needs_a_sample_in_the_window():
    d = drain_from_samples("decode", [row(1.0), row(20.0)], 0.0, t_end=5.0, drain_s=10.0)
    assert d.idle is False and d.error == "no sample within 10 s after the wave"
    d = drain_from_samples("decode", [row(6.0, inst="prefill")], 0.0, t_end=5.0, drain_s=10.0)
    assert d.idle is False


def test_drain_from_samples_first_idle_sample_in_the_window_decides():
    rows = [row(3.0), row(6.0, waiting=1), row(8.0, kv=0.1), row(9.0), row(15.0), row(16.0, waiting=3)]
    d = drain_from_samples("decode", rows, 0.0, t_end=5.0, drain_s=10.0)
    assert d.idle is True and d.after_s == 4.0
    d = drain_from_samples("decode", rows[:3], 0.0, t_end=5.0, drain_s=10.0)
    assert d.idle is False and d.final["kv_usage"] == 0.1 and d.error == ""
    assert drain_from_samples("decode", [row(8.0, kv=0.1)], 0.1, t_end=5.0, drain_s=10.0).idle is True
    # the window's edges are inside it
    assert drain_from_samples("decode", [row(5.0)], 0.0, t_end=5.0, drain_s=10.0).idle is True
    assert drain_from_samples("decode", [row(15.0)], 0.0, t_end=5.0, drain_s=10.0).idle is True


def test_drain_from_samples_absent_gauge_is_not_checked():
    r = row(6.0)
    r["num_requests_running"] = None
    d = drain_from_samples("decode", [r], 0.0, t_end=5.0, drain_s=10.0)
    assert d.idle is None and "vllm:num_requests_running absent" in d.error


def test_drain_from_snapshots():
    busy = m.parse_metrics(TEMPLATE.format(**LIVELOCK), "decode", t=6.0)
    idle = m.parse_metrics(TEMPLATE.format(**IDLE), "decode", t=7.0)
    other = m.parse_metrics(TEMPLATE.format(**IDLE), "prefill", t=6.5)
    d = drain_from_samples("decode", [idle, other, busy], 0.0, t_end=5.0, drain_s=10.0)
    assert d.idle is True and d.after_s == 2.0
    assert drain_from_samples("decode", [busy, other], 0.0, t_end=5.0, drain_s=10.0).idle is False


def test_describe_drain_states_the_leak_in_blocks():
    leak = DrainResult("decode", False, 10.0, 0.25, {"waiting": 0.0, "running": 0.0, "kv_usage": 0.75})
    text = describe_drain(leak, 4)
    assert text.startswith(leak.describe())
    assert text.endswith(" = 3.0 of 4 usable blocks held (2.0 blocks' worth above the baseline)")
    assert describe_drain(leak, None).endswith(" (usable block count unknown)")
    idle = DrainResult("decode", True, 1.0, 0.25, {"waiting": 0.0, "running": 0.0, "kv_usage": 0.25})
    assert describe_drain(idle, 4) == idle.describe()
    at_base = DrainResult("decode", False, 10.0, 0.25, {"waiting": 1.0, "running": 0.0, "kv_usage": 0.25})
    assert describe_drain(at_base, 4) == at_base.describe()  # waiting, no KV above the baseline
    err = DrainResult("decode", False, 10.0, 0.0, {"kv_usage": 0.5}, "ConnectError")
    assert describe_drain(err, 4) == err.describe()
