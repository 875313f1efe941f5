"""Prompts as token-ID lists, so their lengths are exact (no tokenizer in the loop).

IDs are drawn from ``[lo, hi)``: ``lo`` skips the tiny model's special tokens (0-2) and ``hi``
stays inside every vocabulary the rig serves (the tiny model has 1,024 tokens; real models more).
"""

from __future__ import annotations

import hashlib
import random

DEFAULT_LO, DEFAULT_HI = 3, 1000


def seed_of(text: str) -> int:
    """A stable integer seed from a name (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def make_prompt(n_tokens: int, seed: int, lo: int = DEFAULT_LO, hi: int = DEFAULT_HI) -> list[int]:
    """``n_tokens`` pseudo-random token IDs in ``[lo, hi)``, the same for the same seed.

    Raises ValueError for a non-positive length or an empty ID range.
    """
    if n_tokens < 1:
        raise ValueError(f"prompt length must be >= 1 token (got {n_tokens})")
    if hi <= lo:
        raise ValueError(f"token ID range [{lo}, {hi}) is empty")
    rnd = random.Random(seed)
    return [rnd.randrange(lo, hi) for _ in range(n_tokens)]


def prefix_group_prompts(groups: int, per_group: int, prefix_tokens: int, suffix_tokens: int,
                         seed: int, lo: int = DEFAULT_LO, hi: int = DEFAULT_HI) -> list[list[list[int]]]:
    """``groups`` lists of ``per_group`` prompts; prompts of one group share a ``prefix_tokens``
    prefix and differ in a ``suffix_tokens`` suffix. Every prompt is prefix + suffix tokens long.
    """
    out = []
    for g in range(groups):
        prefix = make_prompt(prefix_tokens, seed_of(f"{seed}/prefix/{g}"), lo, hi) if prefix_tokens else []
        out.append([prefix + make_prompt(suffix_tokens, seed_of(f"{seed}/suffix/{g}/{i}"), lo, hi)
                    for i in range(per_group)])
    return out


def request_prompt(n_tokens: int, seed: int, prompts: int = 1) -> list[int] | list[list[int]]:
    """The prompt of one request: :func:`make_prompt` for ``prompts == 1``, else ``prompts``
    distinct ``n_tokens``-token lists (several prompts in one completions request; the first is
    the single prompt of the same seed). Raises ValueError as :func:`make_prompt`."""
    if prompts == 1:
        return make_prompt(n_tokens, seed)
    return [make_prompt(n_tokens, seed if k == 0 else seed_of(f"{seed}/prompt/{k}")) for k in range(prompts)]
