"""Drain to idle after a wave: the check on recorded samples, the live wait for every
endpoint, and the leak described in blocks.

After every wave both P and D must drain back to idle (waiting 0, running 0, KV usage at the
pre-wave baseline) within ``drain_s`` (:func:`rig.observe.observations.wait_idle`); otherwise the
verdict names the leak: instance, gauge, and how many blocks' worth (KV usage x usable blocks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx

from rig.observe import metrics as m
from rig.observe.observations import KV_EPS, DrainResult, absent_gauges, idle_verdict, wait_idle
from rig.transport.endpoint import Endpoint


def drain_from_samples(instance: str, samples: Sequence[m.MetricSnapshot | dict[str, Any]], baseline_kv: float,
                       t_end: float, drain_s: float) -> DrainResult:
    """The drain check on recorded samples: did ``instance`` reach idle (waiting 0, running 0,
    KV usage <= baseline) at a sample taken within ``drain_s`` after ``t_end``?

    ``samples`` are snapshots or timeline rows (keys as in timeline.jsonl, ``t`` monotonic).
    The verdict is drawn from the first idle sample, else from the last sample in the window; the
    result's ``samples`` counts the samples of ``instance`` in the window up to that one.
    """
    last: dict[str, float | None] = {}
    seen = 0  # samples of ``instance`` in the window
    for s in sorted(samples, key=lambda s: s.t if isinstance(s, m.MetricSnapshot) else s["t"]):
        if isinstance(s, m.MetricSnapshot):
            if s.instance != instance:
                continue
            t, state = s.t, m.idle_state(s)
        else:
            if s.get("instance") != instance:
                continue
            t = s["t"]
            state = {"waiting": s.get("num_requests_waiting"), "running": s.get("num_requests_running"),
                     "kv_usage": s.get("kv_cache_usage_perc")}
        if t < t_end or t > t_end + drain_s:
            continue
        seen, last = seen + 1, state
        idle = idle_verdict(state, baseline_kv)
        if idle is None:  # an absent gauge is never idle
            return DrainResult(instance, None, t - t_end, baseline_kv, state, absent_gauges(state), seen)
        if idle:
            return DrainResult(instance, True, t - t_end, baseline_kv, state, samples=seen)
    return DrainResult(instance, False, drain_s, baseline_kv, last,
                       "" if seen else f"no sample within {drain_s:g} s after the wave", seen)


def describe_drain(d: DrainResult, usable_blocks: int | None) -> str:
    """:meth:`DrainResult.describe` plus the leak in blocks: ``kv_usage x usable blocks``."""
    text = d.describe()
    kv = d.final.get("kv_usage") or 0.0
    if not d.idle and not d.error and kv > d.baseline_kv + KV_EPS:
        if usable_blocks:
            held, base = kv * usable_blocks, d.baseline_kv * usable_blocks
            text += (f" = {held:.1f} of {usable_blocks} usable blocks held "
                     f"({held - base:.1f} blocks' worth above the baseline)")
        else:
            text += " (usable block count unknown)"
    return text


async def check_drains(http: httpx.AsyncClient, endpoints: list[Endpoint], baseline_kv: dict[str, float],
                       drain_s: float, interval_s: float = 0.5) -> list[DrainResult]:
    """:func:`rig.observe.observations.wait_idle` for every endpoint, concurrently."""
    return list(await asyncio.gather(*(wait_idle(http, e.name, e.url, baseline_kv.get(e.name, 0.0), drain_s, interval_s)
                                       for e in endpoints)))
