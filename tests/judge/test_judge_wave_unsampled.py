"""A wave's no-stall check when an instance's /metrics was never read during the wave
(rig/judge/wave_checks.py, rig/observe/timeline.py): "no instance froze" cannot be said of an
instance nobody looked at, so the check is "not checked" and a wave that requires it is not PASS;
a conclusive unexplained freeze elsewhere still FAILs."""

from __future__ import annotations

import asyncio

import httpx

from rig.judge.wave_checks import judge_wave, wave_checks
from rig.observe.timeline import TimelineSampler
from rig.transport.endpoint import Endpoint
from test_wave_checks import full_obs, healthy_wave, sc, stall


def _no_stall(w):
    return next(c for c in wave_checks(sc(), full_obs(), w) if c.name == "no-stall")


def test_an_instance_never_sampled_leaves_no_stall_not_checked_and_the_wave_not_pass():
    w = healthy_wave(samples={"prefill": 12, "decode": 0}, scrape_errors=12)
    c = _no_stall(w)
    assert c.ok is None
    assert c.detail == "not checked: decode never sampled during the wave (12 /metrics scrape(s) failed)"
    v = judge_wave(sc(), full_obs(), w)
    assert v.verdict == "ERROR" and "no-stall not checked: decode never sampled" in v.reason


def test_every_instance_sampled_reads_ok_and_an_unexplained_freeze_still_fails():
    assert _no_stall(healthy_wave(samples={"prefill": 3, "decode": 3})).ok is True
    assert _no_stall(healthy_wave()).ok is True  # a result from before samples were counted
    frozen = healthy_wave(samples={"prefill": 0, "decode": 9}, stalls=[dict(stall(), explained="")])
    c = _no_stall(frozen)
    assert c.ok is False and "UNEXPLAINED" in c.detail


def test_an_explained_freeze_beside_an_unsampled_instance_is_not_checked():
    explained = dict(stall(), explained="P's pool held by leases")
    c = _no_stall(healthy_wave(samples={"prefill": 4, "decode": 0}, stalls=[explained]))
    assert c.ok is None and c.detail.startswith("not checked: decode never sampled during the wave")
    assert "explained: P's pool held by leases" in c.detail


def test_the_sampler_counts_snapshots_per_instance_and_not_failed_scrapes():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.port == 8200:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    async def go() -> TimelineSampler:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            s = TimelineSampler(http, [Endpoint("prefill", "http://127.0.0.1:8100"),
                                       Endpoint("decode", "http://127.0.0.1:8200")], None, "w")
            await s.sample_once()
            await s.sample_once()
            return s

    s = asyncio.run(go())
    assert s.samples == {"prefill": 2, "decode": 0} and s.scrape_errors == 2


def test_every_unsampled_instance_is_named():
    c = _no_stall(healthy_wave(samples={"prefill": 0, "decode": 0}, scrape_errors=6))
    assert c.detail == "not checked: decode, prefill never sampled during the wave (6 /metrics scrape(s) failed)"
