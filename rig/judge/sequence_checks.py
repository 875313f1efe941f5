"""The checks of a sequence scenario (bug record R02, R06), from its observation and the executor's
:class:`~rig.workload.sequence.SequenceResult`. Tri-state like every check (:mod:`rig.judge.checks`):
what could not be looked at is "not checked", never ok.

- ``completed``: every request ended with D's (or, route prefill, P's) answer; an abandoned
  request (route pd-abandon) counts when P answered its prefill hop. Failed per request, named
  with its step, outcome and diagnosis.
- ``token-counts``: per step, every answered request has ``max_tokens`` completion tokens and
  ``prompt_tokens`` prompt tokens in its usage (times ``request.prompts``, completion also times
  ``n``; a chat step's prompt count is the template's, not checked), and as many token IDs.
- ``kv-pulled``: only the ``pd`` steps' answered requests: their prompts came over NIXL (or D's
  own prefix cache), as many transfers as requests (rig.judge.verdict's rule; straight-to-D
  requests compute their prompt on D and are left out).
- ``no-stall``: D never froze with requests waiting while requests were outstanding; the
  detail is the diagnosis, naming the steps whose requests were outstanding (a run check: a
  known issue excuses it with ``excuses: [no-stall]``).
- ``lease-reaped`` (steps with route pd-abandon): P's ``nixl_num_kv_expired_reqs_total`` rose by
  the abandoned requests within ``nixl.kv_lease_duration + sequence.idle_margin_s`` of the last
  abandoned prefill answer; the detail names the steps still outstanding then (bug record R06: a
  heartbeated head must not shield expired leases; vllm/.../nixl/base_worker.py
  ``_reap_expired_send_leases``, PR #50789).
- ``idle-after`` over the kind's own drains, with the bound it applied.
"""

from __future__ import annotations

from dataclasses import replace

from rig.config import ScenarioConfig
from rig.config.sequence import SequenceConfig
from rig.judge.checks import (
    Check,
    alive_check,
    fatal_log_check,
    idle_check,
    inconclusive_stall,
    kv_integrity_check,
    parity_check,
    stream_check,
)
from rig.judge.verdict import _kv_pulled, required_checks  # the one kv-pulled rule, over the pd steps only
from rig.observe.observations import ScenarioObservation
from rig.transport.records import PDRecord
from rig.workload.sequence import ABANDONED, SequenceResult


def _step_of(result: SequenceResult) -> dict[str, tuple[str, str]]:
    return {e.request_id: (e.step, e.route) for e in result.entries}


def _ended_well(rec: PDRecord, route: str) -> bool:
    if route == "pd-abandon":
        return rec.outcome == "cancelled" and rec.diagnosis == ABANDONED
    return rec.outcome == "ok"


def completed_check(obs: ScenarioObservation, result: SequenceResult) -> Check:
    """``completed``: every request answered (abandoned ones: P answered); see the module docstring."""
    steps = _step_of(result)
    if not obs.records:
        return Check("completed", None, "not checked: no request was sent")
    bad = [r for r in obs.records if not _ended_well(r, steps[r.request_id][1])]
    if not bad:
        n_ab = sum(1 for r in obs.records if steps[r.request_id][1] == "pd-abandon")
        return Check("completed", True, f"{len(obs.records) - n_ab} answered"
                     + (f", {n_ab} abandoned after P answered" if n_ab else ""))
    text = "; ".join(f"{r.request_id} (step {steps[r.request_id][0]}): {r.outcome}"
                     + (f" ({r.diagnosis[:200]})" if r.diagnosis else "") for r in bad[:6])
    more = f"; and {len(bad) - 6} more" if len(bad) > 6 else ""
    return Check("completed", False, text + more, tuple(r.request_id for r in bad))


def token_counts_check(spec: SequenceConfig, obs: ScenarioObservation, result: SequenceResult) -> Check:
    """``token-counts`` per step over the answered requests (usage of the answering hop)."""
    steps = _step_of(result)
    by = {s.id: s for s in spec.steps}
    answered = [r for r in obs.records if r.outcome == "ok" and r.decode is not None]
    if not answered:
        return Check("token-counts", None, "not checked: no answered request")
    bad: list[str] = []
    per_step: dict[str, int] = {}
    for r in answered:
        s = by[steps[r.request_id][0]]
        usage = r.decode.usage or {} if r.decode else {}
        got = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
        per_step[s.id] = per_step.get(s.id, 0) + 1
        # several prompts in one request (request.prompts) and n choices: usage sums them
        n = int(s.fields_for("decode").get("n") or 1)
        want: tuple[int | None, int] = (s.prompt_tokens * s.prompts, s.max_tokens * s.prompts * n)
        if s.endpoint == "chat":  # the chat template wraps the prompt: only the completion is known
            got, want = (None, got[1]), (None, want[1])
        why = [f"usage prompt/completion {got[0]}/{got[1]}, expected {want[0]}/{want[1]}"] if got != want else []
        if r.decode and r.decode.token_ids is not None and len(r.decode.token_ids) != got[1]:
            why.append(f"{len(r.decode.token_ids)} token_ids but usage says {got[1]}")
        if why:
            bad.append(f"{r.request_id}: " + ", ".join(why))
    if bad:
        return Check("token-counts", False, "; ".join(bad[:6]),
                     tuple(b.split(":", 1)[0] for b in bad))
    return Check("token-counts", True, ", ".join(f"{sid}: {n} x {by[sid].prompt_tokens}+{by[sid].max_tokens}"
                                                for sid, n in per_step.items()))


def kv_pulled_pd_check(obs: ScenarioObservation, result: SequenceResult) -> Check:
    """``kv-pulled`` over the ``pd`` steps' requests only (rig.judge.verdict's rule)."""
    steps = _step_of(result)
    pd = [r for r in obs.records if steps[r.request_id][1] == "pd"]
    c = _kv_pulled(replace(obs, records=pd))
    return Check(c.name, c.ok, f"pd steps only: {c.detail}", c.requests)


def no_stall_check(result: SequenceResult, records: list[PDRecord] | None = None) -> Check:
    """``no-stall``: the stall watcher on D saw no freeze while requests were outstanding. Not
    checked (None) when the freeze's evidence in ``records`` is inconclusive (the engine starved
    by a loaded host, or compiling: rig.observe.stall)."""
    if result.stall:
        if records and any(inconclusive_stall(r) for r in records):
            return Check("no-stall", None, f"not checked: D froze, inconclusively: {result.stall}")
        return Check("no-stall", False, result.stall)
    return Check("no-stall", True, "D never froze with requests waiting while requests were outstanding")


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
    if reap.reaped_ms is None:
        return Check("lease-reaped", False, f"P's nixl_num_kv_expired_reqs_total rose by {reap.rose:g} of "
                                            f"{reap.want} within kv_lease_duration + idle_margin_s = {bound:g} s "
                                            "of the last abandoned prefill answer: expired leases not reaped")
    after = (reap.reaped_ms - reap.last_abandoned_ms) / 1000
    then = ", ".join(reap.outstanding_then) or "no request"
    text = (f"P's expired counter rose by {reap.rose:g} (>= {reap.want} abandoned) {after:.1f} s after the last "
            f"abandoned prefill answer (bound {bound:g} s), while outstanding: {then}")
    if after <= bound and reap_while is not None and not any(o.split(" ", 1)[0] == reap_while
                                                             for o in reap.outstanding_then):
        return Check("lease-reaped", None, f"not checked: step {reap_while!r} had ended before P reaped the "
                                           f"abandoned leases, so no live entry stood in front of them ({text}); "
                                           "keep that step outstanding longer (e.g. saturate D longer)")
    return Check("lease-reaped", after <= bound, text)


def sequence_checks(sc: ScenarioConfig, obs: ScenarioObservation, result: SequenceResult | None) -> list[Check]:
    """The checks of a sequence scenario (module docstring), for rig.judge.verdict.judge."""
    if result is None or sc.sequence is None:
        return [Check("completed", None, "not checked: the sequence workload did not run")]
    spec = sc.sequence
    out = [completed_check(obs, result), token_counts_check(spec, obs, result)]
    if any(s.route == "pd" for s in spec.steps):
        out.append(kv_pulled_pd_check(obs, result))
    if sc.parity:
        out.append(parity_check(obs.records, obs.parity))
    out.append(no_stall_check(result, obs.records))
    if spec.abandons:
        out.append(lease_reaped_check(result, result.lease_s, spec.idle_margin_s, spec.reap_while))
    bound = f"within {result.idle_bound_s:g} s" + (" = kv_lease_duration + idle_margin_s" if spec.abandons else "")
    out.append(idle_check(obs, drains=result.drains, describe=lambda d: f"{d.describe()} ({bound})")
               if result.drains else Check("idle-after", None, "not checked: no drain was observed"))
    out += [alive_check(obs), fatal_log_check(obs), kv_integrity_check(obs)]
    streamed = stream_check(obs.records)
    return out + ([streamed] if streamed else [])


def sequence_required(sc: ScenarioConfig) -> tuple[str, ...]:
    """The checks a sequence scenario must earn: the kind's (rig.judge.verdict.REQUIRED), plus
    ``kv-pulled`` when a step goes P->D and ``lease-reaped`` when a step abandons its decode hop."""
    base = required_checks(sc)
    spec = sc.sequence
    extra: tuple[str, ...] = ("kv-pulled",) if spec is not None and any(s.route == "pd" for s in spec.steps) else ()
    extra += ("lease-reaped",) if spec is not None and spec.abandons else ()
    return tuple(dict.fromkeys(base + extra))
