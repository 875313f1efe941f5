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

from typing import Any

from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation
from rig.transport.records import PDRecord
from rig.workload.sequence import CANCELLED

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


# Checks that fail as a consequence of a request that got no answer (no tokens to count or
# compare, nothing pulled): left out of a signature whose requests show why (stalled, refused...).
CONSEQUENCES = frozenset({"completed", "token-counts", "kv-pulled", "parity"})


def failed_hop(r: PDRecord) -> tuple[str, int | None]:
    """``(hop, HTTP status)`` of the hop that ended ``r``: the prefill hop when D was never
    reached (a P/D request refused by P, an abandoned one), else the decode hop (also the one hop
    of a straight-to-D or straight-to-P request)."""
    if r.decode is None and r.prefill is not None:
        return "prefill", r.prefill.status
    return "decode", r.decode.status if r.decode is not None else None


def refused_first(r: PDRecord) -> bool:
    """True when ``r`` was refused with a 4xx on its first hop (P's prefill hop, or the one hop of
    a one-hop route)."""
    hop, status = failed_hop(r)
    return (r.outcome == "http_error" and status is not None and 400 <= status < 500
            and (hop == "prefill" or r.prefill is None))


def _refused(r: PDRecord) -> bool:
    _, status = failed_hop(r)
    return r.outcome == "http_error" and status is not None and 400 <= status < 500


def reference_serves(r: PDRecord) -> bool:
    """True for a refusal (a 4xx on a hop) whose non-disaggregated reference, sent the same request
    (rig.observe.parity.record_parity), was answered: P/D refuses what the reference serves."""
    ref = r.reference
    return _refused(r) and ref is not None and ref.status is not None and 200 <= ref.status < 300


def refusal_excused(r: PDRecord) -> bool:
    """True for a refusal that is not a finding: the reference, sent the same request, refused it
    too; or no reference was sent (parity off) and it was the first hop's (the reference is that
    same request served by P, so it gets the same refusal). A 4xx from D after P accepted the
    prompt, without a reference, is not excused."""
    if not _refused(r):
        return False
    ref = r.reference
    if ref is None:
        return refused_first(r)
    return ref.status is not None and 400 <= ref.status < 500


def never_sent(r: PDRecord) -> bool:
    """True for a sequence request that was never sent because the event its step waited for
    never came (rig/workload/sequence.py: "not sent: step ... never reached ..."): a consequence
    of what ended the earlier step, not a symptom of its own."""
    return r.outcome == "cancelled" and r.diagnosis.startswith("not sent:")


def cut_on_purpose(r: PDRecord) -> bool:
    """True for a request the action itself closed (``cancel_after_ms``,
    rig/workload/sequence.py): the cut is the action, not a symptom."""
    return r.outcome == "cancelled" and r.diagnosis.startswith(CANCELLED)


def consistent_refusal(obs: ScenarioObservation) -> bool:
    """True when every request that did not answer was :func:`refusal_excused` or
    :func:`never_sent` (behind such a refusal), and at least one was refused."""
    bad = [r for r in obs.records if r.outcome != "ok"]
    return any(refusal_excused(r) for r in bad) and all(refusal_excused(r) or never_sent(r) for r in bad)


def crossed_answers(obs: ScenarioObservation) -> list[str]:
    """KV isolation: ids of requests whose diverged answer (parity) equals, token for token, the
    answer of another request of the action with a different prompt that matched its own
    reference: the request was served from that prompt's KV. ``obs.parity`` is aligned with
    ``obs.records`` (rig.observe.parity); [] when they are not."""
    if len(obs.parity) != len(obs.records):
        return []
    good: dict[tuple, Any] = {}
    for r, p in zip(obs.records, obs.parity, strict=True):
        if p is not None and p.status == "equal" and r.decode is not None and r.decode.token_ids:
            good[tuple(r.decode.token_ids)] = r.prompt
    out = []
    for r, p in zip(obs.records, obs.parity, strict=True):
        toks = tuple(r.decode.token_ids or ()) if r.decode is not None else ()
        if p is not None and p.status == "diverged" and toks in good and good[toks] != r.prompt:
            out.append(r.request_id)
    return out


def signature_of(verdict: ScenarioVerdict, obs: ScenarioObservation, roles: dict[str, str]) -> str | None:
    """``"<VERDICT> <failed checks joined by +> [<symptoms>]"`` for a violation, None for PASS
    (and XFAIL: not produced, the explorer's scenarios declare no known issue) and for an action
    whose only failures are refusals the reference gives too (:func:`consistent_refusal`).
    Symptoms are the outcomes of the requests the failed checks name (``http_error:<hop>:<status>``;
    a refusal the reference gives too is no symptom), ``answer-of-another-prompt``
    (:func:`crossed_answers`) and ``died:<role>``; ``roles`` maps instance names to prefill/decode
    (the same bug on another instance name is the same signature). Checks that only follow from a missing answer
    (:data:`CONSEQUENCES`) are left out when a request shows why it has none, or when they blame
    only requests cut on purpose (:func:`cut_on_purpose`: such a cut is the action, never a symptom). An ERROR without
    failed checks is named by its reason's first clause."""
    if verdict.verdict in ("PASS", "XFAIL"):
        return None
    if not obs.dead and consistent_refusal(obs) and all(
            c.name in CONSEQUENCES for c in verdict.checks if c.ok is False):
        return None
    cut = {r.request_id for r in obs.records if cut_on_purpose(r)}
    # a check that only restates that requests were cut on purpose (no answer to count, compare or
    # show pulled: it blames cut requests only, or none while cut requests are all the P/D ones) is no symptom
    restates = {c.name for c in verdict.checks if c.ok is False and c.name in CONSEQUENCES and cut
                and set(c.requests) <= cut and all(r.outcome == "ok" or r.request_id in cut or never_sent(r)
                                                    for r in obs.records)}
    failed = sorted({c.name for c in verdict.checks if c.ok is False} - restates)
    if restates and not failed and not obs.dead:
        return None
    blamed = {rid for c in verdict.checks if c.ok is False and c.name not in restates for rid in c.requests}
    symptoms: set[str] = set()
    for r in obs.records:
        if r.outcome == "ok" or (blamed and r.request_id not in blamed) or refusal_excused(r) or never_sent(r) \
                or cut_on_purpose(r):
            continue
        hop, status = failed_hop(r)
        kind = "refused-reference-serves" if reference_serves(r) else r.outcome
        symptoms.add(f"{kind}:{hop}:{status}" if r.outcome == "http_error" else r.outcome)
    symptoms |= {f"died:{roles.get(n, n)}" for n in obs.dead}
    if crossed_answers(obs):
        symptoms.add("answer-of-another-prompt")
    if symptoms - {"cancelled"}:
        failed = [c for c in failed if c not in CONSEQUENCES]
    if "stalled" in symptoms:  # the stall check restates the symptom
        failed = [c for c in failed if c != "no-stall"]
    what = "+".join(failed) or ("-" if symptoms else verdict.reason.split(":")[0][:60])
    return f"{verdict.verdict} {what} [{' '.join(sorted(symptoms))}]"


def could_not_judge(verdict: ScenarioVerdict, obs: ScenarioObservation) -> bool:
    """Whether a verdict is an ERROR with nothing failed and no instance dead: a required check
    could not look (rig.judge.verdict, rule 4: "inconclusive"), or the rig could not run the action.
    That is no vLLM failure and no finding; the explorer lists the action as not judged."""
    return verdict.verdict == "ERROR" and not obs.dead and not any(c.ok is False for c in verdict.checks)


def plausible(symptom_kind: str, signature: str) -> bool:
    """Whether a known issue of ``symptom_kind`` could explain a violation with ``signature``
    (:data:`SYMPTOM_EVIDENCE`); unknown kinds are always tried."""
    parts = SYMPTOM_EVIDENCE.get(symptom_kind)
    return parts is None or any(p in signature for p in parts)
