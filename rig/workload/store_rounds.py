"""The R14 options of the store wave (``prefix-wave-store``; bug record R14, vllm #46240, #52954):
which requests are cancelled on purpose and when, which decode hops are streamed, and the prefix
cache reset between rounds. rig.workload.store runs them; the cancellation itself happens in
rig.workload.store_requests.send (the hop is closed at its time, never before).

Facts relied on (vLLM 0.32.0): ``POST /reset_prefix_cache`` is served only when the server's
env has ``VLLM_SERVER_DEV_MODE=1`` (vllm/entrypoints/launchers/api_server/routers.py registers
vllm/entrypoints/serve/dev/cache/api_router.py then; otherwise 404) and answers
``{"success": bool}``: false while blocks are still held (running requests, a NIXL lease), so a
reset is retried until it succeeds or ``store.reset_timeout_s`` passes. Without
``reset_external=true`` it empties the engine's own prefix cache only: the Mooncake store stays
warm, which is what R14 needs (D then loads the prefixes from the store again).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx

from rig.config import StoreScenarioConfig
from rig.transport.endpoint import Endpoint
from rig.transport.records import PlannedCancel

RESET_PATH = "/reset_prefix_cache"
RESET_RETRY_S = 0.5


def plan_store_cancels(routes: list[str], st: StoreScenarioConfig, seed: int) -> list[PlannedCancel | None]:
    """One entry per request of a wave (``routes``: ``store`` | ``pd`` per request):
    ``round(cancel_fraction x len(routes))`` requests, chosen with ``seed`` among those that have
    the hop ``cancel_hop`` names (``prefill``: P/D-routed ones only), get a
    :class:`~rig.transport.records.PlannedCancel` with a delay drawn uniformly from
    ``cancel_after_ms`` (ms) and its hop (``either``: prefill or decode at random on a P/D request,
    decode on a store-routed one); the others None. Deterministic for a seed."""
    rng = random.Random(seed)
    eligible = [i for i, r in enumerate(routes) if st.cancel_hop != "prefill" or r == "pd"]
    k = min(len(eligible), round(st.cancel_fraction * len(routes)))
    out: list[PlannedCancel | None] = [None] * len(routes)
    lo, hi = st.cancel_after_ms
    for i in sorted(rng.sample(eligible, k)):
        hop = st.cancel_hop
        if hop == "either":
            hop = rng.choice(("prefill", "decode")) if routes[i] == "pd" else "decode"
        out[i] = PlannedCancel(hop=hop, after_ms=round(rng.uniform(lo, hi), 1))
    return out


def streamed(mode: str, index: int) -> bool:
    """Whether request ``index`` (over the whole scenario) streams its decode hop:
    ``always`` / ``never`` / ``mixed`` (odd indexes), as the wave kinds' ``wave.stream``."""
    return mode == "always" or (mode == "mixed" and index % 2 == 1)


async def reset_prefix_cache(http: httpx.AsyncClient, ep: Endpoint, timeout_s: float) -> dict[str, Any]:
    """``POST <ep>/reset_prefix_cache`` until it answers ``{"success": true}`` or ``timeout_s``
    seconds pass. Returns the row for ``StoreObservation.resets``: ``instance``, ``status`` (last
    HTTP status, None when unreachable), ``success``, ``attempts``, ``wait_s`` and ``detail``
    (the last answer or error). Never raises for HTTP failures (they are the row's facts); an
    HTTP status other than 200 ends the retries (404 = the server is not in dev mode)."""
    t0 = time.monotonic()
    row: dict[str, Any] = {"instance": ep.name, "status": None, "success": False, "attempts": 0,
                           "wait_s": None, "detail": ""}
    while True:
        row["attempts"] += 1
        try:
            r = await http.post(ep.url + RESET_PATH, timeout=10.0)
            row["status"], row["detail"] = r.status_code, r.text.strip()[:200]
            if r.status_code != 200:
                if r.status_code == 404:
                    row["detail"] += " (404: is VLLM_SERVER_DEV_MODE=1 in the server's env?)"
                break
            if r.json().get("success") is True:
                row["success"] = True
                break
        except (httpx.HTTPError, ValueError) as e:
            row["detail"] = f"{type(e).__name__}: {e}"
        if time.monotonic() - t0 + RESET_RETRY_S > timeout_s:
            break
        await asyncio.sleep(RESET_RETRY_S)
    row["wait_s"] = round(time.monotonic() - t0, 3)
    return row
