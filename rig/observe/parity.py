"""Output parity: a P/D answer against a non-disaggregated reference, field by field.

With greedy decoding, the same model and the same prompt, a correct KV transfer gives the same
tokens as serving the prompt without disaggregation. The most dangerous P/D failures (decode
reading freed, stale or never-filled blocks) return HTTP 200 with wrong tokens; this module is
what catches them. A comparison is only meaningful with identical output caps, so a pair whose
``max_tokens`` differ is *refused*, never reported as equal or diverged.

Every workload computes parity through one routine, :func:`run_parity` (fetch the references,
at most ``concurrency`` at a time, and compare per choice with :func:`compare_hops`: the token
IDs first, then every other field both answers carry, :func:`compare_fields`);
:func:`record_parity` is its form for :class:`~rig.transport.client.PDRecord` lists (edge, fault
and store scenarios). The check that reads the results is rig.judge.checks.parity_check.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rig.config.scenarios import DEFAULT_PARITY_TOLERANCE
from rig.transport.records import Hop, PDRecord


@dataclass(frozen=True)
class ParityResult:
    """``status``: equal | diverged | refused. For ``diverged``, ``position`` is the first
    0-based output position that differs and ``pd_token``/``ref_token`` the tokens there
    (None where one side is shorter); ``choice`` the 0-based index of the first choice that
    differs when choices were compared one by one (:func:`compare_choices`), else None.

    Beyond the token IDs (:func:`compare_fields`): ``field`` is the path of the first answer
    field that differs (``choices[0].prompt_logprobs[3]["17"].logprob``, ``usage.prompt_tokens``)
    with ``pd_value`` / ``ref_value`` its values (short reprs); ``not_compared`` the fields only
    the P/D answer carries (the reference did not ask for them); ``max_float_diff`` the largest
    absolute difference of the floats compared (logprobs), against ``tolerance``."""

    status: str
    position: int | None = None
    pd_token: int | None = None
    ref_token: int | None = None
    reason: str = ""
    choice: int | None = None
    field: str | None = None
    pd_value: str | None = None
    ref_value: str | None = None
    not_compared: tuple[str, ...] = ()
    max_float_diff: float | None = None
    tolerance: float | None = None

    def describe(self) -> str:
        """One line for tables: 'equal', 'diverged at 3: 517 != 12', 'refused: ...'."""
        if self.status == "diverged":
            where = f"{self.reason}: " if self.reason else ""
            if self.field is not None:
                tol = f" (float tolerance {self.tolerance:g})" if self.tolerance is not None else ""
                return f"diverged at {self.field}: {self.pd_value} != {self.ref_value}{tol}"
            if self.position is None:
                return f"diverged: {self.reason}"
            return f"diverged at {where}{self.position}: {self.pd_token} != {self.ref_token}"
        if self.status == "refused":
            return f"refused: {self.reason}"
        return self.status  # the notes (:meth:`notes`) are the parity check's detail

    def notes(self) -> str:
        """``' (floats within 3e-06, tolerance 0.001; not compared, only in the P/D answer: ...)'``
        or ''."""
        parts = []
        if self.max_float_diff is not None:
            parts.append(f"floats within {self.max_float_diff:.3g}, tolerance {self.tolerance:g}")
        if self.not_compared:
            parts.append("not compared: " + ", ".join(self.not_compared))
        return f" ({'; '.join(parts)})" if parts else ""


def compare(pd_tokens: list[int], ref_tokens: list[int], pd_max_tokens: int, ref_max_tokens: int) -> ParityResult:
    """Compare generated token IDs of a P/D answer and its reference.

    Refused when the output caps differ (the comparison would mean nothing). A length
    difference is a divergence at the first missing position.
    """
    if pd_max_tokens != ref_max_tokens:
        return ParityResult("refused", reason=f"max_tokens differ (P/D {pd_max_tokens}, reference {ref_max_tokens})")
    for i in range(max(len(pd_tokens), len(ref_tokens))):
        a = pd_tokens[i] if i < len(pd_tokens) else None
        b = ref_tokens[i] if i < len(ref_tokens) else None
        if a != b:
            return ParityResult("diverged", position=i, pd_token=a, ref_token=b)
    return ParityResult("equal")


def compare_choices(pd_choices: list[list[int]], ref_choices: list[list[int]], pd_max_tokens: int,
                    ref_max_tokens: int) -> ParityResult:
    """Parity per choice (``n`` > 1 or several prompts in one request): choice
    ``i`` of the P/D answer against choice ``i`` of the reference, the first that is not equal
    (its ``reason`` names the choice) or equal. A different number of choices is a divergence."""
    if len(pd_choices) != len(ref_choices):
        return ParityResult("diverged", reason=f"{len(pd_choices)} choices, reference {len(ref_choices)}")
    for i, (a, b) in enumerate(zip(pd_choices, ref_choices, strict=True)):
        r = compare(a, b, pd_max_tokens, ref_max_tokens)
        if r.status != "equal":
            where = f"choice {i}" + (f": {r.reason}" if r.reason else "")
            return ParityResult(r.status, r.position, r.pd_token, r.ref_token, where, choice=i)
    return ParityResult("equal")


# The default float tolerance of field parity: ScenarioConfig.parity_tolerance's default, the
# largest absolute difference allowed between a P/D answer's logprob and the reference's.
DEFAULT_TOLERANCE = DEFAULT_PARITY_TOLERANCE
# Answer fields that legitimately differ between a P/D answer and its reference, so never compared:
# ``cached_tokens`` counts prefix-cache hits, which depend on where the prompt's KV came from (P
# served it once already; D pulled it), not on the answer; the cached-tokens check
# (rig/judge/cached_tokens.py) bounds it instead.
NOT_ANSWER = frozenset({"usage.prompt_tokens_details.cached_tokens"})


@dataclass
class _Walk:
    tol: float
    skipped: list[str]
    max_diff: float | None = None
    first: tuple[str, Any, Any] | None = None


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _walk(w: _Walk, path: str, a: Any, b: Any) -> bool:
    """True when ``a`` (P/D) equals ``b`` (reference) under the tolerance; records the first
    difference in ``w.first`` and stops there. A mapping's :data:`NOT_ANSWER` keys are skipped
    (every other path is a list index or a key of a mapping)."""
    if isinstance(a, bool) or isinstance(b, bool) or not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        if isinstance(a, dict) and isinstance(b, dict):
            for k in list(a) + [k for k in b if k not in a]:
                sub = (f"{path}.{k}" if path else k) if k.isidentifier() else f"{path}[{k!r}]"
                if sub in NOT_ANSWER:
                    continue
                if k not in b or (b[k] is None and a.get(k) is not None):
                    w.skipped.append(f"{sub} (P/D only)")
                    continue
                if k not in a:  # a whole answer's key a stream never sent (or sent only as null)
                    if b[k] is not None:
                        w.skipped.append(f"{sub} (reference only)")
                    continue
                if not _walk(w, sub, a.get(k), b[k]):
                    return False
            return True
        if isinstance(a, list) and isinstance(b, list):
            for i in range(max(len(a), len(b))):
                if i >= len(a) or i >= len(b):
                    w.first = (f"{path}[{i}]", a[i] if i < len(a) else "<missing>",
                               b[i] if i < len(b) else "<missing>")
                    return False
                if not _walk(w, f"{path}[{i}]", a[i], b[i]):
                    return False
            return True
        if a != b or isinstance(a, bool) != isinstance(b, bool):  # True == 1 in Python, not in JSON
            w.first = (path, a, b)
            return False
        return True
    if isinstance(a, int) and isinstance(b, int):
        if a != b:
            w.first = (path, a, b)
            return False
        return True
    fa, fb = float(a), float(b)
    if fa == fb or (math.isnan(fa) and math.isnan(fb)):
        diff = 0.0
    else:
        diff = abs(fa - fb)  # inf vs a finite number, or opposite infinities: inf (nan: not equal)
        if math.isnan(diff):
            diff = math.inf
    w.max_diff = diff if w.max_diff is None else max(w.max_diff, diff)
    if diff > w.tol:
        w.first = (path, a, b)
        return False
    return True


def compare_fields(pd: dict[str, Any], ref: dict[str, Any], tolerance: float = DEFAULT_TOLERANCE) -> ParityResult:
    """Every field of a P/D answer that its reference also carries, compared: ``pd`` and ``ref``
    are mappings such as ``{"choices": Hop.answer_fields["choices"], "usage": Hop.usage}``.

    Numbers that are both integers (token IDs, ranks, counts) must be equal; any other number
    (logprobs) may differ by at most ``tolerance`` (absolute; infinities equal themselves);
    strings, booleans and None exactly; lists element by element (a length difference is a
    difference at the first missing index); mappings key by key. A key the P/D answer has and
    the reference lacks (or has as None) is *not compared*, named in ``not_compared`` with
    ``(P/D only)``: the reference did not ask for it. A key the P/D answer lacks altogether is
    not compared either (``(reference only)``: a streamed answer has no ``usage`` unless asked,
    and omits null fields); None in the P/D answer where the reference has a value is a
    difference (a build that dropped the field). :data:`NOT_ANSWER` paths are skipped. Returns
    ``equal`` or ``diverged`` at the first differing ``field`` (walked in the P/D answer's key
    order), with ``max_float_diff`` over the floats compared up to there. Raises ValueError for a
    negative ``tolerance``."""
    if tolerance < 0:
        raise ValueError(f"parity tolerance must be >= 0 (got {tolerance})")
    w = _Walk(tolerance, [])
    ok = _walk(w, "", pd, ref)
    skipped = tuple(dict.fromkeys(w.skipped))
    if ok:
        return ParityResult("equal", not_compared=skipped, max_float_diff=w.max_diff, tolerance=tolerance)
    assert w.first is not None  # _walk records the difference whenever it returns False
    path, a, b = w.first
    return ParityResult("diverged", field=path, pd_value=_short(a), ref_value=_short(b), not_compared=skipped,
                        max_float_diff=w.max_diff, tolerance=tolerance)


def _fields_of(hop: Hop) -> dict[str, Any]:
    """What :func:`compare_fields` compares of a hop: its ``answer_fields`` and ``usage``."""
    out: dict[str, Any] = dict(hop.answer_fields or {})
    if hop.usage is not None:
        out["usage"] = hop.usage
    return out


def compare_hops(pd: Hop, ref: Hop, pd_max_tokens: int, ref_max_tokens: int,
                 tolerance: float = DEFAULT_TOLERANCE) -> ParityResult:
    """The token IDs first (:func:`compare_choices` when either
    :class:`rig.transport.records.Hop` has several choices, else :func:`compare` of their
    ``token_ids``); when they are equal, every other field both answers carry
    (:func:`compare_fields` over ``answer_fields`` and ``usage``, floats within ``tolerance``)."""
    if pd.choices or ref.choices:
        r = compare_choices(pd.choices or [pd.token_ids or []], ref.choices or [ref.token_ids or []],
                            pd_max_tokens, ref_max_tokens)
    else:
        r = compare(pd.token_ids or [], ref.token_ids or [], pd_max_tokens, ref_max_tokens)
    if r.status != "equal":
        return r
    f = compare_fields(_fields_of(pd), _fields_of(ref), tolerance)
    if f.field is not None and (at := re.match(r"choices\[(\d+)\]", f.field)):
        f = replace(f, choice=int(at.group(1)))
    return f


def summarize(results: list[ParityResult | None]) -> dict[str, int]:
    """Counts ``{compared, equal, diverged, refused}`` over results (None = not compared)."""
    done = [r for r in results if r is not None]
    return {"compared": sum(r.status != "refused" for r in done),
            "equal": sum(r.status == "equal" for r in done),
            "diverged": sum(r.status == "diverged" for r in done),
            "refused": sum(r.status == "refused" for r in done)}


@dataclass(frozen=True)
class ParityCase:
    """One answer to compare: the P/D ``answer`` (its ``token_ids`` / ``choices``), its
    ``max_tokens`` (the reference is asked for the same cap) and ``reference``, which sends the
    non-disaggregated reference request and returns its :class:`~rig.transport.client.Hop`."""

    answer: Hop
    max_tokens: int
    reference: Callable[[], Awaitable[Hop]]


@dataclass(frozen=True)
class ParityOutcome:
    """What :func:`run_parity` found for one case: ``result`` (None when the reference failed,
    ``failure`` says why: its error, ``no token_ids`` or ``timeout: deadline``) and the
    reference ``hop`` (None on a timeout)."""

    result: ParityResult | None
    hop: Hop | None = None
    failure: str = ""


async def run_parity(cases: Sequence[ParityCase | None], concurrency: int = 1,
                     timeout_s: float | None = None,
                     tolerance: float = DEFAULT_TOLERANCE) -> list[ParityOutcome | None]:
    """Fetch the reference of every case (at most ``concurrency`` at a time, in case order;
    each within ``timeout_s`` seconds when given) and compare it with the answer
    (:func:`compare_hops`, per choice, then field by field with floats within ``tolerance``).
    Returns one outcome per case, None where the case is None (nothing to compare). A reference
    with an error or without token IDs is a failure, never a comparison. Raises ValueError for ``concurrency`` < 1."""
    if concurrency < 1:
        raise ValueError(f"parity concurrency must be >= 1 (got {concurrency})")
    out: list[ParityOutcome | None] = [None] * len(cases)
    todo = iter([(i, c) for i, c in enumerate(cases) if c is not None])

    async def worker() -> None:
        for i, case in todo:
            try:
                async with asyncio.timeout(timeout_s):
                    ref = await case.reference()
            except TimeoutError:
                out[i] = ParityOutcome(None, None, "timeout: deadline")
                continue
            if ref.error or ref.token_ids is None:
                out[i] = ParityOutcome(None, ref, ref.error or "no token_ids")
                continue
            out[i] = ParityOutcome(compare_hops(case.answer, ref, case.max_tokens, case.max_tokens, tolerance), ref)

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
    return out


async def record_parity(records: Sequence[PDRecord], reference: Callable[[PDRecord], Awaitable[Hop]],
                        tolerance: float = DEFAULT_TOLERANCE) -> list[ParityResult | None]:
    """:func:`run_parity` over the answered records (``outcome`` ok with a decode hop), one
    reference at a time, floats within ``tolerance``: one result per record (None = not
    compared). Each record keeps its reference answer (``PDRecord.reference``, in report.json);
    a failed reference is written into the record's ``diagnosis`` (``parity reference failed: ...``).
    A request refused with a 4xx (:func:`refused`) gets its reference sent as well, not compared:
    what the non-disaggregated server does with the same request."""
    def case(rec: PDRecord) -> ParityCase | None:
        if rec.outcome != "ok" or rec.decode is None:
            return None
        return ParityCase(rec.decode, rec.max_tokens, lambda: reference(rec))

    outcomes = await run_parity([case(r) for r in records], tolerance=tolerance)
    for rec, o in zip(records, outcomes, strict=True):
        if o is not None:
            rec.reference = o.hop
        if o is not None and o.result is None:
            rec.diagnosis = f"parity reference failed: {o.failure}"
    for rec in records:  # a refusal is judged by what the reference does with the same request
        if refused(rec) and rec.reference is None:
            try:
                async with asyncio.timeout(REFUSAL_REFERENCE_S):
                    rec.reference = await reference(rec)
            except TimeoutError:
                rec.diagnosis += f"; the refusal's reference did not answer within {REFUSAL_REFERENCE_S:g} s"
    return [o.result if o is not None else None for o in outcomes]


REFUSAL_REFERENCE_S = 60.0  # a refused request's reference: a refusal answers at once, an answer within this


def refused(rec: PDRecord) -> bool:
    """True for a request that ended with a 4xx on one of its hops (a refusal): its reference is
    sent too (``PDRecord.reference``), so a refusal counts only when the reference accepts."""
    hops = [h for h in (rec.prefill, rec.decode) if h is not None]
    return rec.outcome == "http_error" and any(h.status is not None and 400 <= h.status < 500 for h in hops)
