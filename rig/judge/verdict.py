"""Step 6 of the rig's flow: the ONE verdict engine, for every scenario kind.

Kinds produce observations and named checks (:mod:`rig.judge.checks`); this module turns them into a
verdict. Like pytest's ``skipping.py`` it has a frozen :class:`Expectation` (what the scenario
expects on this vLLM version: pass, a known issue, or a caught canary, plus the checks its kind
requires) and a pure :func:`decide`, which never looks at anything but its arguments:

1. a rig error (``ScenarioObservation.error``) with no instance death -> ERROR;
2. known issue declared and P's / D's vLLM version unknown or different -> ERROR (the range
   cannot be judged), unless an instance died: a death is FAIL whatever else is unknown;
3. every failed check must be explained, else FAIL naming it. A known issue's signature
   (:mod:`rig.judge.signatures`) explains the request checks it names only on the requests that show
   the symptom, and run-level checks (alive, no-fatal-log, idle-after, no-stall) only when it
   names them; a canary's catch explains the checks it failed on the caught requests;
4. a required check that was not checked (``Check.ok is None``; also a check failed only by
   requests whose stall was inconclusive, :func:`rig.judge.checks.unsure_of_stalls`: the engine
   starved by a loaded host, or compiling) and is not explained -> ERROR
   "inconclusive: <check> not checked: <why>" (decided here: a verdict that rests on evidence
   the rig could not gather is neither PASS nor XFAIL, and it is not a vLLM failure either);
   likewise ERROR "inconclusive: no check could look" when nothing failed and no check is ok
   (e.g. a wave whose every request was cancelled on purpose, against servers whose logs and
   gauges the rig cannot read: nothing at all was judged);
5. known issue in range: signature matched -> XFAIL, nothing failed -> XPASS (fails the run:
   "known issue fixed: update the expectation"), or PASS with a note for a non-strict known
   issue (``strict: false``, pytest's xfail(strict=False): a bug whose showing depends on
   timing); canary: caught -> PASS, else FAIL
   ("canary inconclusive" when it was not answered over pulled KV, "passed silently" when it was
   and matched); otherwise PASS.

A known issue's signature seen on a version outside its ``affects`` gives FAIL "matches known
issue X, outside its declared range Y: update `affects`?". A run passes when every scenario is
PASS or XFAIL.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from packaging.version import InvalidVersion, Version

from rig.config import KnownIssue, Outcome, ScenarioConfig
from rig.config.blocks import BlockFacts
from rig.config.expectations import PromptSource
from rig.judge.checks import (
    KV_PULLED_METRICS,
    RISING_COUNTERS,
    Check,
    alive_check,
    completion_checks,
    counter_rose_check,
    fatal_log_check,
    idle_check,
    kv_integrity_check,
    not_checked_for_metrics,
    parity_check,
    unsure_of_stalls,
)
from rig.judge.counter_rules import HEALTHY_NAME, HEALTHY_RULE, counter_rules_check
from rig.judge.counters import counters_monotonic_check
from rig.judge.signatures import Match, RequestFacts, facts_of_records, match
from rig.observe.observations import ScenarioObservation
from rig.transport.records import PDRecord

__all__ = ["Check", "Expectation", "ScenarioVerdict", "decide", "judge", "expectation_of", "edge_checks",
           "canary_match", "required_checks", "run_passed", "kv_integrity_check", "REQUIRED"]

PASSING = ("PASS", "XFAIL")

# The checks each kind requires: a scenario whose required check was not checked cannot PASS
# or XFAIL. Parity drops out when the scenario sets ``parity: false``.
REQUIRED: dict[str, tuple[str, ...]] = {
    "edge": ("completed", "token-counts", "kv-pulled", "parity", "alive", "no-fatal-log", "kv-integrity",
             "idle-after"),
    "prefix-wave": ("completed", "no-errors", "no-empty", "token-counts", "kv-pulled", "prefix-hits", "parity",
                    "alive", "no-fatal-log", "kv-integrity", "no-stall", "idle-after"),
    "pressure-wave": ("completed", "no-errors", "no-empty", "token-counts", "kv-pulled", "parity", "alive",
                      "no-fatal-log", "kv-integrity", "no-stall", "idle-after"),
    "store-roundtrip": ("completed", "token-counts", "parity", "failed-loads", "store-written", "store-loaded",
                        "d-cache-cold", "not-nixl", "master-served", "master-alive", "alive", "no-fatal-log",
                        "idle-after"),
    "prefix-wave-store": ("completed", "token-counts", "parity", "failed-loads", "store-written", "store-loaded",
                          "master-alive", "alive", "no-fatal-log", "idle-after"),
    "long-generation": ("completed", "token-counts", "parity", "failed-loads", "store-written", "kv-pressure",
                        "master-alive", "alive", "no-fatal-log", "idle-after"),
    "fault": ("fault-fired", "fault-outcome", "recovery-serves", "parity", "idle-after", "alive", "no-fatal-log",
              "kv-integrity"),  # rig/workload/faults.py
    "retrieval": ("completed", "token-counts", "kv-pulled", "parity", "alive", "no-fatal-log", "kv-integrity",
                  "idle-after", "retrieval"),
    # rig/workload/sequence.py (bug record R02, R06); + kv-pulled with pd steps, + lease-reaped with pd-abandon
    # steps (rig.judge.sequence_checks.sequence_required)
    "sequence": ("completed", "token-counts", "parity", "no-stall", "idle-after", "alive", "no-fatal-log",
                 "kv-integrity"),
}
# An expected refusal (Expectation.http_status) has no answer to count, pull or compare.
REFUSAL_REQUIRED = ("completed", "alive", "no-fatal-log", "idle-after")


def required_checks(sc: ScenarioConfig, refusal: bool = False) -> tuple[str, ...]:
    """The checks scenario ``sc`` requires (:data:`REQUIRED` of its kind; parity only with
    ``sc.parity``; ``preempted`` / ``spec-drafted`` with ``expect.min_preemptions`` /
    ``min_spec_drafts``; ``counters`` with ``expect.counters``, bug record R19; :data:`REFUSAL_REQUIRED`
    when its expected outcome is an HTTP refusal) plus the ones it asks for in ``sc.require``
    (bug record R12 / R15)."""
    names = REFUSAL_REQUIRED if refusal else REQUIRED[sc.kind]
    if not refusal:
        names = names + tuple(check for f, (check, _, _) in RISING_COUNTERS.items()
                              if getattr(sc.expect, f) is not None)
    if sc.expect.counters:
        names = names + ("counters",)
    names = names + tuple(sc.require)
    return tuple(dict.fromkeys(n for n in names if sc.parity or n != "parity"))


@dataclass(frozen=True)
class Expectation:
    """What a scenario expects on the vLLM version it ran on (frozen; :func:`expectation_of`).

    ``label`` is shown in the table; ``known_issue`` is set when its ``affects`` contains the
    version, ``out_of_range`` when one is declared but the version is outside it; ``tamper``
    marks a canary; ``required`` the checks that must have been checked; ``problem`` an ERROR
    reason found before any check (versions unknown or different, outcome unknown)."""

    label: str
    required: tuple[str, ...]
    known_issue: KnownIssue | None = None
    out_of_range: KnownIssue | None = None
    tamper: str | None = None
    problem: str = ""


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


def _known(version: str) -> str:
    """``version`` when it is a PEP 440 version (local part like '+cpu' allowed), else '' (unknown:
    no /version answer, or a runner's placeholder such as 'unknown')."""
    try:
        Version(version)
        return version
    except InvalidVersion:
        return ""


def _versions(obs: ScenarioObservation) -> tuple[str, str]:
    """(P's, D's) vLLM version ('' = unknown): ``obs.versions`` per instance, D's falling back to
    ``vllm_version``."""
    return (_known(obs.versions.get(obs.prefill, "")),
            _known(obs.versions.get(obs.decode, "")) or _known(obs.vllm_version))


def expectation_of(sc: ScenarioConfig, obs: ScenarioObservation, refusal: bool = False) -> Expectation:
    """The frozen :class:`Expectation` of ``sc`` on the versions ``obs`` reports."""
    required = required_checks(sc, refusal)
    if sc.tamper:
        return Expectation(f"caught: {sc.tamper}", required, tamper=sc.tamper)
    ki = sc.known_issue
    if ki is None:
        return Expectation("pass", required)
    p_ver, d_ver = _versions(obs)
    label = f"xfail: {ki.id} ({ki.symptom.kind}) on vLLM {ki.affects}"
    if not p_ver or not d_ver:
        unknown = " and ".join(n for n, v in ((obs.prefill, p_ver), (obs.decode, d_ver)) if not v)
        return Expectation(label, required, problem=f"known issue {ki.id} applies to vLLM {ki.affects}, but the "
                                                    f"version of {unknown} is unknown (no /version answer)")
    if p_ver.split("+")[0] != d_ver.split("+")[0]:
        return Expectation(label, required, problem=f"known issue {ki.id} applies to vLLM {ki.affects}, but prefill "
                                                    f"runs {p_ver} and decode {d_ver}: judge one version at a time")
    if ki.applies_to(d_ver):
        return Expectation(label, required, known_issue=ki)
    return Expectation("pass", required, out_of_range=ki)


def _explained(c: Check, m: Match | None) -> bool:
    if m is None or not m.matched:
        return False
    if c.requests:
        return c.name in m.explains and set(c.requests) <= m.requests
    return c.name in m.run_checks


def _list(checks: list[Check]) -> str:
    return "; ".join(f"{c.name}: {c.detail}" for c in checks)


def decide(name: str, checks: list[Check], exp: Expectation, m: Match | None = None,
           error: str = "", dead: bool = False) -> ScenarioVerdict:
    """The verdict of scenario ``name`` (rules in the module docstring). Pure.

    ``m``: the known issue's signature match (also for one outside its range), or the canary's
    catch (:func:`canary_match`); ``error``: the rig could not run the scenario; ``dead``: an
    instance died (then ``error`` does not hide the death's FAIL)."""
    def v(verdict: str, reason: str) -> ScenarioVerdict:
        return ScenarioVerdict(name, verdict, exp.label, reason, checks)

    if error and not dead:
        return v("ERROR", error)
    if exp.problem and not dead:  # a death is a FAIL whatever else is unknown
        return v("ERROR", exp.problem)
    failed = [c for c in checks if c.ok is False]
    # Only an expectation that applies explains anything: a known issue outside its range
    # (``exp.out_of_range``) only names itself in the FAIL.
    explains = m if (exp.known_issue is not None or exp.tamper) else None
    # A death leads the reason: it explains most of what follows it.
    unexplained = sorted((c for c in failed if not _explained(c, explains)), key=lambda c: c.name != "alive")
    by = {c.name: c for c in checks}
    gaps = [by[n] if n in by else Check(n, None, "not checked: the kind produced no such check")
            for n in exp.required if n not in by or (by[n].ok is None and not _explained(by[n], explains))]
    if exp.tamper:
        if m is not None and m.matched:
            if unexplained:
                return v("FAIL", _list(unexplained))
            return v("ERROR", _inconclusive(gaps)) if gaps else v("PASS", f"tampering caught by {m.seen}")
        if failed:
            return v("FAIL", f"canary inconclusive: no real catch ({m.expected if m else 'a catch'}); "
                             f"seen: {_list(failed)}")
        if gaps:
            return v("ERROR", _inconclusive(gaps))
        return v("FAIL", f"{exp.tamper} passed silently: the answer matched the reference of the prompt D was "
                         "given, so parity cannot vouch for the KV")
    if unexplained:
        reason = _list(unexplained)
        if m is not None and exp.out_of_range is not None and m.matched:
            ki = exp.out_of_range
            reason = (f"matches known issue {ki.id}, outside its declared range {ki.affects}: update `affects`? "
                      f"({m.shown}); {reason}")
        elif m is not None and exp.known_issue is not None:
            ki = exp.known_issue
            reason = (f"{ki.id} matched on {', '.join(sorted(m.requests | m.instances))}, but not: {reason}"
                      if m.matched else f"not known issue {ki.id}: expected {m.expected}, seen {m.seen}; {reason}")
        return v("FAIL", reason)
    if gaps:
        return v("ERROR", _inconclusive(gaps))
    if not failed and not any(c.ok for c in checks):  # nothing was judged: no verdict rests on it
        return v("ERROR", "inconclusive: no check could look" + (f" ({_list(checks)[:300]})" if checks else ""))
    if exp.known_issue is not None:
        if failed:
            return v("XFAIL", f"{exp.known_issue.id}: {m.shown if m else ''}")
        if not exp.known_issue.strict:  # pytest's xfail(strict=False): a timing-dependent bug
            return v("PASS", f"all checks hold; known issue {exp.known_issue.id} did not show this time "
                             "(strict: false, its showing depends on timing)")
        return v("XPASS", f"known issue fixed: update the expectation ({exp.known_issue.id} no longer reproduces)")
    return v("PASS", "all checks hold")


def _inconclusive(gaps: list[Check]) -> str:
    return "inconclusive: " + "; ".join(f"{c.name} {c.detail}" for c in gaps)


def canary_match(obs: ScenarioObservation, checks: list[Check], reqs: list[RequestFacts] | None = None) -> Match:
    """The catch of a tampered scenario: a parity divergence on an answered
    request whose KV was pulled (``kv-pulled`` did not fail on it), or an HTTP error status from
    D. A timeout, a stall or a missing pull is no catch."""
    reqs = facts_of_records(obs) if reqs is None else reqs
    by = {c.name: c for c in checks}
    kv = by.get("kv-pulled")
    unpulled = set(kv.requests) if kv is not None and kv.ok is False else set()
    if kv is not None and kv.ok is None:
        unpulled = {r.request_id for r in reqs}
    caught, seen = [], []
    for r in reqs:
        if r.outcome == "ok" and r.parity == "diverged" and r.request_id not in unpulled:
            caught.append((r.request_id, f"parity: {by['parity'].detail}" if "parity" in by else "parity"))
        elif r.outcome == "http_error" and r.hop == "decode" and r.status is not None:
            caught.append((r.request_id, f"decode HTTP {r.status}: {r.error[:120]}"))
        else:
            seen.append(f"{r.request_id}: {r.outcome}" + (", KV not pulled" if r.request_id in unpulled else "")
                        + (f", parity {r.parity}" if r.parity else ""))
    return Match(frozenset(i for i, _ in caught),
                 frozenset({"completed", "token-counts", "parity", "kv-integrity", "kv-pulled"}),
                 seen=caught[0][1] if caught else "; ".join(seen),
                 expected="a divergence on an answered request whose KV was pulled, or an HTTP error from D")


def edge_checks(sc: ScenarioConfig, obs: ScenarioObservation, outcome=None) -> list[Check]:
    """The checks of an edge-like scenario: completed, token-counts, kv-pulled, parity, alive,
    no-fatal-log, kv-integrity, idle-after (:mod:`rig.judge.checks`). ``outcome`` defaults to
    ``sc.expect`` (the version's outcome, :meth:`rig.config.Expectation.for_version`)."""
    outcome = outcome or sc.expect
    out = completion_checks(outcome, obs.records)
    if outcome.http_status is None:
        out.append(_kv_pulled(obs, outcome.prompt_source))
        if sc.parity:
            out.append(parity_check(obs.records, obs.parity))
    out += [counter_rose_check(obs, f, getattr(outcome, f),
                               (outcome.min_preemptions_on or "decode") if f == "min_preemptions" else "decode")
            for f in RISING_COUNTERS if getattr(outcome, f) is not None]
    out += [alive_check(obs), fatal_log_check(obs), kv_integrity_check(obs), idle_check(obs)]
    return out


def _side_channels(recs: list[PDRecord]) -> str:
    """'; P's side channel prefill:5600' : the ``remote_host:remote_port`` P advertised in its
    ``kv_transfer_params`` (where D connected to pull: a service name when P and D are containers,
    rig/plan/compose.py), each distinct one once; '' when no answer carried one."""
    seen = dict.fromkeys(f"{p.get('remote_host')}:{p.get('remote_port')}" for r in recs
                         if r.prefill is not None and (p := r.prefill.kv_transfer_params) and p.get("remote_host"))
    return f"; P's side channel {', '.join(seen)}" if seen else ""


def _prompt_tokens(r: PDRecord) -> int:
    """The prompt tokens D served for answered ``r``: D's ``usage.prompt_tokens`` (text prompts are
    counted by the tokenizer), else the token IDs the rig sent."""
    n = ((r.decode.usage or {}) if r.decode else {}).get("prompt_tokens")
    return n if isinstance(n, int) else r.prompt_token_count


def _prompt_lengths(r: PDRecord) -> list[int]:
    """The token count of each prompt of answered ``r`` (one per prompt of a several-prompt request)."""
    if r.prompt_count > 1:
        return [len(p) for p in r.prompt]
    return [_prompt_tokens(r)]


def _kv_pulled(obs: ScenarioObservation, source: PromptSource = "pulled", exact: bool = True) -> Check:
    """``kv-pulled``: where D took every answered request's prompt tokens, against the expected
    ``source`` (``expect.prompt_source``, by vLLM version), from D's
    ``vllm:prompt_tokens_by_source_total`` deltas and NIXL bytes over the scenario (the rule
    vLLM's tests/v1/kv_connector/nixl_integration/test_multi_connector_edge_cases.py asserts):

    - ``pulled``: external_kv_transfer + local_cache_hit = every answered prompt's tokens (all
      prompts of a several-prompt request; D's own prefix cache may hold some, as on a deployment
      the rig attaches to again), local_compute +0, NIXL bytes > 0 in at least one transfer per
      prompt, and exactly every prompt's blocks (``cdiv(n, block_size)`` each, the last one whole)
      x ``obs.kv_bytes_per_block`` where the rig knows the model's geometry and D had no hit;
    - ``recomputed``: local_compute = every prompt token, external_kv_transfer +0,
      local_cache_hit +0, NIXL bytes +0 (vLLM 0.32.0 with prompt_logprobs).

    The counters are per instance, so the deltas are one request's exactly only when the scenario
    sent one request (the detail says "per request"); with several they are the sum over the
    requests sent together, and the detail says so. A request that reached D without an answer
    may have been counted too, so then the counts are lower bounds and local_compute is not
    bounded. With ``exact`` false (a sequence whose other steps also reach D) the counts are
    lower bounds as well. A shortfall fails on every answered request; with no answer, on every
    request."""
    ok_recs = [r for r in obs.records if r.outcome == "ok"]
    if not ok_recs:
        return Check("kv-pulled", False, "no answered request to show where its prompt came from",
                     tuple(r.request_id for r in obs.records))
    gap = not_checked_for_metrics("kv-pulled", obs, [obs.decode], KV_PULLED_METRICS)
    ev = obs.evidence
    if gap or ev is None:
        return gap or Check("kv-pulled", None, "not checked: no decode metrics")
    # every prompt of a several-prompt request is its own engine request with its own pull
    want = sum(_prompt_tokens(r) for r in ok_recs)
    reads = sum(r.prompt_count for r in ok_recs)
    unanswered = [r for r in obs.records if r.outcome != "ok" and r.decode_sent_at is not None]
    exact = exact and not unanswered
    ext, cached, computed = ev.external_prompt_tokens, ev.cached_prompt_tokens, ev.computed_prompt_tokens
    seen = (f"D: external_kv_transfer +{ext:.0f}, local_cache_hit +{cached:.0f}, local_compute +{computed:.0f}, "
            f"nixl {ev.nixl_bytes:.0f} B in {ev.nixl_transfers:.0f} transfers")
    if source == "recomputed":
        ok = (computed == want if exact else computed >= want) and ext == 0 and cached == 0 and ev.nixl_bytes == 0
        expected = f"recomputed (declared): local_compute +{want}, nothing pulled (0 B), no prefix-cache hit"
    else:
        got = ext + cached
        ok = ((got == want and computed == 0) if exact else got >= want) and ev.nixl_bytes > 0 \
            and ev.nixl_transfers >= reads
        nbytes = "nixl bytes > 0"
        blocks = sum(-(-n // obs.block_size) for r in ok_recs for n in _prompt_lengths(r)) if obs.block_size else 0
        if exact and cached == 0 and obs.kv_bytes_per_block and blocks:
            # every block of every prompt, the last one whole (NIXL moves blocks, not tokens)
            nbytes = f"nixl {blocks * obs.kv_bytes_per_block} B ({blocks} blocks x {obs.kv_bytes_per_block} B)"
            ok = ok and ev.nixl_bytes == blocks * obs.kv_bytes_per_block
        expected = (f"pulled: external_kv_transfer + local_cache_hit = +{want}, local_compute +0, "
                    f"{nbytes} in >= {reads} transfers")
        if not exact:
            expected = expected.replace(" = +", " >= +").replace(", local_compute +0", "")
    if len(obs.records) == 1 and exact:
        scope = f"per request ({ok_recs[0].request_id} ran alone)"
    elif exact:
        scope = f"one delta over the {len(obs.records)} requests sent together (not per request)"
    elif unanswered:
        scope = (f"one delta over {len(obs.records)} requests, {len(unanswered)} of which reached D without an "
                 "answer: lower bounds")
    else:
        scope = "one delta over every request that reached D: lower bounds"
    return Check("kv-pulled", ok, f"{seen}; expected {expected}; {scope}{_side_channels(ok_recs)}",
                 () if ok else tuple(r.request_id for r in ok_recs))


def judge(sc: ScenarioConfig, obs: ScenarioObservation, blocks: BlockFacts | None = None,
          extra: list[Check] | None = None, checks: list[Check] | None = None,
          reqs: list[RequestFacts] | None = None, required: tuple[str, ...] | None = None) -> ScenarioVerdict:
    """The verdict for scenario ``sc`` of any kind from ``obs``: ``checks`` (default
    :func:`edge_checks`) plus ``extra`` kind checks plus ``counters-monotonic`` over
    ``obs.timeline`` (:mod:`rig.judge.counters`), the expectation on ``obs``'s versions, the
    known issue's signature match (``blocks``: D's block arithmetic for a stall's ``admission``;
    ``reqs``: the requests in the engine's vocabulary, default from ``obs.records``), then
    :func:`decide`. ``required`` replaces the kind's required checks (e.g. ``pdrig wave``
    against servers the rig does not run, which has no logs to scan)."""
    p_ver, d_ver = _versions(obs)
    outcome = sc.expect.for_version(d_ver)
    if outcome is None and obs.dead:  # a dead decode has no /version; its death decides
        outcome = sc.expect
    if checks is None and outcome is None:  # no instance died (a death set the outcome above)
        exp = expectation_of(sc, obs)
        return decide(sc.name, [], Expectation(exp.label, exp.required, problem=(
            f"the expected outcome depends on the vLLM version ({', '.join(v.vllm for v in sc.expect.by_version)}) "
            "and decode's version is unknown")), error=obs.error)
    refusal = outcome is not None and outcome.http_status is not None
    if checks is None:
        checks = edge_checks(sc, obs, outcome)
    # Every kind's instances are sampled into the metrics timeline: no counter may go down
    # within a process life (bug record R12); "not checked" without a timeline, and not required.
    checks = list(checks) + list(extra or []) + [counters_monotonic_check(obs.timeline)]
    exp = expectation_of(sc, obs, refusal)
    checks += counter_checks(sc, obs, outcome or sc.expect, exp, refusal)
    if outcome is not None and bool(outcome.counters) != ("counters" in exp.required):
        # a ``by_version`` outcome adds or drops counter rules: the version's outcome decides
        exp = replace(exp, required=tuple(n for n in exp.required if n != "counters")
                      + (("counters",) if outcome.counters else ()))
    if required is not None:
        exp = replace(exp, required=required)
    checks = unsure_of_stalls(checks, obs.records)  # an inconclusive stall fails nothing: ERROR, not FAIL
    reqs = facts_of_records(obs) if reqs is None else reqs
    m = None
    if exp.tamper:
        m = canary_match(obs, checks, reqs)
    elif sc.known_issue is not None:
        m = match(sc.known_issue.symptom, obs, reqs, blocks)
    return decide(sc.name, checks, exp, m, obs.error, bool(obs.dead))


def healthy_run(sc: ScenarioConfig, exp: Expectation, refusal: bool) -> bool:
    """True when ``sc`` is a healthy P/D run on this version: its kind pulls over NIXL and injects
    no fault (``kv-pulled`` in its :data:`REQUIRED`, so not ``fault`` nor the store kinds), and it
    is expected to pass (no known issue that applies, no canary, no expected refusal). The rule
    :data:`rig.judge.counter_rules.HEALTHY_RULE` holds on those (bug record R19)."""
    return ("kv-pulled" in REQUIRED[sc.kind] and exp.known_issue is None and exp.tamper is None
            and not refusal)


def counter_checks(sc: ScenarioConfig, obs: ScenarioObservation, outcome: Outcome, exp: Expectation,
                   refusal: bool) -> list[Check]:
    """``counters`` over ``outcome.counters`` (required when the scenario has rules), and the
    healthy-run rule ``nixl-failed-transfers`` (not required: an older vLLM without the counter
    shows it "not checked") when :func:`healthy_run` and the scenario has no rule of its own on
    D's failed-transfer counter. Both read ``obs.timeline`` (rig/judge/counter_rules.py)."""
    out = []
    if outcome.counters:
        out.append(counter_rules_check(obs.timeline, outcome.counters, obs.prefill, obs.decode))
    own = any(r.metric == HEALTHY_RULE.metric and r.instance in ("decode", obs.decode) for r in outcome.counters)
    if healthy_run(sc, exp, refusal) and not own:
        out.append(counter_rules_check(obs.timeline, [HEALTHY_RULE], obs.prefill, obs.decode, HEALTHY_NAME))
    return out


def run_passed(verdicts: list[ScenarioVerdict]) -> bool:
    """True when every scenario is PASS or XFAIL (and there is at least one)."""
    return bool(verdicts) and all(v.passed for v in verdicts)
