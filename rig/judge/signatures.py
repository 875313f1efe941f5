"""Known-issue signatures matched against observations, field by field.

Like pytest's ``xfail(raises=...)``: a known issue excuses only the symptom its signature
describes, on the requests that show it. :func:`match` returns a :class:`Match`: which requests
show the symptom, which of their checks it explains, and a human account of what the signature
expected and what was seen (for the FAIL diagnosis when it does not match).

Requests of every kind are read through one vocabulary, :class:`RequestFacts` (edge, lease,
store and retrieval records via :func:`facts_of_records`, wave records via
:func:`facts_of_wave`): outcome ok | timeout | http_error | connection_error | empty |
cancelled | stalled, the failed hop's status and message, P's ``remote_request_id``, the
parity status and the stall facts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from rig.config import (
    AppendedTokenSignature,
    CrashSignature,
    HttpErrorSignature,
    LeakSignature,
    Signature,
    StaleKvSignature,
    StallSignature,
    WrongMetricsSignature,
    WrongOutputSignature,
)
from rig.config.blocks import BlockFacts, blocks_for, usable_in_pool
from rig.judge.cached_tokens import NAME as CACHED_TOKENS
from rig.judge.cached_tokens import cached_tokens_seen, overcounted
from rig.judge.checks import lease_released_ids, parent_request_id, prompt_index
from rig.observe.observations import ScenarioObservation
from rig.observe.parity import ParityResult
from rig.observe.stall import StallFacts
from rig.transport.records import Hop, PDRecord

# Checks a request-level symptom explains on the requests that show it.
REQUEST_CHECKS = frozenset({"completed", "token-counts", "kv-pulled", "parity", "no-errors", "no-empty"})


@dataclass(frozen=True)
class RequestFacts:
    """One request in the engine's vocabulary (see the module docstring)."""

    request_id: str
    outcome: str
    prompt_len: int
    hop: str | None = None  # prefill | decode: the hop that answered an error
    status: int | None = None
    error: str = ""
    remote_request_id: str | None = None
    parity: str | None = None  # equal | diverged | refused | None (not compared)
    stall: StallFacts | None = None
    prompts: int = 1  # token-ID prompts the request carried (request.prompts)
    diverged_prompt: int | None = None  # the prompt of the first diverged choice, when parity diverged per choice
    appended: bool = False  # a router transform appended P's first token to D's prompt (PDRecord.decode_prompt)
    decode_children: int = 1  # choices D's hop returned per prompt (n on the decode hop)
    prefill_children: int = 1  # choices P's hop returned per prompt (n on the prefill hop)
    diverged_choice: int | None = None  # the first diverged choice, when parity diverged per choice
    decode_prompt_len: int | None = None  # tokens of the prompt D got when a router changed it (None: prompt_len)
    retried: bool = False  # a router sent the decode hop again with the same params (route pd-retry)


def facts_of_records(obs: ScenarioObservation) -> list[RequestFacts]:
    """:class:`RequestFacts` of ``obs.records`` (PDRecord) with ``obs.parity`` alongside."""
    out = []
    for i, r in enumerate(obs.records):
        p: ParityResult | None = obs.parity[i] if i < len(obs.parity) else None
        hop = None
        for name, h in (("decode", r.decode), ("prefill", r.prefill)):
            if h is not None and h.error:
                hop = name
                break
        # P answered 200 without kv_transfer_params (rig.transport.records: outcome http_error,
        # no decode hop): the prefill hop is the one that failed (bug record R21's symptom).
        if hop is None and r.outcome == "http_error" and r.prefill is not None and r.decode is None:
            hop = "prefill"
        h = r.decode if hop == "decode" else r.prefill if hop == "prefill" else None
        prompts = r.prompt_count
        out.append(RequestFacts(
            request_id=r.request_id, outcome=r.outcome, prompt_len=r.prompt_len, hop=hop,
            status=h.status if h else None, error=(h.error or r.diagnosis) if h else r.diagnosis,
            remote_request_id=(r.prefill.kv_transfer_params or {}).get("remote_request_id") if r.prefill else None,
            parity=p.status if p else None, stall=r.stall, prompts=prompts,
            diverged_prompt=_diverged_prompt(r, p, prompts),
            appended=r.decode_prompt is not None, decode_children=children_per_prompt(r.decode, prompts),
            prefill_children=children_per_prompt(r.prefill, prompts),
            diverged_choice=p.choice if p is not None and p.status == "diverged" else None,
            decode_prompt_len=len(r.decode_prompt) if r.decode_prompt and isinstance(r.decode_prompt[0], int)
            else None, retried=r.first_decode is not None))
    return out


def children_per_prompt(hop: Hop | None, prompts: int) -> int:
    """The choices ``hop`` answered per prompt (its ``n``; vLLM orders a several-prompt answer's
    choices prompt by prompt, entrypoints/openai/completion/serving.py): 1 for a hop with no
    per-choice answer."""
    if hop is None or not hop.choices:
        return 1
    return max(1, len(hop.choices) // max(1, prompts))


def _diverged_prompt(r: PDRecord, p: ParityResult | None, prompts: int) -> int | None:
    """The prompt whose choice diverged first: vLLM orders a several-prompt answer's choices
    prompt by prompt, ``n`` per prompt (entrypoints/openai/completion/serving.py, 0.32.0)."""
    if p is None or p.status != "diverged" or p.choice is None:
        return None
    choices = len(r.decode.choices) if r.decode is not None and r.decode.choices else prompts
    return p.choice // max(1, choices // prompts)


def facts_of_wave(records: list[Any]) -> list[RequestFacts]:
    """:class:`RequestFacts` of wave records (rig.transport.records.WaveRecord): a
    ``parity_mismatch`` is an answered request whose parity diverged; intentional cancels keep
    outcome ``cancelled``."""
    out = []
    for r in records:
        outcome = "ok" if r.outcome == "parity_mismatch" else r.outcome
        hop = "decode" if r.d_status not in (None, 200) else "prefill" if r.p_status not in (None, 200) else None
        out.append(RequestFacts(
            request_id=r.request_id, outcome=outcome, prompt_len=r.prompt_len, hop=hop,
            status=r.d_status if hop == "decode" else r.p_status if hop == "prefill" else None,
            error=r.diagnosis or "", remote_request_id=r.remote_request_id,
            parity="diverged" if r.outcome == "parity_mismatch" else ("equal" if r.parity == "equal" else None)))
    return out


def admission_of(prompt_len: int, blocks: BlockFacts | None, facts: StallFacts) -> tuple[str, str]:
    """``(finding, arithmetic)`` for a request of ``prompt_len`` tokens waiting on an instance:
    ``fits-but-waits`` when the blocks its first decode step needs,
    ``cdiv(min(n + 1 + k, max_model_len), block_size)`` (the per-request count upstream vLLM
    uses instead of 0.32.0's flat ``_spec_decode_step_blocks``, scheduler.py), are at most the
    free blocks (usable x (1 - KV usage)) yet it waits for capacity; ``never-fits`` when it needs
    more than the usable blocks; ``fits`` otherwise; ``unknown`` without block facts. Usable blocks
    come from ``vllm:cache_config_info`` (facts) when exposed, else from the config."""
    if blocks is None:
        return "unknown", "no block facts for this instance"
    usable = usable_in_pool(facts.num_gpu_blocks) if facts.num_gpu_blocks else blocks.usable_blocks
    bs = facts.block_size or blocks.block_size
    if usable is None:
        return "unknown", "usable blocks unknown (no num_gpu_blocks_override, no vllm:cache_config_info)"
    k = blocks.num_speculative_tokens
    need = blocks_for(min(prompt_len + 1 + k, blocks.max_model_len), bs)
    free = int(usable * (1 - facts.kv_usage) + 1e-9)
    text = (f"n={prompt_len} k={k} block_size={bs}: needs {need} blocks, {free} of {usable} usable free")
    if need > usable:
        return "never-fits", text
    if need <= free and facts.waiting_reasons.get("capacity", 0) > 0:
        return "fits-but-waits", text
    return "fits", text


@dataclass(frozen=True)
class Match:
    """The result of matching a signature: ``requests`` that show the symptom, the request
    checks it explains on them (``explains``), the run-level checks it explains (``run_checks``),
    what was seen (``seen``) and, when nothing matched, ``expected`` vs ``seen`` for the FAIL."""

    requests: frozenset[str] = frozenset()
    explains: frozenset[str] = frozenset()
    run_checks: frozenset[str] = frozenset()
    seen: str = ""
    expected: str = ""
    shown: str = ""  # what the matched requests showed (the XFAIL reason)
    instances: frozenset[str] = field(default_factory=frozenset)  # dead instances it explains

    @property
    def matched(self) -> bool:
        """True when some request (or, for a crash, the instance) shows the symptom."""
        return bool(self.requests) or bool(self.instances)


def _role_name(role: str, obs: ScenarioObservation) -> str:
    return {"decode": obs.decode, "prefill": obs.prefill}.get(role, role)


def _stall(sig: StallSignature, obs: ScenarioObservation, reqs: list[RequestFacts],
           blocks: BlockFacts | None) -> Match:
    want = _role_name(sig.instance, obs)
    expected = [f"instance {sig.instance} ({want})"]
    if sig.waiting_reason:
        expected.append(f"waiting reason {sig.waiting_reason}")
    if sig.kv_fetch_stage:
        expected.append(f"kv_fetch {sig.kv_fetch_stage}")
    if sig.kv_usage_max is not None:
        expected.append(f"kv <= {sig.kv_usage_max * 100:g}%")
    if sig.kv_usage_min is not None:
        expected.append(f"kv >= {sig.kv_usage_min * 100:g}%")
    if sig.admission:
        expected.append(f"admission {sig.admission}")
    hits, seen, shown = [], [], []
    for r in reqs:
        if r.outcome != "stalled" or r.stall is None:
            if r.outcome != "ok":
                seen.append(f"{r.request_id}: {r.outcome}" + (f" ({r.error[:120]})" if r.error else ""))
            continue
        f = r.stall
        if f.evidence is not None and f.evidence.inconclusive:  # the host's doing may be all it shows
            seen.append(f"{r.request_id}: stalled inconclusively ({f.evidence.text()})")
            continue
        misses = []
        if f.instance != want:
            misses.append(f"instance {f.instance}")
        if sig.waiting_reason and f.waiting_reasons.get(sig.waiting_reason, 0) <= 0:
            misses.append(f"waiting reasons {dict(f.waiting_reasons) or 'none'}")
        if sig.kv_fetch_stage and f.kv_fetch_stages.get(sig.kv_fetch_stage, 0) <= 0:
            misses.append(f"kv_fetch {dict(f.kv_fetch_stages) or 'none'}")
        if ((sig.kv_usage_max is not None and f.kv_usage > sig.kv_usage_max)
                or (sig.kv_usage_min is not None and f.kv_usage < sig.kv_usage_min)):
            misses.append(f"kv {f.kv_usage * 100:.1f}%")
        # The blocks D needs follow the prompt D got (a router's appended first token counts).
        d_len = r.decode_prompt_len or r.prompt_len
        if sig.admission:
            finding, arith = admission_of(d_len, blocks, f)
            if finding != sig.admission:
                misses.append(f"admission {finding} ({arith})")
        if misses:
            seen.append(f"{r.request_id}: stalled with " + ", ".join(misses))
        else:
            hits.append(r.request_id)
            arith = admission_of(d_len, blocks, f)[1] if sig.admission else ""
            # The early verdict's diagnosis already states the arithmetic: say it once.
            shown.append(f"{r.request_id}: {r.error}" + (f" [{arith}]" if arith and arith not in r.error else ""))
    detail = "; ".join(seen) or "no stalled request"
    # no-stall: the sequence kind's freeze check, named per stalled request (rig.judge.sequence_checks).
    return Match(frozenset(hits), REQUEST_CHECKS | {"kv-integrity", "no-stall"}, frozenset(sig.excuses),
                 seen=detail, expected="stall with " + ", ".join(expected), shown="; ".join(shown))


def _http(sig: HttpErrorSignature, reqs: list[RequestFacts]) -> Match:
    hits, seen = [], []
    for r in reqs:
        if r.outcome == "ok":
            continue
        if r.outcome == "http_error" and r.hop == sig.hop and (sig.status is None or r.status == sig.status) \
                and (sig.message is None or re.search(sig.message, r.error or "")):
            hits.append(r.request_id)
        else:
            seen.append(f"{r.request_id}: {r.outcome} on {r.hop or '-'}" + (f" {r.error[:120]}" if r.error else ""))
    expected = (f"HTTP {sig.status or 'error'} on the {sig.hop} hop"
                + (f" matching /{sig.message}/" if sig.message else ""))
    first = next((r for r in reqs if r.request_id in hits), None)
    return Match(frozenset(hits), REQUEST_CHECKS, frozenset(sig.excuses),
                 seen="; ".join(seen) or "no HTTP error", expected=expected,
                 shown=f"{first.request_id}: {first.error[:160]}" if first else "")


def _crash(sig: CrashSignature, obs: ScenarioObservation, reqs: list[RequestFacts]) -> Match:
    name = _role_name(sig.instance, obs)
    line = obs.death_lines.get(name) or next(iter(obs.fatal_lines.get(name) or []), "")
    expected = f"{name} dies with a fatal line matching /{sig.fatal_log}/"
    others = sorted(n for n in obs.dead if n != name)
    if name not in obs.dead:
        return Match(seen=f"{name} alive" + (f"; {', '.join(others)} died" if others else ""), expected=expected)
    if not re.search(sig.fatal_log, line or ""):
        return Match(seen=f"{name} died (exit {obs.dead[name]}): {line[:200] or 'no fatal line'}", expected=expected)
    failed = frozenset(r.request_id for r in reqs if r.outcome != "ok")
    return Match(failed, REQUEST_CHECKS | {"kv-integrity"},
                 frozenset(sig.excuses) | ({"alive", "no-fatal-log"} if not others else frozenset()),
                 seen=f"{name} died (exit {obs.dead[name]}): {line[:200]}", expected=expected,
                 shown=f"{name} died (exit {obs.dead[name]}): {line[:200]}", instances=frozenset({name}))


def _invalid_block_lines(obs: ScenarioObservation) -> list[str]:
    """P's ``Potentially invalid KV blocks for unrecognized request <id>`` lines (nixl pull_worker.py)."""
    return [ln for v in obs.kv_integrity_lines.values() for ln in v if "Potentially invalid KV blocks" in ln]


def _stale(sig: StaleKvSignature, obs: ScenarioObservation, reqs: list[RequestFacts]) -> Match:
    if sig.cause == "shared-params":
        return _shared_params(sig, obs, reqs)
    if sig.cause == "decode-children":
        return _decode_children(sig, obs, reqs)
    lines = _invalid_block_lines(obs)
    hits, seen, shown = [], [], []
    for r in [r for r in reqs if r.retried] if sig.cause == "retry" else reqs:  # retry: the retried hops only
        rid = r.remote_request_id
        named = rid is not None and rid != "" and any(rid in ln for ln in lines)
        diverged = r.parity == "diverged"
        if r.outcome == "ok" and named and (diverged or not sig.parity):
            hits.append(r.request_id)
            shown.append(f"{r.request_id}: P's 'Potentially invalid KV blocks' line names its remote_request_id "
                         f"{r.remote_request_id}, parity {r.parity or 'not compared'}")
        elif named or diverged or r.outcome != "ok":
            seen.append(f"{r.request_id}: {r.outcome}, P's invalid-blocks line "
                        f"{'names it' if named else 'does not name it'}, parity {r.parity or 'not compared'}")
    expected = (("a retried decode hop" if sig.cause == "retry" else "an answered request")
                + " named by P's 'Potentially invalid KV blocks' line"
                + (" whose parity diverged" if sig.parity else ""))
    return Match(frozenset(hits), frozenset({"kv-integrity", "parity", "token-counts"}), frozenset(sig.excuses),
                 seen="; ".join(seen) or "no invalid-blocks line, no divergence", expected=expected,
                 shown="; ".join(shown))


def _decode_children(sig: StaleKvSignature, obs: ScenarioObservation, reqs: list[RequestFacts]) -> Match:
    """Stale KV read by D's later parallel-sampling children (``cause: decode-children``, see
    :class:`rig.config.StaleKvSignature`): an answered one-prompt request whose decode hop returned
    ``n`` > 1 choices and whose prefill hop one, named by P's invalid-blocks line; a divergence
    counts only on a choice after 0 (the first child read P's blocks before they were freed); with
    ``parity`` (default) one is required, with ``parity: false`` it is allowed (whether P reused
    the freed blocks before a later child read them is a race). Explains kv-integrity, kv-pulled
    and parity on those requests."""
    lines = _invalid_block_lines(obs)
    hits, seen, shown = [], [], []
    for r in reqs:
        rid = r.remote_request_id or ""
        named = bool(rid) and any(rid in ln for ln in lines)
        later_choice = (r.parity == "diverged" and (r.diverged_choice or 0) > 0) or \
            (not sig.parity and r.parity != "diverged")
        parity = (f"choice {r.diverged_choice} diverged" if r.parity == "diverged" and r.diverged_choice is not None
                  else f"parity {r.parity or 'not compared'}")
        if (r.outcome == "ok" and named and r.prompts == 1 and r.decode_children > 1 and r.prefill_children == 1
                and later_choice):
            hits.append(r.request_id)
            shown.append(f"{r.request_id}: n={r.decode_children} on the decode hop, P's 'Potentially invalid KV "
                         f"blocks' line names its remote_request_id {rid} (a later child read blocks the first "
                         f"child's done notice freed), {parity}")
        elif named or r.parity == "diverged" or r.outcome != "ok":
            seen.append(f"{r.request_id}: {r.outcome}, n={r.decode_children} on the decode hop, "
                        f"n={r.prefill_children} on the prefill hop, {r.prompts} prompt(s), P's invalid-blocks line "
                        f"{'names it' if named else 'does not name it'}, {parity}")
    expected = ("an answered one-prompt request with n > 1 on the decode hop only, named by P's 'Potentially "
                "invalid KV blocks' line, " + ("a choice after 0 diverged" if sig.parity else "choice 0 equal"))
    return Match(frozenset(hits), frozenset({"kv-integrity", "kv-pulled", "parity"}), frozenset(sig.excuses),
                 seen="; ".join(seen) or "no invalid-blocks line, no divergence", expected=expected,
                 shown="; ".join(shown))


def _shared_params(sig: StaleKvSignature, obs: ScenarioObservation, reqs: list[RequestFacts]) -> Match:
    """Stale KV of a several-prompt request given one prompt's params (``cause: shared-params``,
    see :class:`rig.config.StaleKvSignature`): answered, P's invalid-blocks line names the params'
    ``remote_request_id`` (D's second read of that prompt's blocks), the params name prompt ``k``
    and the first diverged choice belongs to a prompt after ``k`` (with ``parity: false`` no
    divergence is needed, but none may reach prompt ``k``). released-by-d is explained only
    while no lease line names a matched request's own params: those blocks D did read."""
    lines = _invalid_block_lines(obs)
    released = lease_released_ids(obs.kv_integrity_lines.get(obs.prefill, []))
    hits, seen, shown, own = [], [], [], []
    for r in reqs:
        rid = r.remote_request_id or ""
        named = bool(rid) and any(rid in ln for ln in lines)
        k = prompt_index(rid)
        later = k is not None and r.diverged_prompt is not None and r.diverged_prompt > k
        parity_fits = later or (not sig.parity and r.parity != "diverged")
        parity = (f"prompt {r.diverged_prompt}'s choice diverged" if r.diverged_prompt is not None
                  else f"parity {r.parity or 'not compared'}")
        if r.outcome == "ok" and r.prompts > 1 and named and k is not None and parity_fits:
            hits.append(r.request_id)
            siblings = [x for x, _ in released if x != rid and parent_request_id(x) == parent_request_id(rid)]
            own += [r.request_id for x, _ in released if x == rid]
            shown.append(f"{r.request_id}: {r.prompts} prompts, P's params name prompt {k} only ({rid}) and P's "
                         f"'Potentially invalid KV blocks' line names it (D read those blocks again), {parity}"
                         + (f"; P's lease released {', '.join(siblings)}" if siblings else ""))
        elif named or r.parity == "diverged" or r.outcome != "ok":
            seen.append(f"{r.request_id}: {r.outcome}, {r.prompts} prompt(s), params name "
                        f"{'prompt ' + str(k) if k is not None else rid or 'nothing'}, P's invalid-blocks line "
                        f"{'names it' if named else 'does not name it'}, {parity}")
    seen += [f"{x}: P's lease released the blocks of the prompt the params name (D read them)" for x in own]
    expected = ("an answered several-prompt request whose params name one prompt, named again by P's 'Potentially "
                "invalid KV blocks' line" + (", that prompt's choice equal and a later prompt's diverged"
                                             if sig.parity else ""))
    explains = frozenset({"kv-integrity", "parity"} | (set() if own else {"released-by-d"}))
    return Match(frozenset(hits), explains, frozenset(sig.excuses),
                 seen="; ".join(seen) or "no invalid-blocks line, no divergence", expected=expected,
                 shown="; ".join(shown))


def _wrong(sig: WrongOutputSignature, reqs: list[RequestFacts]) -> Match:
    hits = [r.request_id for r in reqs if r.outcome == "ok" and r.parity == "diverged"]
    seen = "; ".join(f"{r.request_id}: {r.outcome}" for r in reqs if r.outcome != "ok") or "no divergence"
    return Match(frozenset(hits), frozenset({"parity"}), frozenset(sig.excuses), seen=seen,
                 expected="an answered request whose tokens diverge from the reference",
                 shown=", ".join(hits) + " diverged from the reference")


def _appended(sig: AppendedTokenSignature, obs: ScenarioObservation, reqs: list[RequestFacts]) -> Match:
    """Wrong tokens on the appended requests and/or D's death with the assert (the signature's docstring)."""
    wrong = [r.request_id for r in reqs if r.appended and r.outcome == "ok" and r.parity == "diverged"]
    d_prompts = {tuple(r.decode_prompt) for r in obs.records if r.decode_prompt is not None}
    repeats = {r.request_id for r in obs.records if r.decode_prompt is None
               and tuple(r.prompt) in d_prompts}
    corrupted = [r.request_id for r in reqs if r.request_id in repeats and r.outcome == "ok"
                 and r.parity == "diverged"] if sig.cache_corrupted else []
    # The assert fires in D's worker: vLLM logs the worker's traceback (quoting the assert's source
    # line) before EngineCore's fatal line, so the regex is searched in every fatal line of D, and
    # the death is still named with D's first fatal line (the exception that ended it).
    name = obs.decode
    lines = [obs.death_lines.get(name), *(obs.fatal_lines.get(name) or [])]
    hit = next((ln for ln in lines if ln and re.search(sig.fatal_log, ln)), None)
    # the signature's excuses are added to the run checks below, with or without a death
    crash = _crash(CrashSignature(kind="crash", instance="decode", fatal_log=sig.fatal_log),
                   replace(obs, death_lines={**obs.death_lines, name: hit}) if hit else obs, reqs)
    if crash.matched and hit is not None and hit != obs.death_lines.get(name):
        death = f"{name} died (exit {obs.dead[name]}): {obs.death_lines.get(name, '')[:160]}"
        crash = replace(crash, seen=f"{death}; fatal line: {hit[:160]}", shown=f"{death}; fatal line: {hit[:160]}")
    expected = ("an answered request with P's first token appended whose tokens differ from the reference of the "
                f"prompt D got, and/or {crash.expected}")
    shown = ([f"{', '.join(wrong)}: HTTP 200, tokens differ from the reference of the appended prompt"] if wrong
             else []) + ([f"{', '.join(corrupted)}: a later request for the prompt D got diverges too (D's prefix "
                          "cache)"] if corrupted else []) + ([crash.shown] if crash.matched else [])
    other = [r.request_id for r in reqs if r.outcome == "ok" and r.parity == "diverged" and not r.appended
             and r.request_id not in corrupted]
    # crash.seen always says something ("<D> alive" at least)
    seen = "; ".join(([f"{', '.join(other)} diverged without an appended token"] if other else []) + [crash.seen])
    if not wrong and not crash.matched:
        return Match(seen=seen, expected=expected)
    # A dead D has no /metrics after the scenario: its pulls cannot be read ("not checked"); the
    # death explains that gap, never a kv-pulled failure on a request (those carry request ids).
    return Match(frozenset(wrong) | frozenset(corrupted) | crash.requests,
                 crash.explains | ({"parity", "repeat-equal"} if sig.cache_corrupted else {"parity"}),
                 frozenset(sig.excuses) | crash.run_checks | ({"kv-pulled"} if crash.matched else set()),
                 seen=seen, expected=expected, shown="; ".join(shown),
                 instances=crash.instances)


def _leak(sig: LeakSignature, obs: ScenarioObservation, reqs: list[RequestFacts]) -> Match:
    released = lease_released_ids(obs.kv_integrity_lines.get(obs.prefill, []))
    want = {"sibling": "a sibling child's blocks", "request": "its own blocks", "any": "its or a sibling's blocks"}
    hits, seen, shown = [], [], []
    for r in reqs:
        if r.outcome != "ok" or not r.remote_request_id:
            continue
        parent = parent_request_id(r.remote_request_id)
        family = [(rid, text) for rid, text in released if parent_request_id(rid) == parent]
        fits = [(rid, text) for rid, text in family
                if sig.blocks_of == "any" or (rid == r.remote_request_id) == (sig.blocks_of == "request")]
        if fits:
            hits.append(r.request_id)
            shown.append(f"{r.request_id}: params name {r.remote_request_id}, P's lease released {fits[0][0]}")
        elif family:
            seen.append(f"{r.request_id}: P's lease released {', '.join(rid for rid, _ in family)} "
                        f"(params name {r.remote_request_id})")
    expected = f"an answered request whose {want[sig.blocks_of]} P's lease reaper released (not D's read)"
    return Match(frozenset(hits), frozenset({"released-by-d"}), frozenset(sig.excuses),
                 seen="; ".join(seen) or f"no lease release of an answered request's blocks in {obs.prefill}'s log",
                 expected=expected, shown="; ".join(shown))


def _wrong_metrics(sig: WrongMetricsSignature, obs: ScenarioObservation) -> Match:
    # sig.check == "cached-tokens" (the only one so far): the requests the check fails on whose D
    # reported at least min_cached_share of the prompt as cached (bug record R15's D-counts-the-pull).
    over = overcounted(obs) or []
    share = sig.min_cached_share
    hits = [c for c in over if c.prompt and c.d >= share * c.prompt]
    expected = (f"an answered request whose D reports >= {share:.0%} of its prompt as cached_tokens, above P's "
                "hits + D's local hits")
    seen = "; ".join(f"{c.record.request_id}: P {c.p}, D {c.d} of {c.prompt}" for c in cached_tokens_seen(obs)[:3])
    return Match(frozenset(c.record.request_id for c in hits), frozenset({CACHED_TOKENS}), frozenset(sig.excuses),
                 seen=seen or "no answer reported usage.prompt_tokens_details on both hops", expected=expected,
                 shown="; ".join(f"{c.record.request_id}: D cached_tokens {c.d} of {c.prompt}, P's hits {c.p}"
                                 for c in hits[:3]))


def match(sig: Signature, obs: ScenarioObservation, reqs: list[RequestFacts], blocks: BlockFacts | None = None
          ) -> Match:
    """Match signature ``sig`` (rig.config.Signature) on ``obs`` / ``reqs``; see :class:`Match`.
    ``blocks``: the decode's block arithmetic, needed by a stall signature's ``admission``."""
    if isinstance(sig, StallSignature):
        return _stall(sig, obs, reqs, blocks)
    if isinstance(sig, HttpErrorSignature):
        return _http(sig, reqs)
    if isinstance(sig, CrashSignature):
        return _crash(sig, obs, reqs)
    if isinstance(sig, StaleKvSignature):
        return _stale(sig, obs, reqs)
    if isinstance(sig, WrongOutputSignature):
        return _wrong(sig, reqs)
    if isinstance(sig, LeakSignature):
        return _leak(sig, obs, reqs)
    if isinstance(sig, WrongMetricsSignature):
        return _wrong_metrics(sig, obs)
    if isinstance(sig, AppendedTokenSignature):
        return _appended(sig, obs, reqs)
    raise TypeError(f"unknown signature {type(sig).__name__}")
