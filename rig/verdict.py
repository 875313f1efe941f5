"""Step 6 of the rig's flow: the verdict, from observations and the scenario's expectation.

Every scenario gets named checks (completed in its deadline, token counts, KV really pulled over
NIXL, parity with the reference, no process died, no fatal log line, instances idle again).
Then the expectation decides, like pytest's *strict* xfail:

- no known issue for this vLLM version: PASS when every check holds, else FAIL;
- a known issue whose version range contains the server's version: XFAIL when its symptom
  (e.g. a stall) is observed and the checks the symptom does not explain still hold; XPASS when
  everything passes (which fails the run: "known issue fixed: update the expectation"); FAIL
  for any other failure;
- ERROR when the rig itself could not run the scenario.

A run passes when every scenario is PASS or XFAIL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rig.config import ScenarioConfig
from rig.observations import ScenarioObservation
from rig.parity import summarize

PASSING = ("PASS", "XFAIL")
# Checks a known issue's symptom can explain; the others must hold even for an XFAIL. A stalled
# request the rig abandons leaves its blocks on P to expire, hence kv-integrity.
SYMPTOM_CHECKS = ("completed", "token-counts", "kv-pulled", "parity", "kv-integrity")


@dataclass(frozen=True)
class Check:
    """One named check: ``ok`` and a short human ``detail``.

    ``ok`` is tri-state: True (looked, held), False (looked, failed), None (could not look: no
    metric, no log, no answer): "not checked", which never counts as ok.
    """

    name: str
    ok: bool | None
    detail: str

    @property
    def state(self) -> str:
        """'ok' | 'failed' | 'not checked'."""
        return {True: "ok", False: "failed", None: "not checked"}[self.ok]


@dataclass
class ScenarioVerdict:
    """The verdict of one scenario with the checks it rests on."""

    scenario: str
    verdict: str  # PASS | FAIL | XFAIL | XPASS | ERROR
    expectation: str
    reason: str
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True for PASS and XFAIL."""
        return self.verdict in PASSING

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict."""
        return asdict(self)


def completion_checks(sc: ScenarioConfig, obs: ScenarioObservation) -> list[Check]:
    """``completed`` (every request ``ok``) and ``token-counts`` (``usage`` as ``sc.expect``
    says, and as many ``token_ids`` as ``usage`` claims): the checks every kind shares."""
    recs = obs.records
    out: list[Check] = []
    bad = [r for r in recs if r.outcome != "ok"]
    out.append(Check("completed", not bad and bool(recs),
                     f"{len(recs) - len(bad)}/{len(recs)} completed" +
                     (f"; {bad[0].request_id}: {bad[0].outcome} {bad[0].diagnosis}".rstrip() if bad else "")))
    exp = sc.expect
    wrong = []
    for r in recs:
        if r.outcome != "ok":
            continue
        if exp.completion_tokens is not None and r.completion_tokens != exp.completion_tokens:
            wrong.append(f"{r.request_id}: completion_tokens {r.completion_tokens} != {exp.completion_tokens}")
        if exp.total_tokens is not None and r.total_tokens != exp.total_tokens:
            wrong.append(f"{r.request_id}: total_tokens {r.total_tokens} != {exp.total_tokens}")
        if r.decode and r.decode.token_ids is not None and r.completion_tokens is not None \
                and len(r.decode.token_ids) != r.completion_tokens:
            wrong.append(f"{r.request_id}: {len(r.decode.token_ids)} token_ids but usage says {r.completion_tokens}")
    answered = sum(r.outcome == "ok" for r in recs)
    out.append(Check("token-counts", not wrong and answered > 0,
                     "; ".join(wrong) or (f"as expected ({exp.completion_tokens} + prompt = {exp.total_tokens})"
                                          if answered else "no answer to count")))
    return out


def _checks(sc: ScenarioConfig, obs: ScenarioObservation) -> list[Check]:
    out = completion_checks(sc, obs)
    answered = sum(r.outcome == "ok" for r in obs.records)
    ev = obs.evidence
    # Every answered request's prompt must have come over NIXL (the edge prompts are new to D),
    # so one request recomputed locally next to a transferred one still fails the check.
    ok_recs = [r for r in obs.records if r.outcome == "ok"]
    want_tokens = sum(len(r.prompt) for r in ok_recs)
    pulled = (ev is not None and ev.nixl_bytes > 0 and ev.external_prompt_tokens >= want_tokens
              and ev.nixl_transfers >= len(ok_recs))
    out.append(Check("kv-pulled", pulled and answered > 0,
                     "no answered request to show a transfer for" if answered == 0 else
                     (f"nixl {ev.nixl_bytes:.0f} B in {ev.nixl_transfers:.0f} transfers, "
                      f"{ev.external_prompt_tokens:.0f} prompt tokens from external_kv_transfer "
                      f"(expected >= {want_tokens} in >= {len(ok_recs)} transfers)")
                     if ev else "no decode metrics"))
    if sc.parity:
        ps = summarize(obs.parity)
        first = next((p for p in obs.parity if p and p.status != "equal"), None)
        out.append(Check("parity", ps["compared"] == answered and ps["diverged"] == 0 and ps["refused"] == 0
                         and answered > 0,
                         f"{ps['equal']}/{answered} equal" + (f"; {first.describe()}" if first else "")))
    out.append(Check("alive", not obs.dead,
                     "all processes alive" if not obs.dead else
                     "died: " + ", ".join(f"{n} (exit {rc})" for n, rc in obs.dead.items())))
    fatal = {k: v for k, v in obs.fatal_lines.items() if v}
    out.append(Check("no-fatal-log", not fatal,
                     "no fatal log lines" if not fatal else
                     "; ".join(f"{k}: {v[0][:160]}" for k, v in fatal.items())))
    out.append(kv_integrity_check(obs))
    not_idle = [d for d in obs.drains if not d.idle]
    out.append(Check("idle-after", not not_idle and bool(obs.drains),
                     "; ".join(d.describe() for d in (not_idle or obs.drains)) or "not checked"))
    return out


def kv_integrity_check(obs: ScenarioObservation, answered_ids: set[str] | None = None) -> Check:
    """``kv-integrity``: no request of this scenario that D *answered* had its KV read after
    prefill released it. vLLM's prefill logs ``Potentially invalid KV blocks for unrecognized
    request <id> ... They may have expired`` (vllm/.../nixl/pull_worker.py) naming its own request
    id, which it returned to us as ``kv_transfer_params.remote_request_id``; a match is stale KV
    that reached a client as HTTP 200. Lines for abandoned requests (stalls, cancellations) and
    "Releasing expired KV blocks ... retrieved by 0 remote worker(s)" are lease housekeeping.
    ``answered_ids`` defaults to the ids of ``obs.records`` with outcome ok (or a parity
    divergence, which is what stale KV looks like)."""
    if answered_ids is None:
        answered_ids = {(r.prefill.kv_transfer_params or {}).get("remote_request_id")
                        for r in obs.records if r.outcome == "ok" and r.prefill is not None} - {None}
    hits = [ln for lines in obs.kv_integrity_lines.values() for ln in lines
            if "Potentially invalid KV blocks" in ln and any(i and i in ln for i in answered_ids)]
    return Check("kv-integrity", not hits,
                 "no answered request read released KV blocks" if not hits else
                 f"{len(hits)} answered request(s) read KV blocks prefill had released (lease expired): "
                 + hits[0][hits[0].find("Potentially"):][:160])


def _symptom_seen(symptom: str, obs: ScenarioObservation, failed: list[Check]) -> bool:
    if symptom == "stall":
        return any(r.outcome == "stalled" for r in obs.records)
    if symptom == "stale-kv":
        return (any(c.name == "kv-integrity" for c in failed)
                or any(p is not None and p.status == "diverged" for p in obs.parity))
    return any(r.outcome not in ("ok", "stalled") for r in obs.records)


def judge(sc: ScenarioConfig, obs: ScenarioObservation) -> ScenarioVerdict:
    """The verdict for scenario ``sc`` from ``obs`` (rules in the module docstring)."""
    ki = sc.known_issue if (sc.known_issue and obs.vllm_version and
                            sc.known_issue.applies_to(obs.vllm_version)) else None
    expectation = (f"xfail: {ki.id} ({ki.symptom}) on vLLM {ki.affects}" if ki else "pass")
    if obs.error:
        return ScenarioVerdict(sc.name, "ERROR", expectation, obs.error)
    checks = _checks(sc, obs)
    failed = [c for c in checks if not c.ok]
    if sc.tamper:
        return _judge_tampered(sc, checks)
    if ki is None:
        if not failed:
            return ScenarioVerdict(sc.name, "PASS", expectation, "all checks hold", checks)
        return ScenarioVerdict(sc.name, "FAIL", expectation,
                               "; ".join(f"{c.name}: {c.detail}" for c in failed), checks)
    if not failed:
        return ScenarioVerdict(sc.name, "XPASS", expectation,
                               f"known issue fixed: update the expectation ({ki.id} no longer reproduces "
                               f"on vLLM {obs.vllm_version})", checks)
    collateral = [c for c in failed if c.name not in SYMPTOM_CHECKS]
    if _symptom_seen(ki.symptom, obs, failed) and not collateral:
        diag = obs.stall_diagnosis or next((r.diagnosis for r in obs.records if r.diagnosis), "")
        if ki.symptom == "stale-kv":
            diag = "; ".join(f"{c.name}: {c.detail}" for c in failed if c.name in ("kv-integrity", "parity"))
        return ScenarioVerdict(sc.name, "XFAIL", expectation, f"{ki.id}: {diag}", checks)
    return ScenarioVerdict(sc.name, "FAIL", expectation,
                           "; ".join(f"{c.name}: {c.detail}" for c in (collateral or failed)), checks)


def _judge_tampered(sc: ScenarioConfig, checks: list[Check]) -> ScenarioVerdict:
    """A negative control passes when the tampering is *caught*: by parity (the answer differs
    from the reference of the prompt D was given) or by an error; and nothing else broke."""
    by = {c.name: c for c in checks}
    caught = [c for c in (by.get("parity"), by.get("completed")) if c is not None and not c.ok]
    collateral = [c for c in checks if not c.ok and c.name not in SYMPTOM_CHECKS]
    expectation = f"caught: {sc.tamper}"
    if caught and not collateral:
        return ScenarioVerdict(sc.name, "PASS", expectation,
                               f"tampering caught by {caught[0].name}: {caught[0].detail}", checks)
    if collateral:
        return ScenarioVerdict(sc.name, "FAIL", expectation,
                               "; ".join(f"{c.name}: {c.detail}" for c in collateral), checks)
    return ScenarioVerdict(sc.name, "FAIL", expectation,
                           f"{sc.tamper} passed silently: the answer matched the reference of the "
                           "prompt D was given, so parity cannot vouch for the KV", checks)


def run_passed(verdicts: list[ScenarioVerdict]) -> bool:
    """True when every scenario is PASS or XFAIL (and there is at least one)."""
    return bool(verdicts) and all(v.passed for v in verdicts)
