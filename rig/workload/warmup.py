"""The warm-up before measured traffic: what `pdrig e2e` (each phase) and `pdrig up` send first.

A fresh vLLM CPU instance pays JIT compilation and first-request costs on its first request,
and the first P->D round trip pays the NIXL handshake and D's first UCX transfer (seconds on a
2-core CPU host: docs/measurements.md). Sent here, outside any deadline, stall window or wave
statistics.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from rig.transport.client import Transport
from rig.transport.endpoint import Endpoint
from rig.workload.prompts import make_prompt


async def warm_up(client: Transport, http: httpx.AsyncClient, prefill: Endpoint, decode: Endpoint,
                  log: Callable[[str], None]) -> tuple[str, list[str]]:
    """One short direct request (8-token prompt, 2 tokens) to each instance, then one throw-away
    P/D round trip. Returns ``(vLLM version from decode's /version or "", names of instances
    whose direct request failed)``. Failures are logged, never raised: the measured traffic meets
    the same failure and is judged on it."""
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
    try:
        return (await http.get(decode.url + "/version")).json().get("version", ""), failed
    except (httpx.HTTPError, ValueError):
        return "", failed
