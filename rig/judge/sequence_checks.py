"""The checks of a sequence scenario (bug record R02, R06), from its observation and the executor's
:class:`~rig.workload.sequence.SequenceResult`. Tri-state like every check (:mod:`rig.judge.checks`):
what could not be looked at is "not checked", never ok.

- ``completed``: every request ended with D's (or, route prefill, P's) answer; an abandoned
  request (route pd-abandon) counts when P answered its prefill hop, a request cancelled on purpose
  (``cancel_after_ms``) when it was cut or answered first, a retried one (route pd-retry) when its
  retry answered or was refused with an HTTP error (a clean failure), a swallowed cancel's (route
  pd-swallow-cancel) when its hops ran to D's answer. Failed per request, named with its step,
  outcome and diagnosis.
- ``token-counts``: per step, every answered request has ``max_tokens`` completion tokens and
  ``prompt_tokens`` prompt tokens in its usage (times ``request.prompts``, completion also times
  ``n``; a chat step's prompt count is the template's, not checked), and as many token IDs.
- ``kv-pulled``: only the ``pd``, ``router`` and ``pd-swallow-cancel`` steps' answered requests: their
  prompts came over NIXL (or D's own prefix cache), as many transfers as requests (rig.judge.verdict's
  rule; straight-to-D requests compute their prompt on D and are left out, and so are pd-retry's,
  whose retry may recompute the prompt on D).
- ``kv-integrity``: no answered request read KV P had released (rig.judge.checks); on a pd-retry
  step P's line for the retry is the route's mechanism (P freed the blocks after the first
  attempt's read) and fails only when the retry answered HTTP 200 with other tokens than the
  reference (:func:`integrity_maps`; parity fails on it too).
- ``no-stall``: D never froze with requests waiting while requests were outstanding; the
  detail is the diagnosis, naming the steps whose requests were outstanding (a run check: a
  known issue excuses it with ``excuses: [no-stall]``).
- ``lease-reaped`` (steps with route pd-abandon): P's ``nixl_num_kv_expired_reqs_total`` rose by
  the abandoned requests within ``nixl.kv_lease_duration + sequence.idle_margin_s`` of the last
  abandoned prefill answer; the detail names the steps still outstanding then (bug record R06: a
  heartbeated head must not shield expired leases; vllm/.../nixl/base_worker.py
  ``_reap_expired_send_leases``, PR #50789).
- ``gauges-account`` (``require: [gauges-account]``): D's gauges counted every request outstanding
  at D, but for gaps shorter than ``timeouts.stall_window_s`` (vLLM PR #56640: a full prefix-cache
  hit parked in WAITING_FOR_REMOTE_KVS and counted nowhere).
- ``idle-after`` over the kind's own drains, with the bound it applied.
- ``latency`` (not required): no answered hop waited far past the measured per-request baseline
  (rig.judge.latency; cut and unanswered requests left out).
- ``refusal-relayed`` (steps with route router): every router request that ended without an
  answer got D's own refusal, status and error message, as D answers the same body sent straight
  to it (bug record R27: a router must not report 200, or another error, when D refuses; vllm #23981,
  #54707). Required when a router step expects a refusal (``expect_status``).
- ``repeat-equal`` (steps with ``repeat_of``): the later direct requests for the prompt D got in an
  earlier step equal the reference (bug record R26: D's prefix cache must not keep blocks a wrong
  transfer wrote).

A step with ``expect_status`` counts as completed when every one of its requests ended with that
HTTP status; its requests have no answer to count or compare.

A sequence whose every request the rig cut on purpose (``cancel_after_ms`` fired before an
answer, or a ``pd-abandon`` step: :func:`all_cut_on_purpose`), or whose retried decode hops were
refused cleanly (:func:`nothing_to_answer`), has no answer to judge:
:data:`ANSWER_CHECKS` are "not checked" saying so and not required (:func:`sequence_required`),
the run-level checks (completed, no-stall, idle-after, alive, no-fatal-log) still judge it, and a
PASS reads "all N requests cancelled on purpose", as a wave's does (rig.judge.wave_checks).
"""

from __future__ import annotations

from dataclasses import replace

from rig.config import ScenarioConfig
from rig.config.sequence import SequenceConfig
from rig.judge.checks import (
    Check,
    alive_check,
    all_cancelled_reason,
    fatal_log_check,
    idle_check,
    inconclusive_stall,
    kv_integrity_check,
    parity_check,
    sampled,
    stream_check,
)
from rig.judge.latency import latency_check
from rig.judge.verdict import ScenarioVerdict, _kv_pulled, judge, required_checks  # one kv-pulled rule
from rig.judge.windows import shortfall_bound
from rig.observe.observations import ScenarioObservation
from rig.transport.records import PDRecord
from rig.workload.sequence import ABANDONED, CANCELLED, SWALLOWED, SequenceResult

# D pulls the prompt's KV over NIXL on these routes. Not pd-retry: its retry may find P's blocks
# freed and D may recompute the prompt itself (fine), and D's counters count both attempts' pulls.
PULLING_ROUTES = ("pd", "router", "pd-swallow-cancel")
# Routes that send a request to D (a "prefill" step asks P only; a "pd-abandon" step never sends
# its decode hop): the stall watcher watches D, so a sequence of none of them has no D request
# that could stall and no-stall is not required of it.
DECODE_ROUTES = ("pd", "decode", "router", "pd-retry", "pd-swallow-cancel")
# The checks that look at answers: with every request cut on purpose they have nothing to look at.
ANSWER_CHECKS = ("token-counts", "kv-pulled", "parity", "repeat-equal")


def all_cut_on_purpose(obs: ScenarioObservation) -> bool:
    """True when ``obs`` has requests and every one ended cancelled by the rig on purpose: cut by
    its step's ``cancel_after_ms`` before an answer came (diagnosis :data:`CANCELLED`) or
    abandoned after P answered (route ``pd-abandon``, diagnosis :data:`ABANDONED`). A request
    that was answered, failed, timed out or was cut without a plan makes it False."""
    return bool(obs.records) and all(r.outcome == "cancelled" and (r.diagnosis.startswith(CANCELLED)
                                                                   or r.diagnosis == ABANDONED)
                                     for r in obs.records)


def nothing_to_answer(obs: ScenarioObservation) -> bool:
    """True when ``obs`` has requests and none was meant to have an answer: each was cut on
    purpose (:func:`all_cut_on_purpose`'s rule) or is a retried decode hop (route pd-retry,
    ``first_decode`` kept) whose retry was refused with an HTTP error, a clean failure."""
    return bool(obs.records) and all((r.outcome == "cancelled" and (r.diagnosis.startswith(CANCELLED)
                                                                    or r.diagnosis == ABANDONED))
                                     or (r.first_decode is not None and r.outcome == "http_error")
                                     for r in obs.records)


def _step_of(result: SequenceResult) -> dict[str, tuple[str, str]]:
    return {e.request_id: (e.step, e.route) for e in result.entries}


def _ended_well(rec: PDRecord, route: str, expect_status: int | None = None) -> bool:
    if route == "pd-abandon":
        return rec.outcome == "cancelled" and rec.diagnosis == ABANDONED
    if route == "pd-retry":  # the retry answered, or failed cleanly: an HTTP error, never a hang
        return rec.outcome in ("ok", "http_error")
    if expect_status is not None:
        return rec.outcome == "http_error" and rec.decode is not None and rec.decode.status == expect_status
    return rec.outcome == "ok" or (rec.outcome == "cancelled" and rec.diagnosis.startswith(CANCELLED))


def completed_check(obs: ScenarioObservation, result: SequenceResult, spec: SequenceConfig | None = None) -> Check:
    """``completed``: every request answered (abandoned ones: P answered; a step with
    ``expect_status``: refused with that status); see the module docstring."""
    steps = _step_of(result)
    expected = {s.id: s.expect_status for s in spec.steps} if spec is not None else {}
    if not obs.records:
        return Check("completed", None, "not checked: no request was sent")
    bad = [r for r in obs.records if not _ended_well(r, steps[r.request_id][1], expected.get(steps[r.request_id][0]))]
    if not bad:
        n_ab = sum(1 for r in obs.records if steps[r.request_id][1] == "pd-abandon")
        n_cut = sum(1 for r in obs.records if r.outcome == "cancelled" and r.diagnosis.startswith(CANCELLED))
        n_fail = sum(1 for r in obs.records if steps[r.request_id][1] == "pd-retry" and r.outcome == "http_error")
        n_swallow = sum(1 for r in obs.records if r.diagnosis.startswith(SWALLOWED))
        return Check("completed", True, f"{len(obs.records) - n_ab - n_cut - n_fail - n_swallow} answered"
                     + (f", {n_ab} abandoned after P answered" if n_ab else "")
                     + (f", {n_cut} cancelled on purpose (cancel_after_ms)" if n_cut else "")
                     + (f", {n_fail} retried decode hop(s) refused cleanly (pd-retry)" if n_fail else "")
                     + (f", {n_swallow} run to completion after the client closed (the router swallowed the "
                        "cancel)" if n_swallow else ""))
    text = "; ".join(f"{r.request_id} (step {steps[r.request_id][0]}"
                     + (f", expected HTTP {expected[steps[r.request_id][0]]}" if expected.get(steps[r.request_id][0])
                        else "") + f"): {r.outcome}"
                     + (f" ({r.diagnosis[:200]})" if r.diagnosis else "") for r in bad[:6])
    more = f"; and {len(bad) - 6} more" if len(bad) > 6 else ""
    return Check("completed", False, text + more, tuple(r.request_id for r in bad))


def token_counts_check(spec: SequenceConfig, obs: ScenarioObservation, result: SequenceResult) -> Check:
    """``token-counts`` per step over the answered requests (usage of the answering hop)."""
    steps = _step_of(result)
    by = {s.id: s for s in spec.steps}
    answered = [r for r in obs.records if r.outcome == "ok" and r.decode is not None]
    if not answered:
        # Named per unanswered request: a known issue that explains their failure (a stall, a
        # refusal) explains this check on them too; anything else leaves it not checked.
        return Check("token-counts", None, "not checked: no answered request",
                     tuple(r.request_id for r in obs.records if r.outcome != "ok"))
    bad: list[str] = []
    per_step: dict[str, int] = {}
    for r in answered:
        s = by[steps[r.request_id][0]]
        usage = r.decode.usage or {} if r.decode else {}
        got = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
        per_step[s.id] = per_step.get(s.id, 0) + 1
        # several prompts in one request (request.prompts) and n choices: usage sums them
        n = int(s.fields_for("decode").get("n") or 1)
        # a router transform's request: the prompt D got (P's token appended) and its max_tokens
        ptoks = len(r.decode_prompt) if r.decode_prompt is not None else s.prompt_tokens
        mt = int(s.transform.set.get("max_tokens", s.max_tokens)) if s.transform else s.max_tokens
        want: tuple[int | None, int] = (ptoks * s.prompts, mt * s.prompts * n)
        if s.endpoint == "chat":  # the chat template wraps the prompt: only the completion is known
            got, want = (None, got[1]), (None, want[1])
        why = [f"usage prompt/completion {got[0]}/{got[1]}, expected {want[0]}/{want[1]}"] if got != want else []
        if r.decode and r.decode.token_ids is not None and len(r.decode.token_ids) != got[1]:
            why.append(f"{len(r.decode.token_ids)} token_ids but usage says {got[1]}")
        if why:
            bad.append(f"{r.request_id}: " + ", ".join(why))
    if bad:
        more = f"; and {len(bad) - 6} more" if len(bad) > 6 else ""
        return Check("token-counts", False, "; ".join(bad[:6]) + more,
                     tuple(b.split(":", 1)[0] for b in bad))
    return Check("token-counts", True, ", ".join(f"{sid}: {n} x {by[sid].prompt_tokens}+{by[sid].max_tokens}"
                                                for sid, n in per_step.items()))


def kv_pulled_pd_check(obs: ScenarioObservation, result: SequenceResult, spec: SequenceConfig | None = None) -> Check:
    """``kv-pulled`` over the ``pd`` and ``router`` steps' requests only (rig.judge.verdict's rule:
    D's /metrics deltas; a router's hops pull over NIXL like the rig's own). A request whose
    transform stripped ``kv_transfer_params`` is left out (D computes its prompt itself)."""
    steps = _step_of(result)
    local = ({st.id for st in spec.steps if st.transform and "kv_transfer_params" in st.transform.strip}
             if spec else set())
    pd = [r for r in obs.records if steps[r.request_id][1] in PULLING_ROUTES and steps[r.request_id][0] not in local]
    c = _kv_pulled(replace(obs, records=pd), exact=False)  # D's counters also count the other steps' requests
    return Check(c.name, c.ok, f"pd and router steps only: {c.detail}", c.requests)


def refusal_relayed_check(result: SequenceResult) -> Check:
    """``refusal-relayed``: each router request without an answer got D's own status and error
    (the same body straight to D, :class:`rig.workload.sequence.RefusalProbe`); see the module docstring."""
    if not result.refusals:
        return Check("refusal-relayed", None, "not checked: every router request was answered (no refusal to relay)")
    bad = [p for p in result.refusals if p.client_status != p.d_status or p.client_error != p.d_error]
    if bad:
        b = bad[0]
        return Check("refusal-relayed", False,
                     f"{b.request_id}: the router's client got HTTP {b.client_status} ({b.client_error[:160]}); D "
                     f"answers the same body with HTTP {b.d_status} ({(b.d_error or 'an answer')[:160]})"
                     + (f"; and {len(bad) - 1} more" if len(bad) > 1 else ""), tuple(p.request_id for p in bad))
    return Check("refusal-relayed", True, f"{len(result.refusals)} refusal(s) relayed as D gave them: "
                                          f"HTTP {result.refusals[0].client_status} "
                                          f"({result.refusals[0].client_error[:120]})")


def repeat_equal_check(spec: SequenceConfig, obs: ScenarioObservation, result: SequenceResult) -> Check:
    """``repeat-equal``: the ``repeat_of`` steps' answered requests equal their reference (parity)."""
    steps = _step_of(result)
    repeats = {s.id for s in spec.steps if s.repeat_of}
    idx = [i for i, r in enumerate(obs.records) if steps[r.request_id][0] in repeats]
    done = [(obs.records[i], obs.parity[i] if i < len(obs.parity) else None) for i in idx]
    compared = [(r, p) for r, p in done if r.outcome == "ok" and p is not None and p.status != "refused"]
    if not compared:
        return Check("repeat-equal", None, "not checked: no repeated request was answered and compared")
    bad = [(r, p) for r, p in compared if p.status != "equal"]
    if bad:
        return Check("repeat-equal", False, "; ".join(f"{r.request_id}: {p.describe()} (D's prefix cache may hold "
                                                      "blocks an earlier wrong transfer wrote)" for r, p in bad[:3]),
                     tuple(r.request_id for r, _ in bad))
    return Check("repeat-equal", True, f"{len(compared)} later direct request(s) for the same prompt equal the "
                                       "reference")


def no_stall_check(result: SequenceResult, records: list[PDRecord] | None = None) -> Check:
    """``no-stall``: the stall watcher on D saw no freeze while requests were outstanding. Not
    checked (None) when the freeze's evidence in ``records`` is inconclusive (the engine starved
    by a loaded host, or compiling: rig.observe.stall), or when the watcher read no sample of D
    at all (``result.stall_unwatched``: it cannot say nothing froze). A failure names the requests
    the watcher marked stalled (none named: a freeze no signature can explain request by request)."""
    n = result.stall_samples
    if result.stall_unwatched and not result.stall:
        return Check("no-stall", None, f"not checked: {result.stall_unwatched}", samples=n)
    if result.stall:
        if records and any(inconclusive_stall(r) for r in records):
            return Check("no-stall", None, f"not checked: D froze, inconclusively: {result.stall}", samples=n)
        # Named per request, so a stall signature explains it only on the requests that show it.
        stalled = tuple(r.request_id for r in records or [] if r.outcome == "stalled")
        return Check("no-stall", False, result.stall, stalled, samples=n)
    return sampled(Check("no-stall", True, f"D never froze with requests waiting while requests were outstanding "
                                           f"({n} samples)"), n, "D was never sampled while requests were outstanding")


def gauges_account_check(result: SequenceResult, baseline_s: float | None = None) -> Check:
    """``gauges-account`` (``require: [gauges-account]``; vLLM PR #56640: a request parked in
    WAITING_FOR_REMOTE_KVS that D reports in no gauge): D's running + waiting / kv-fetch gauges
    counted every request outstanding at D, but for shortfalls shorter than the bound
    :func:`rig.judge.windows.shortfall_bound` derives from the deployment's measured per-request
    time ``baseline_s`` (a request between D's HTTP server and its engine, an answer on its way
    back), at most ``timeouts.stall_window_s``. Not checked when D was never sampled with a request
    outstanding at it."""
    g = result.gauges
    bound = shortfall_bound(baseline_s, result.sample_gap_s, result.gauge_window_s)
    if g.samples == 0:
        return Check("gauges-account", None, "not checked: D was never sampled with a request outstanding at it",
                     samples=0)
    if g.longest_s < bound.seconds:
        return Check("gauges-account", True, f"D's gauges counted every outstanding request in {g.samples} samples "
                                             f"(longest shortfall {g.longest_s:g} s, bound {bound.text()})",
                     samples=g.samples)
    return Check("gauges-account", False, f"D's gauges showed {g.visible:g} of {g.outstanding} outstanding requests "
                                          f"for {g.longest_s:g} s (until {g.at_ms:g} ms; bound {bound.text()}): "
                                          "requests D holds but counts in no gauge (running, waiting, kv_fetch)",
                 samples=g.samples)


def lease_reaped_check(result: SequenceResult, lease_s: float, margin_s: float,
                       reap_while: str | None = None) -> Check:
    """``lease-reaped``: P reaped every abandoned lease within the bound (module docstring). With
    ``reap_while`` (``sequence.reap_while``) a timely reap counts only when that step was still
    outstanding then; "not checked" when it had ended first (nothing stood in front of the
    expired leases, so the scenario did not test bug record R06's case)."""
    reap = result.reap
    if reap is None:
        return Check("lease-reaped", None, "not checked: no step abandons its decode hop")
    bound = lease_s + margin_s
    if reap.expired_before is None:
        return Check("lease-reaped", None, "not checked: P has no vllm:nixl_num_kv_expired_reqs_total")
    if reap.last_abandoned_ms is None:
        return Check("lease-reaped", None, "not checked: no abandoned request was answered by P")
    unseen = "P's expired-lease counter was never sampled"
    if reap.reaped_ms is None:
        return sampled(Check("lease-reaped", False, f"P's nixl_num_kv_expired_reqs_total rose by {reap.rose:g} of "
                                                    f"{reap.want} within kv_lease_duration + idle_margin_s = "
                                                    f"{bound:g} s of the last abandoned prefill answer: expired "
                                                    "leases not reaped"), reap.samples, unseen)
    after = (reap.reaped_ms - reap.last_abandoned_ms) / 1000
    then = ", ".join(reap.outstanding_then) or "no request"
    text = (f"P's expired counter rose by {reap.rose:g} (>= {reap.want} abandoned) {after:.1f} s after the last "
            f"abandoned prefill answer (bound {bound:g} s), while outstanding: {then}")
    if after <= bound and reap_while is not None and not any(o.split(" ", 1)[0] == reap_while
                                                             for o in reap.outstanding_then):
        return Check("lease-reaped", None, f"not checked: step {reap_while!r} had ended before P reaped the "
                                           f"abandoned leases, so no live entry stood in front of them ({text}); "
                                           "keep that step outstanding longer (e.g. saturate D longer)")
    return Check("lease-reaped", after <= bound, text, samples=reap.samples)  # reaped_ms: seen in a sample


def integrity_maps(obs: ScenarioObservation, result: SequenceResult) -> tuple[dict[str, str], ...]:
    """``(answered, abandoned, retried)`` for rig.judge.checks.kv_integrity_check: P's request ids
    (``remote_request_id``) -> ours. A pd-retry request whose retry answered equal to the reference,
    or failed cleanly, is ``retried`` (P freed its blocks after the first attempt's read: the line is
    the route's mechanism, not stale KV that reached a client); one that answered other tokens, or
    was not compared, is ``answered``."""
    routes = {e.request_id: e.route for e in result.entries}
    answered: dict[str, str] = {}
    abandoned: dict[str, str] = {}
    retried: dict[str, str] = {}
    for i, r in enumerate(obs.records):
        rid = (r.prefill.kv_transfer_params or {}).get("remote_request_id") if r.prefill else None
        if not rid:
            continue
        p = obs.parity[i] if i < len(obs.parity) else None
        if routes.get(r.request_id) == "pd-retry" and (r.outcome == "http_error" or (
                r.outcome == "ok" and p is not None and p.status == "equal")):
            retried[rid] = r.request_id
        else:
            (answered if r.outcome == "ok" else abandoned)[rid] = r.request_id
    return answered, abandoned, retried


def sequence_checks(sc: ScenarioConfig, obs: ScenarioObservation, result: SequenceResult | None) -> list[Check]:
    """The checks of a sequence scenario (module docstring), for rig.judge.verdict.judge."""
    if result is None or sc.sequence is None:
        return [Check("completed", None, "not checked: the sequence workload did not run")]
    spec = sc.sequence
    out = [completed_check(obs, result, spec)]
    pulling = any(s.route in PULLING_ROUTES for s in spec.steps)
    repeats = sc.parity and any(s.repeat_of for s in spec.steps)
    if nothing_to_answer(obs):
        how = "cancelled on purpose" if all_cut_on_purpose(obs) else "cancelled on purpose or refused on their retry"
        why = f"not checked: all {len(obs.records)} requests were {how}: no answer to "
        out.append(Check("token-counts", None, why + "count"))
        out += [Check("kv-pulled", None, why + "show a transfer for")] if pulling else []
        out += [Check("parity", None, why + "compare")] if sc.parity else []
        out += [Check("repeat-equal", None, why + "compare")] if repeats else []
    else:
        out.append(token_counts_check(spec, obs, result))
        if pulling:
            out.append(kv_pulled_pd_check(obs, result, spec))
        if sc.parity:
            out.append(parity_check(obs.records, obs.parity))
        if repeats:
            out.append(repeat_equal_check(spec, obs, result))
    if spec.routes_through_router:
        out.append(refusal_relayed_check(result))
    out.append(no_stall_check(result, obs.records))
    if "gauges-account" in sc.require:
        out.append(gauges_account_check(result, obs.baseline_request_s))
    if spec.abandons:
        out.append(lease_reaped_check(result, result.lease_s, spec.idle_margin_s, spec.reap_while))
    bound = f"within {result.idle_bound_s:g} s" + (" = kv_lease_duration + idle_margin_s"
                                                    if spec.abandons or spec.cancels else "")
    out.append(idle_check(obs, drains=result.drains, describe=lambda d: f"{d.describe()} ({bound})")
               if result.drains else Check("idle-after", None, "not checked: no drain was observed"))
    out += [alive_check(obs), fatal_log_check(obs), kv_integrity_check(obs, *integrity_maps(obs, result)),
            latency_check(obs)]
    streamed = stream_check(obs.records)
    return out + ([streamed] if streamed else [])


def sequence_required(sc: ScenarioConfig, obs: ScenarioObservation | None = None) -> tuple[str, ...]:
    """The checks a sequence scenario must earn: the kind's (rig.judge.verdict.REQUIRED), plus
    ``kv-pulled`` when a step goes P->D and ``lease-reaped`` when a step abandons its decode hop;
    without ``no-stall`` when no step sends a request to D (:data:`DECODE_ROUTES`: the watcher
    watches D, and a P-only sequence left it nothing to see); without :data:`ANSWER_CHECKS` when
    ``obs`` shows every request cut on purpose or refused on its retry
    (:func:`nothing_to_answer`: no answer was meant)."""
    base = required_checks(sc)
    spec = sc.sequence
    extra: tuple[str, ...] = ("kv-pulled",) if spec is not None and any(s.route in PULLING_ROUTES
                                                                         for s in spec.steps) else ()
    extra += ("lease-reaped",) if spec is not None and spec.abandons else ()
    extra += ("refusal-relayed",) if spec is not None and any(s.route == "router" and s.expect_status
                                                              for s in spec.steps) else ()
    extra += ("repeat-equal",) if spec is not None and sc.parity and any(s.repeat_of for s in spec.steps) else ()
    names = tuple(dict.fromkeys(base + extra))
    if spec is not None and not any(s.route in DECODE_ROUTES for s in spec.steps):
        names = tuple(n for n in names if n != "no-stall")
    if obs is not None and nothing_to_answer(obs):
        names = tuple(n for n in names if n not in ANSWER_CHECKS)
    return names


def judge_sequence(sc: ScenarioConfig, obs: ScenarioObservation, result: SequenceResult | None) -> ScenarioVerdict:
    """The verdict of a sequence scenario: :func:`sequence_checks` through the one engine
    (rig.judge.verdict.judge) with :func:`sequence_required`; a PASS of a sequence whose every
    request was cut on purpose says so, naming the checks that held."""
    v = judge(sc, obs, checks=sequence_checks(sc, obs, result), required=sequence_required(sc, obs),
              blocks=result.blocks if result is not None else None)
    if result is not None and all_cut_on_purpose(obs) and v.verdict == "PASS":
        v.reason = all_cancelled_reason(len(obs.records), v.checks)
    return v
