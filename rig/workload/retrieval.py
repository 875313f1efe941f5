"""Identifier retrieval: does a real model still find a needle after its KV crossed P -> D?

Token parity says the P/D answer equals the non-disaggregated one; retrieval says whether the
answer is *useful*, which matters for real models on GPU profiles (the tiny random model cannot
retrieve anything, so there the rates are 0 on both sides and only parity is meaningful). Each
prompt hides a random identifier (``K7Q-2M9``) at a chosen depth of a long filler context and
asks for it back; the rig serves it through P/D and, with identical caps, directly on the
reference instance, and reports both retrieval rates.

Prompts are text (the server tokenizes them), so their token length is approximate; size the
context with ``context_words`` well below ``max_model_len``.
"""

from __future__ import annotations

import functools
import random
import re
import string
from dataclasses import dataclass, field

from rig.observe.parity import ParityCase, ParityResult, run_parity
from rig.transport.client import Transport
from rig.transport.endpoint import Endpoint
from rig.transport.records import PDRecord, classify

_FILLER = ("The committee reviewed the quarterly logistics report and noted steady progress on "
           "warehouse automation, supplier onboarding and route planning across the northern region.")


def make_identifier(rng: random.Random) -> str:
    """A random identifier like ``K7Q-2M9`` (uppercase letters and digits)."""
    alphabet = string.ascii_uppercase + string.digits
    return "".join(rng.choice(alphabet) for _ in range(3)) + "-" + "".join(rng.choice(alphabet) for _ in range(3))


def make_retrieval_prompt(rng: random.Random, context_words: int, depth: float) -> tuple[str, str]:
    """``(prompt, identifier)``: ~``context_words`` words of filler with the identifier stated at
    relative ``depth`` (0 = start, 1 = end), then the question. Raises ValueError for a depth
    outside [0, 1]."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be within [0, 1] (got {depth})")
    ident = make_identifier(rng)
    vault = rng.randrange(1, 100)
    words = _FILLER.split()
    body = [words[i % len(words)] for i in range(context_words)]
    needle = f"Remember this: the access code for vault {vault} is {ident}."
    body.insert(int(depth * len(body)), needle)
    prompt = " ".join(body) + f"\nQuestion: what is the access code for vault {vault}?\nAnswer: the access code is"
    return prompt, ident


def retrieved(text: str | None, identifier: str) -> bool:
    """True when ``identifier`` appears in ``text`` (case and surrounding spaces ignored)."""
    if not text:
        return False
    return re.sub(r"\s+", "", identifier.upper()) in re.sub(r"\s+", "", text.upper())


@dataclass
class RetrievalResult:
    """Per-scenario outcome: records, identifiers, and hits through P/D and on the reference."""

    records: list[PDRecord] = field(default_factory=list)
    identifiers: list[str] = field(default_factory=list)
    pd_hits: int = 0
    ref_hits: int = 0
    compared: int = 0
    parity: list[ParityResult | None] = field(default_factory=list)

    def rates(self) -> tuple[float, float]:
        """``(P/D retrieval rate, reference rate)`` over the compared requests (0..1)."""
        n = max(self.compared, 1)
        return self.pd_hits / n, self.ref_hits / n


async def run_retrieval(client: Transport, p: Endpoint, d: Endpoint, ref: Endpoint, requests: int,
                        context_words: int, max_tokens: int, seed: int) -> RetrievalResult:
    """Send ``requests`` needle prompts through P/D and directly to ``ref`` (same ``max_tokens``).

    Requests run one after another: retrieval is about correctness, not load.
    """
    rng = random.Random(seed)
    out = RetrievalResult()
    for i in range(requests):
        prompt, ident = make_retrieval_prompt(rng, context_words, depth=(i + 0.5) / requests)
        rec = PDRecord(request_id=f"retrieval-{i}", prompt_len=len(prompt.split()), max_tokens=max_tokens)
        rec.prefill = await client.prefill(p, prompt)
        if classify(rec.prefill) != "ok" or not rec.prefill.kv_transfer_params:
            rec.outcome, rec.diagnosis = "http_error", f"prefill: {rec.prefill.error or 'no kv_transfer_params'}"
        else:
            rec.decode = await client.decode(d, prompt, max_tokens,
                                             rec.prefill.kv_transfer_params)
            rec.outcome = classify(rec.decode)
        out.records.append(rec)
        out.identifiers.append(ident)
        if rec.outcome != "ok" or rec.decode is None:
            out.parity.append(None)
            continue
        fetch = functools.partial(client.direct, ref, prompt, max_tokens)
        (o,) = await run_parity([ParityCase(rec.decode, max_tokens, fetch)])
        assert o is not None
        if o.result is None or o.hop is None:
            rec.diagnosis = f"reference failed: {o.failure}"
            out.parity.append(None)
            continue
        out.compared += 1
        out.pd_hits += retrieved(rec.decode.text, ident)
        out.ref_hits += retrieved(o.hop.text, ident)
        out.parity.append(o.result)
    return out
