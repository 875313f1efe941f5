"""The checks and the verdict of a wave scenario (``prefix-wave`` / ``pressure-wave``).

Every check names the requests it failed on. The wave itself (rig.workload.waves) only drives the
requests and records what it saw in a :class:`~rig.workload.wave_result.WaveResult`; this module
reads that result and the scenario's :class:`~rig.observe.observations.ScenarioObservation`.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from rig.config import ScenarioConfig
from rig.judge.checks import (
    KV_PULLED_METRICS,
    PREFIX_HIT_METRICS,
    Check,
    alive_check,
    all_cancelled_reason,
    fatal_log_check,
    idle_check,
    kv_integrity_check,
    not_checked_for_metrics,
)
from rig.judge.signatures import facts_of_wave
from rig.judge.verdict import ScenarioVerdict, decide, expectation_of, judge, required_checks
from rig.observe.drain import describe_drain
from rig.observe.observations import ScenarioObservation
from rig.transport.records import WaveRecord
from rig.workload.wave_result import ERRORS, WaveResult


def explain_stall(stall: dict[str, Any], wave: WaveResult, slack_s: float = 12.0) -> str:
    """Why a stall episode of ``wave`` is expected, or "" when nothing explains it.

    A prefill instance whose KV pool is full of blocks kept for requests abandoned between the
    hops: P cannot know that D will never read them and keeps them until its NIXL
    ``kv_lease_duration`` expires (vllm/.../nixl/base_worker.py ``_reap_expired_send_leases``).
    Explained when (1) the requests cancelled ``between`` in the lease before the stall, plus one
    block set per request in flight, need at least the usable blocks of that P (estimates:
    prompt + 1 token per abandoned request, prefix sharing ignored) and (2) the stall ended by
    the time the first of those leases expired (+ ``slack_s`` for the sampling and the window):
    a P that stays frozen after its leases ran out is not explained by them. Stalls on decode
    are never explained here: the 0.32.0 admission livelock looks exactly like one.
    """
    name = stall["instance"]
    if wave.instances.get(name) != "prefill":
        return ""
    bs = wave.block_size or 16
    usable = wave.usable_blocks.get(name)
    start = stall["start_s"]
    held = [r for r in wave.records if r.cancel_point == "between" and r.p_instance == name
            and r.t_end is not None and start - wave.kv_lease_s - 1.0 <= r.t_end <= start + 1.0]
    if not held:
        return ""
    blocks = sum(math.ceil((r.prompt_len + 1) / bs) for r in held)
    per_request = math.ceil(((wave.params.get("prompt_tokens") or 0) + 1) / bs)
    in_flight = (wave.params.get("concurrency") or 0) * per_request
    if usable is not None and blocks + in_flight < usable:
        return ""
    first_expiry = min(r.t_end for r in held if r.t_end is not None) + wave.kv_lease_s
    if start + stall["duration_s"] > first_expiry + slack_s:
        return ""
    return (f"{len(held)} requests abandoned between the hops in the {wave.kv_lease_s:g} s before hold "
            f"~{blocks} of P's {usable if usable is not None else '?'} usable blocks until NIXL's "
            "kv_lease_duration expires (nobody tells P that D will never read them)")


def _stall_check(wave: WaveResult) -> Check:
    """``no-stall``: no instance froze with requests waiting, unexplained. FAIL on an unexplained
    freeze whose evidence is conclusive; "not checked" when every unexplained freeze was
    inconclusive (a starved or compiling engine), or when an instance's /metrics was never read
    during the wave (``WaveResult.samples`` 0) and nothing failed: a watcher that saw nothing
    cannot say nothing froze. The check carries the snapshots the watcher was fed (every
    instance's, summed)."""
    n = sum(wave.samples.values())
    blind = sorted(name for name, k in wave.samples.items() if k == 0)
    unseen = (f"not checked: {', '.join(blind)} never sampled during the wave ({wave.scrape_errors} "
              "/metrics scrape(s) failed)")
    if not wave.stalls:
        if blind:
            return Check("no-stall", None, unseen, samples=n)
        return Check("no-stall", True, f"no instance froze with requests waiting ({n} samples)", samples=n)
    parts = [f"{st['instance']} at {st['start_s']:g} s for {st['duration_s']:g} s: "
             + (f"explained: {st['explained']}" if st["explained"] else f"UNEXPLAINED: {st['diagnosis']}")
             for st in wave.stalls]
    text = "; ".join(parts[:4]) + (f"; +{len(parts) - 4} more" if len(parts) > 4 else "")
    unexplained = [st for st in wave.stalls if not st["explained"]]
    if unexplained and all(st.get("inconclusive") for st in unexplained):
        # the engine starved by a loaded host, or compiling (rig.observe.stall): nothing shown about vLLM
        return Check("no-stall", None, f"not checked: every unexplained freeze was inconclusive: {text}", samples=n)
    if not unexplained and blind:
        return Check("no-stall", None, f"{unseen}; {text}", samples=n)
    return Check("no-stall", not unexplained, text, samples=n)


def _first_error(recs: list[WaveRecord]) -> str:
    return f"; first: {recs[0].request_id}: {recs[0].outcome} {recs[0].diagnosis}".rstrip() if recs else ""


def _ids(recs: list[WaveRecord]) -> tuple[str, ...]:
    return tuple(r.request_id for r in recs)


ANSWERED = ("ok", "parity_mismatch")


def wave_kv_pulled(obs: ScenarioObservation, recs: list[WaveRecord]) -> Check:
    """``kv-pulled`` per request: every prompt D answered came over NIXL or from D's own prefix
    cache, none recomputed: D's ``prompt_tokens_by_source`` external_kv_transfer + local_cache_hit
    >= the answered prompts' tokens, at least one NIXL transfer. (Counters are per instance: a
    shortfall fails on every answered request.) Not checked without D's counters."""
    answered = [r for r in recs if r.outcome in ANSWERED]
    if not answered:
        return Check("kv-pulled", False, "no answered request to show a transfer for", _ids(recs))
    ev = obs.evidence
    gap = not_checked_for_metrics("kv-pulled", obs, [obs.decode], KV_PULLED_METRICS)
    if gap or ev is None:
        return gap or Check("kv-pulled", None, "not checked: no decode metrics")
    want = sum(r.prompt_len for r in answered)
    got = ev.external_prompt_tokens + ev.cached_prompt_tokens
    ok = got >= want and ev.nixl_transfers > 0
    return Check("kv-pulled", ok,
                 f"D: {ev.external_prompt_tokens:.0f} prompt tokens from external_kv_transfer + "
                 f"{ev.cached_prompt_tokens:.0f} from its prefix cache (expected >= {want} for {len(answered)} "
                 f"answered prompts), nixl {ev.nixl_bytes:.0f} B in {ev.nixl_transfers:.0f} transfers",
                 () if ok else _ids(answered))


def wave_checks(sc: ScenarioConfig, obs: ScenarioObservation, wave: WaveResult,
                unwatched: bool = False) -> list[Check]:
    """The named checks of a wave (see :func:`judge_wave`), each naming the requests it failed on.
    ``unwatched``: the rig has no process nor log of the instances (:data:`UNWATCHED` are then
    "not checked", saying why they are not required)."""
    recs = wave.records
    s = wave.summary()
    out: list[Check] = []
    intentional = [r for r in recs if r.intentional]
    points = ", ".join(f"{k} {v}" for k, v in sorted(s["cancel_points"].items(), key=lambda kv: str(kv[0])))
    # Answered = D answered (a parity mismatch is answered; the parity check judges its tokens).
    ok_n = sum(r.outcome in ANSWERED for r in recs)
    want = len(recs) - len(intentional)
    unanswered = [r for r in recs if not r.intentional and r.outcome not in ANSWERED]
    out.append(Check("completed", bool(recs) and ok_n == want,
                     f"{ok_n}/{want} completed ({len(recs)} requests, {len(intentional)} cancelled on purpose"
                     + (f": {points}" if points else "") + ")", _ids(unanswered)))
    bad = [r for r in recs if r.outcome in ERRORS or (r.outcome == "cancelled" and not r.intentional)]
    by = Counter("aborted" if r.outcome == "cancelled" else r.outcome for r in bad)
    out.append(Check("no-errors", not bad,
                     "no timeouts, HTTP or connection errors" if not bad else
                     ", ".join(f"{k} {v}" for k, v in sorted(by.items())) + _first_error(bad), _ids(bad)))
    empty = [r for r in recs if r.outcome == "empty"]
    out.append(Check("no-empty", not empty, "no empty answers" if not empty else
                     f"{len(empty)} empty answers (200 without tokens)" + _first_error(empty), _ids(empty)))
    wrong, wrong_recs = [], []
    for r in recs:
        if r.outcome not in ANSWERED:
            continue
        exp = sc.expect.completion_tokens
        if exp is None:
            exp = r.max_tokens if wave.max_model_len is None else min(r.max_tokens, wave.max_model_len - r.prompt_len)
        if r.tokens != exp:
            wrong.append(f"{r.request_id}: {r.tokens} tokens, expected {exp}")
            wrong_recs.append(r)
        elif r.usage_tokens is not None and r.usage_tokens != r.tokens:
            wrong.append(f"{r.request_id}: {r.tokens} token_ids but usage says {r.usage_tokens}")
            wrong_recs.append(r)
    if all_cancelled_on_purpose(recs):
        # Nothing was meant to be answered: the answer checks have nothing to look at (not
        # required then, :func:`judge_wave`); the run-level checks below still judge the wave.
        why = f"not checked: all {len(recs)} requests were cancelled on purpose ({points}): no answer to "
        out.append(Check("token-counts", None, why + "count"))
        out.append(Check("kv-pulled", None, why + "show a transfer for"))
        if wave.kind == "prefix-wave":
            out.append(Check("prefix-hits", None, why + "hit P's prefix cache for"))
        if sc.parity and (wave.params.get("parity_fraction") or 0) > 0:
            out.append(Check("parity", None, why + "compare"))
    else:
        out.append(Check("token-counts", not wrong and ok_n > 0,
                         (f"{len(wrong)} wrong: " + "; ".join(wrong[:3])) if wrong else
                         ("every answer has its expected token count" if ok_n else "no answer to count"),
                         _ids(wrong_recs) if wrong else () if ok_n else _ids(unanswered)))
        out.append(wave_kv_pulled(obs, recs))
        if wave.kind == "prefix-wave":
            out.append(_prefix_hits(obs, wave, recs))
        if sc.parity and (wave.params.get("parity_fraction") or 0) > 0:
            out.append(_wave_parity(wave, recs, ok_n))
    rid = {r.remote_request_id: r.request_id for r in recs if r.remote_request_id}
    if not unwatched:
        out.append(alive_check(obs))
        out.append(fatal_log_check(obs))
        out.append(kv_integrity_check(
            obs, {k: v for k, v in rid.items() if any(r.request_id == v and r.outcome in ANSWERED for r in recs)},
            {k: v for k, v in rid.items() if any(r.request_id == v and r.outcome not in ANSWERED for r in recs)}))
    else:  # pdrig wave at bare URLs: no process to watch, no log to scan
        out += [Check(n, None, f"not checked: {UNWATCHED_WHY}") for n in UNWATCHED]
    out.append(_stall_check(wave))
    out.append(idle_check(obs, obs.drains or wave.drains,
                          lambda dr: describe_drain(dr, wave.usable_blocks.get(dr.instance))))
    return out


def _prefix_hits(obs: ScenarioObservation, wave: WaveResult, recs: list[WaveRecord]) -> Check:
    """``prefix-hits``: P's prefix-cache hits equal the expected count; not checked (never ok)
    when the expectation is unknown, the prefixes cannot all stay cached, requests were
    cancelled before P answered, or P lacks the counter."""
    p_names = [n for n, role in wave.instances.items() if role == "prefill"]
    hits = sum(wave.deltas.get(n, {}).get("prefix_hits", 0.0) for n in p_names)
    d_parts = [f"{n}: local {wave.deltas.get(n, {}).get('prefix_hits', 0):.0f}, external "
               f"{wave.deltas.get(n, {}).get('external_prefix_hits', 0):.0f}"
               for n, role in wave.instances.items() if role == "decode"]
    exp = wave.expected_prefix_hits
    early = sum(r.cancel_point == "before-prefill" for r in recs)
    detail = (f"P hits {hits:.0f} tokens, expected {exp if exp is not None else '?'} "
              f"({wave.prefix_note}); D {'; '.join(d_parts)}")
    gap = not_checked_for_metrics("prefix-hits", obs, p_names, PREFIX_HIT_METRICS)
    if gap:
        return gap
    if exp is None:
        return Check("prefix-hits", None, f"not checked: the expected hits are unknown; {detail}")
    if hits == exp:
        # The value is what was expected: ok, even where the rig predicted it might not be.
        doubt = (f"{early} requests cancelled before P answered" if early else
                 "" if wave.prefix_fits else "the prefixes could not all stay cached on P")
        return Check("prefix-hits", True, detail + (f"; matched although {doubt}" if doubt else ""))
    if not wave.prefix_fits or early:
        why = (f"{early} requests cancelled before P answered" if early else
               "the prefixes cannot all stay cached on P")
        return Check("prefix-hits", None, f"not checked: {why}; {detail}")
    return Check("prefix-hits", False, detail)


# The checks that read the instances' processes and logs, and why a wave at bare URLs has none.
UNWATCHED = ("alive", "no-fatal-log", "kv-integrity")
UNWATCHED_WHY = ("not required: the rig did not start these processes and was given no log path or pid "
                 "(`pdrig wave --endpoints` with `pdrig up`'s endpoints.json gives both)")


def all_cancelled_on_purpose(recs: list[WaveRecord]) -> bool:
    """True when ``recs`` is not empty and every request was cancelled on purpose by the rig
    (:attr:`WaveRecord.intentional`: its planned cancel fired); a request that failed, timed out
    or was aborted without a plan makes it False."""
    return bool(recs) and all(r.intentional for r in recs)


ANSWER_CHECKS = ("token-counts", "kv-pulled", "prefix-hits", "parity")


def _wave_parity(wave: WaveResult, recs: list[WaveRecord], ok_n: int) -> Check:
    pr = wave.parity
    mism = [r for r in recs if r.outcome == "parity_mismatch"]
    detail = (f"{pr.get('equal', 0)}/{pr.get('compared', 0)} sampled answers equal to a direct request to P"
              + (f", {pr['failed']} references failed" if pr.get("failed") else "")
              + (f"; {mism[0].request_id}: {mism[0].parity}" if mism else ""))
    if mism or pr.get("refused"):
        return Check("parity", False, detail, _ids(mism))
    if ok_n and (pr.get("compared", 0) == 0 or pr.get("failed")):
        return Check("parity", None, f"not checked: {detail}")
    if not ok_n:
        return Check("parity", False, "no answer to compare", _ids([r for r in recs if not r.intentional]))
    return Check("parity", True, detail)


def judge_wave(sc: ScenarioConfig, obs: ScenarioObservation, wave: WaveResult | None,
               required: tuple[str, ...] | None = None, unwatched: bool = False) -> ScenarioVerdict:
    """The verdict of a wave scenario through the one engine (:func:`rig.judge.verdict.judge`), with
    named checks: ``completed`` (every request not cancelled on purpose answered), ``no-errors``
    (no timeout / HTTP / connection error or unplanned cancel), ``no-empty``, ``token-counts``,
    ``kv-pulled`` (per request, :func:`wave_kv_pulled`), ``prefix-hits`` (prefix waves),
    ``parity`` (the sample), ``alive``, ``no-fatal-log`` and ``kv-integrity`` (with ``unwatched``,
    the caller's word that the rig has neither a log path nor a pid of the processes, ``pdrig
    wave`` at bare URLs: not checked and not required, and the checks and the reason say so),
    ``no-stall`` (no instance froze with requests waiting,
    unless :func:`explain_stall` explains it) and ``idle-after`` (a leak is named with its gauge
    and blocks). ``required``: the checks that must have been checked (default: the kind's,
    rig.judge.verdict.REQUIRED). A ``known_issue`` is honoured like on any kind.

    A wave whose every request the rig cancelled on purpose (:func:`all_cancelled_on_purpose`)
    has no answer to judge: :data:`ANSWER_CHECKS` are "not checked" saying so and not required,
    the run-level checks still are, and a PASS reads "all N requests cancelled on purpose". One
    request that failed or was cancelled without a plan brings the answer checks back (FAIL).

    A stall episode the wave recorded without an ``explained`` entry (run_wave was given no
    ``explain``) is explained here with :func:`explain_stall`. The markdown section is
    rig.report.wave_section's (the app layer appends it, rig/run/kinds.py).
    """
    if wave is None or (wave.error and not wave.records) or obs.error:
        reason = obs.error or (wave.error if wave else "the wave did not run")
        return decide(sc.name, [], expectation_of(sc, obs), error=reason)
    for st in wave.stalls:
        if "explained" not in st:
            st["explained"] = explain_stall(st, wave)
    checks = wave_checks(sc, obs, wave, unwatched)
    if wave.error:
        checks.append(Check("metrics", False, wave.error))
    cancelled = all_cancelled_on_purpose(wave.records)
    drop = (ANSWER_CHECKS if cancelled else ()) + (UNWATCHED if unwatched else ())
    if drop:  # no answer was meant / no process nor log to look at: those checks are not required
        required = tuple(n for n in (required if required is not None else required_checks(sc)) if n not in drop)
    v = judge(sc, obs, checks=checks, reqs=facts_of_wave(wave.records), required=required)
    if cancelled and v.verdict == "PASS":
        v.reason = all_cancelled_reason(len(wave.records), v.checks)
    if unwatched and v.verdict in ("PASS", "XFAIL", "XPASS"):
        v.reason += f"; {', '.join(UNWATCHED)} not checked, {UNWATCHED_WHY}"
    return v
