"""Oracles on every action, and the signature of a violation.

The "always" properties are the rig's own checks, judged by the one verdict engine
(rig/judge/verdict.py) through the scenario kind the action runs as: token IDs and answer fields
equal the non-disaggregated reference (``parity``), every request completes with consistent usage
(``completed``, ``token-counts``), D pulled the KV (``kv-pulled``), no instance died (``alive``),
no fatal log line (``no-fatal-log``), no stall (``no-stall``, with its diagnosis), both instances
back to idle (``idle-after``: no leaked blocks), P's blocks not read after release
(``kv-integrity``), counters never decreasing (``counters-monotonic``, judged on every kind).
An action whose verdict is not PASS is a violation; its *signature* is what deduplicates it (as
known-issue signatures do): the verdict, the failed checks and the symptoms of the requests they
failed on (outcome, HTTP status, which role died), never request ids, timings or token values.
"""

from __future__ import annotations

from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation

# Known-issue symptom kind (rig/config/expectations.py) -> a part its violation's signature shows.
SYMPTOM_EVIDENCE: dict[str, tuple[str, ...]] = {
    "stall": ("stalled", "no-stall"),
    "http-error": ("http_error",),
    "crash": ("died:",),
    "stale-kv": ("parity", "kv-integrity"),
    "wrong-output": ("parity",),
    "leak": ("released-by-d", "idle-after"),
    "wrong-metrics": ("cached-tokens",),
}


def signature_of(verdict: ScenarioVerdict, obs: ScenarioObservation, roles: dict[str, str]) -> str | None:
    """``"<VERDICT> <failed checks joined by +> [<symptoms>]"`` for a violation, None for PASS
    (and XFAIL: not produced, the explorer's scenarios declare no known issue). ``roles`` maps
    instance names to prefill/decode (a death is named by role: the same bug on another
    instance name is the same signature). An ERROR without failed checks is named by its reason's
    first clause."""
    if verdict.verdict in ("PASS", "XFAIL"):
        return None
    failed = sorted({c.name for c in verdict.checks if c.ok is False})
    blamed = {rid for c in verdict.checks if c.ok is False for rid in c.requests}
    symptoms: set[str] = set()
    for r in obs.records:
        if r.outcome == "ok" or (blamed and r.request_id not in blamed):
            continue
        status = r.decode.status if r.decode is not None else None
        symptoms.add(f"{r.outcome}:{status}" if r.outcome == "http_error" and status else r.outcome)
    symptoms |= {f"died:{roles.get(n, n)}" for n in obs.dead}
    what = "+".join(failed) or verdict.reason.split(":")[0][:60]
    return f"{verdict.verdict} {what} [{' '.join(sorted(symptoms))}]"


def plausible(symptom_kind: str, signature: str) -> bool:
    """Whether a known issue of ``symptom_kind`` could explain a violation with ``signature``
    (:data:`SYMPTOM_EVIDENCE`); unknown kinds are always tried."""
    parts = SYMPTOM_EVIDENCE.get(symptom_kind)
    return parts is None or any(p in signature for p in parts)
