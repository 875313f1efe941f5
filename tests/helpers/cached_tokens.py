"""Records whose hops report cached prompt tokens, and the 96-token observation the cached-tokens
check is tested on."""

from __future__ import annotations

from rig.observe.observations import ScenarioObservation, TransferEvidence
from tests.helpers.verdict_records import obs_of


def with_cached(rec, p: int | None, d: int | None, n: int = 96):
    """``rec`` with P's and D's ``usage.prompt_tokens_details.cached_tokens`` (None = no details)."""
    if p is not None:
        rec.prefill.usage = {**rec.prefill.usage, "prompt_tokens_details": {"cached_tokens": p}}
    if d is not None:
        rec.decode.usage = {**rec.decode.usage, "prompt_tokens_details": {"cached_tokens": d}}
    return rec


def obs96(*recs, local_hits: float = 0.0, version: str = "0.32.0", parity: list | None = None) -> ScenarioObservation:
    obs = obs_of(list(recs), parity=parity, version=version)
    obs.evidence = TransferEvidence(nixl_bytes=1.0, nixl_transfers=len(recs), external_prompt_tokens=96.0 * len(recs),
                                    cached_prompt_tokens=local_hits)
    return obs

