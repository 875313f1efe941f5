"""Output parity: a P/D answer against a non-disaggregated reference, token by token.

With greedy decoding, the same model and the same prompt, a correct KV transfer gives the same
tokens as serving the prompt without disaggregation. The most dangerous P/D failures (decode
reading freed, stale or never-filled blocks) return HTTP 200 with wrong tokens; this module is
what catches them. A comparison is only meaningful with identical output caps, so a pair whose
``max_tokens`` differ is *refused*, never reported as equal or diverged.

Every workload computes parity through one routine, :func:`run_parity` (fetch the references,
at most ``concurrency`` at a time, and compare per choice with :func:`compare_hops`);
:func:`record_parity` is its form for :class:`~rig.transport.client.PDRecord` lists (edge, fault
and store scenarios). The check that reads the results is rig.judge.checks.parity_check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rig.transport.records import Hop, PDRecord


@dataclass(frozen=True)
class ParityResult:
    """``status``: equal | diverged | refused. For ``diverged``, ``position`` is the first
    0-based output position that differs and ``pd_token``/``ref_token`` the tokens there
    (None where one side is shorter); ``choice`` the 0-based index of the first choice that
    differs when choices were compared one by one (:func:`compare_choices`), else None."""

    status: str
    position: int | None = None
    pd_token: int | None = None
    ref_token: int | None = None
    reason: str = ""
    choice: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict."""
        return asdict(self)

    def describe(self) -> str:
        """One line for tables: 'equal', 'diverged at 3: 517 != 12', 'refused: ...'."""
        if self.status == "diverged":
            where = f"{self.reason}: " if self.reason else ""
            if self.position is None:
                return f"diverged: {self.reason}"
            return f"diverged at {where}{self.position}: {self.pd_token} != {self.ref_token}"
        if self.status == "refused":
            return f"refused: {self.reason}"
        return self.status


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


def compare_hops(pd: Hop, ref: Hop, pd_max_tokens: int, ref_max_tokens: int) -> ParityResult:
    """:func:`compare_choices` when either :class:`rig.transport.records.Hop` has several choices, else
    :func:`compare` of their ``token_ids``."""
    if pd.choices or ref.choices:
        return compare_choices(pd.choices or [pd.token_ids or []], ref.choices or [ref.token_ids or []],
                               pd_max_tokens, ref_max_tokens)
    return compare(pd.token_ids or [], ref.token_ids or [], pd_max_tokens, ref_max_tokens)


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
                     timeout_s: float | None = None) -> list[ParityOutcome | None]:
    """Fetch the reference of every case (at most ``concurrency`` at a time, in case order;
    each within ``timeout_s`` seconds when given) and compare it with the answer
    (:func:`compare_hops`, per choice). Returns one outcome per case, None where the case is
    None (nothing to compare). A reference with an error or without token IDs is a failure,
    never a comparison. Raises ValueError for ``concurrency`` < 1."""
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
            out[i] = ParityOutcome(compare_hops(case.answer, ref, case.max_tokens, case.max_tokens), ref)

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
    return out


async def record_parity(records: Sequence[PDRecord],
                        reference: Callable[[PDRecord], Awaitable[Hop]]) -> list[ParityResult | None]:
    """:func:`run_parity` over the answered records (``outcome`` ok with a decode hop), one
    reference at a time: one result per record (None = not compared). A failed reference is
    written into the record's ``diagnosis`` (``parity reference failed: ...``)."""
    def case(rec: PDRecord) -> ParityCase | None:
        if rec.outcome != "ok" or rec.decode is None:
            return None
        return ParityCase(rec.decode, rec.max_tokens, lambda: reference(rec))

    outcomes = await run_parity([case(r) for r in records])
    for rec, o in zip(records, outcomes, strict=True):
        if o is not None and o.result is None:
            rec.diagnosis = f"parity reference failed: {o.failure}"
    return [o.result if o is not None else None for o in outcomes]
