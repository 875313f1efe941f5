"""The deployment's per-request baseline: seconds per P/D request, measured once per P->D pair
right after its warm-up (:func:`measure_baseline`).

The judging windows that follow the deployment's speed (rig.judge.windows) derive their bounds
from it, so a suite is judged as fairly on a 2-core CPU host (a P/D request in ~0.1-1 s) as on a
GPU (milliseconds). It is measured, not configured: the same hardware is slower under load, and a
figure from another host says nothing about this one.

A round trip is what a scenario's P/D request is (rig.workload.edge): the prefill hop to P, then
the decode hop to D with P's ``kv_transfer_params``, timed from sending the prefill hop to D's
whole answer. After the warm-up the first-request costs (JIT, the NIXL handshake) are paid, so the
round trips measure the steady request; the median of :data:`ROUND_TRIPS` is the baseline, so one
slow round trip (a host scheduling hiccup) does not move it. Any failed round trip leaves no
baseline (None, with the reason): a failure says nothing about how long a request takes, and the
bounds then take their absolute caps.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from rig.cluster import proctree
from rig.transport.client import Transport
from rig.transport.endpoint import Endpoint
from rig.transport.records import classify, prefill_failure
from rig.workload.prompts import make_prompt
from rig.workload.warmup import WarmupWatch

ROUND_TRIPS = 3
PROMPT_TOKENS = 8  # a short prompt: the request's fixed costs, not prefill compute, are what a window bounds
MAX_TOKENS = 2
# Prompt seeds of the round trips: far from the warm-up's (7, 11, 21 + path index) and the
# scenarios' (rig.workload.prompts.seed_of), so neither instance finds them in its prefix cache.
SEED = 9_300_001


@dataclass(frozen=True)
class RequestBaseline:
    """One decode's measured per-request time: ``seconds`` (the median of ``round_trips_s``; None
    when a round trip failed, ``error`` then says which and why), measured with ``prompt_tokens``-
    token prompts and ``max_tokens`` generated tokens through ``prefill`` -> ``decode``;
    ``host_load_1m``: the rig host's 1-minute load average when the round trips ended (None:
    unknown), what the latency check compares the load around a scenario with
    (rig.judge.windows.load_slowdown)."""

    decode: str
    prefill: str
    seconds: float | None
    round_trips_s: list[float] = field(default_factory=list)
    prompt_tokens: int = PROMPT_TOKENS
    max_tokens: int = MAX_TOKENS
    planned: int = ROUND_TRIPS
    error: str = ""
    host_load_1m: float | None = None

    def describe(self) -> str:
        """'0.0363 s (median of 3 P/D round trips ...)', or the reason it is None: the log line's words."""
        return f"{self.seconds:g} s ({self.method})" if self.seconds is not None else self.error

    @property
    def method(self) -> str:
        """How it was measured, in words: 'median of 3 P/D round trips prefill -> decode after the
        warm-up (8-token prompt, 2 tokens each)'."""
        return (f"median of {self.planned} P/D round trips {self.prefill} -> {self.decode} after the warm-up "
                f"({self.prompt_tokens}-token prompt, {self.max_tokens} tokens each)")


async def measure_baseline(client: Transport, prefill: Endpoint, decode: Endpoint, rounds: int = ROUND_TRIPS,
                           prompt_tokens: int = PROMPT_TOKENS, max_tokens: int = MAX_TOKENS) -> RequestBaseline:
    """``rounds`` P/D round trips ``prefill`` -> ``decode`` one after another (prefill hop, then the
    decode hop with P's ``kv_transfer_params``; distinct ``prompt_tokens``-token prompts, ``max_tokens``
    generated), each timed in seconds from sending the prefill hop to D's whole answer; the baseline
    is their median. The first failed round trip (a hop's error, no ``kv_transfer_params``, an empty
    answer) stops the measurement: ``seconds`` None, ``error`` naming the round trip and the hop's
    error. Raises ValueError when ``rounds`` < 1 (a median of nothing); never raises for a failed
    request (hops return their errors, rig.transport.client)."""
    if rounds < 1:
        raise ValueError(f"measure_baseline: rounds must be >= 1, got {rounds}")
    out = RequestBaseline(decode.name, prefill.name, None, [], prompt_tokens, max_tokens, rounds)
    times: list[float] = []
    for k in range(rounds):
        prompt = make_prompt(prompt_tokens, SEED + k)
        t = time.monotonic()
        p_hop = await client.prefill(prefill, prompt)
        failure = prefill_failure(p_hop)
        if failure is not None:
            return _failed(out, times, f"round trip {k + 1} of {rounds}: {failure[1]}")
        d_hop = await client.decode(decode, prompt, max_tokens, p_hop.kv_transfer_params or {})
        if classify(d_hop) != "ok":
            return _failed(out, times, f"round trip {k + 1} of {rounds}: decode: {d_hop.error or 'empty answer'}")
        times.append(time.monotonic() - t)
    load = proctree.host_load()  # through the module: tests give fake servers an idle host
    return RequestBaseline(decode.name, prefill.name, round(statistics.median(times), 4),
                           [round(s, 4) for s in times], prompt_tokens, max_tokens, rounds,
                           host_load_1m=round(load[0], 2) if load is not None else None)


def _failed(base: RequestBaseline, times: list[float], error: str) -> RequestBaseline:
    """``base`` without a baseline: the round trips timed so far and ``error``."""
    return RequestBaseline(base.decode, base.prefill, None, [round(s, 4) for s in times], base.prompt_tokens,
                           base.max_tokens, base.planned, error)


def unmeasured(prefill: str, decode: str, why: str) -> RequestBaseline:
    """The baseline of a pair that was not measured at all (an instance died at its warm-up): None
    with ``why``."""
    return RequestBaseline(decode, prefill, None, [], PROMPT_TOKENS, MAX_TOKENS, ROUND_TRIPS, why)


async def baseline_after_warmup(client: Transport, prefill: Endpoint, decode: Endpoint,
                                watch: WarmupWatch) -> RequestBaseline:
    """The pair's baseline once :func:`rig.workload.warmup.warm_up` ran with ``watch``:
    :func:`measure_baseline`, or :func:`unmeasured` with the reason when an instance died at the
    warm-up or its plain P/D round trip failed (a timed round trip would meet the same failure and
    wait out its timeout). The one rule ``pdrig up`` and the suite runner share."""
    if watch.died:
        return unmeasured(prefill.name, decode.name,
                          f"not measured: {', '.join(sorted(watch.died))} died at the warm-up")
    if decode.name in watch.pd_failed:
        return unmeasured(prefill.name, decode.name,
                          f"not measured: the warm-up's P/D round trip failed ({watch.pd_failed[decode.name]})")
    return await measure_baseline(client, prefill, decode)
