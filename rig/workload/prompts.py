"""Prompts as token-ID lists, so their lengths are exact (no tokenizer in the loop).

IDs are drawn from ``[lo, hi)``: ``lo`` skips the tiny model's special tokens (0-2) and ``hi``
stays inside every vocabulary the rig serves (the tiny model has 1,024 tokens; real models more).

The seed rule: a prompt is a pure function of its seed and its length (:func:`make_prompt`), and
a shorter prompt of a seed is a prefix of a longer one of the same seed. A scenario's seed is its
``seed`` field, else :func:`seed_of` its name (attach mode salts it per run:
``rig.cli.fresh_prompt_seeds``); an edge or fault scenario's request ``i`` uses ``seed + i``, a
sequence step's request ``k`` uses ``seed_of(f"{seed}/{step}/{k}")``. So the same config draws the
same prompts in every run, and two scenarios share a prompt only when they say so.

Prompt resources (:func:`resolve`): a request reuses another request's prompt by name, ``same_as``
(the whole prompt: N identical copies when the step or scenario sends N) or ``head_of`` (its
first ``prompt_tokens`` tokens). A name is ``<step>`` (a step of the same sequence scenario),
``<scenario>/<step>`` (a step of another sequence scenario) or ``<scenario>`` (an edge or fault
scenario: its request 0). The names are resolved against the run's scenarios with their run
seeds, so reuse holds within a run in attach mode too; rig.config.topology validates them.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from rig.config.scenarios import ScenarioConfig, find_source
from rig.config.sequence import Step

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


def scenario_seed(sc: ScenarioConfig) -> int:
    """The seed of ``sc``'s prompts: its ``seed`` field, else :func:`seed_of` its name."""
    return sc.seed if sc.seed is not None else seed_of(sc.name)


def resolve(scenarios: Sequence[ScenarioConfig], sc: ScenarioConfig, step: Step | None,
            k: int, _seen: frozenset[str] = frozenset()) -> list[int] | list[list[int]]:
    """The prompt of request ``k`` of ``sc`` (of its ``step`` for a sequence), following its
    ``same_as`` / ``head_of`` through ``scenarios`` (the run's, with their run seeds). A request
    with neither gets its own prompt by the seed rule (module docstring); ``same_as`` gives every
    ``k`` the source's prompt, ``head_of`` its first ``prompt_tokens`` tokens. Raises KeyError
    for a name that points nowhere, ValueError for a cycle of names."""
    holder = step if step is not None else sc
    key = f"{sc.name}/{step.id}" if step is not None else sc.name
    ref = holder.same_as or holder.head_of
    if ref is None:
        seed = scenario_seed(sc)
        if step is None:
            fields = sc.request
            return request_prompt(sc.prompt_tokens, seed + k, fields.prompts if fields else 1)
        return request_prompt(step.prompt_tokens, seed_of(f"{seed}/{step.id}/{k}"), step.prompts)
    if key in _seen:
        raise ValueError(f"prompt names form a cycle through {key!r}")
    src_sc, src_step = find_source(scenarios, sc, ref)
    prompt = resolve(scenarios, src_sc, src_step, 0, _seen | {key})
    assert isinstance(prompt[0], int)  # the config refuses a source with several prompts
    return list(prompt[:holder.prompt_tokens])
