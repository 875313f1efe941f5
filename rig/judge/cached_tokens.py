"""``cached-tokens`` (bug record R15): D must not report as cached a prompt it pulled over NIXL.

With ``--enable-prompt-tokens-details`` vLLM answers ``usage.prompt_tokens_details.cached_tokens``
(vllm/entrypoints/openai/completion/serving.py). The upstream reports (vllm #43370, #44607,
#47136; PRs #46357, #46898; vllm-ascend #8910; vllm-project/router #193) show D counting every
transferred token as cached: a cold 96-token prompt through P/D reads 95 or 96 cached tokens on
D, and routers that return D's usage bill the client for a cache hit that never happened. The
tokens D may honestly call cached are P's real prefix-cache hits (what P's own hop reports,
which vLLM 0.32.0 forwards as ``kv_transfer_params.remote_prefill_cached_tokens``,
vllm/v1/engine/output_processor.py) plus D's own local prefix-cache hits (D's
``prompt_tokens_by_source{source="local_cache_hit"}`` delta over the scenario, an upper bound
shared by the scenario's requests).

So per answered request: D's ``cached_tokens`` <= P's ``cached_tokens`` + D's local hits. Failed on
the requests over the bound; not checked when no answered request has ``prompt_tokens_details``
on both hops (the instances were started without the flag) or D's local hits are unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rig.judge.checks import Check
from rig.observe.observations import ScenarioObservation
from rig.transport.records import PDRecord

NAME = "cached-tokens"
FLAG = "--enable-prompt-tokens-details"


def cached_of(usage: dict[str, Any] | None) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` (tokens), None when the answer has none."""
    details = (usage or {}).get("prompt_tokens_details")
    if not isinstance(details, dict) or details.get("cached_tokens") is None:
        return None
    return int(details["cached_tokens"])


@dataclass(frozen=True)
class CachedTokens:
    """One answered P/D request's ``cached_tokens`` (tokens): ``p`` on the prefill hop, ``d`` on the
    decode hop, ``prompt`` = D's ``usage.prompt_tokens`` (the chat template's tokens included), else the
    prompt's own length."""

    record: PDRecord
    p: int
    d: int
    prompt: int


def cached_tokens_seen(obs: ScenarioObservation) -> list[CachedTokens]:
    """:class:`CachedTokens` of every answered P/D request of ``obs.records`` whose two hops report
    ``prompt_tokens_details`` (empty when the instances run without ``--enable-prompt-tokens-details``)."""
    out = []
    for r in obs.records:
        if r.outcome != "ok" or r.prefill is None or r.decode is None:
            continue
        p, d = cached_of(r.prefill.usage), cached_of(r.decode.usage)
        if p is not None and d is not None:
            out.append(CachedTokens(r, p, d, int((r.decode.usage or {}).get("prompt_tokens") or r.prompt_len)))
    return out


def overcounted(obs: ScenarioObservation) -> list[CachedTokens] | None:
    """The requests whose D ``cached_tokens`` exceeds P's hits + D's local hits (the bound in the module
    docstring); None when the bound cannot be computed (no D local-hit measurement)."""
    if obs.evidence is None:
        return None
    local = int(obs.evidence.cached_prompt_tokens)
    return [c for c in cached_tokens_seen(obs) if c.d > c.p + local]


def cached_tokens_check(obs: ScenarioObservation) -> Check:
    """The ``cached-tokens`` check over ``obs.records`` (see the module docstring)."""
    seen = cached_tokens_seen(obs)
    if not seen:
        return Check(NAME, None, "not checked: no answered request has usage.prompt_tokens_details on both hops "
                                 f"(start P and D with {FLAG})")
    over = overcounted(obs)
    if over is None or obs.evidence is None:
        return Check(NAME, None, "not checked: D's prompt_tokens_by_source (local_cache_hit) was not measured")
    local = int(obs.evidence.cached_prompt_tokens)
    shown = "; ".join(f"{c.record.request_id}: P {c.p}, D {c.d} of {c.prompt}" for c in (over or seen)[:3])
    if over:
        return Check(NAME, False, f"D reports more cached prompt tokens than P's hits + D's {local} local hit(s): "
                                  f"{shown}", tuple(c.record.request_id for c in over))
    return Check(NAME, True, f"D's cached_tokens within P's hits + D's {local} local hit(s): {shown}")
