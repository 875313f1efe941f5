"""The constraints the rig itself imposes on a drawn request, checked before it is sent.

A request the rig makes invalid is a finding of the rig's own making: P refusing ``min_tokens: 2``
on a prefill hop the rig sends with ``max_tokens: 1``, a chat prompt the template pushes past
``max_model_len``, an answer without the token IDs the rig must read. So every drawn step is
*cleaned* as it is drawn (:func:`clean_fields`, :func:`chat_room`: no random number is consumed,
so a seed's actions keep their shapes) and every action, drawn or shrunk, is checked as a whole
(:func:`problems`): the generator raises on one (a grammar bug), the shrinker skips a candidate
with one (dropping ``seed`` while keeping ``temperature`` would make the reference comparison
meaningless).

The rules, each with where it comes from:

- **P's hop is max_tokens 1** (rig/transport/bodies.py ``prefill_body``): ``min_tokens`` on a hop
  must not exceed that hop's ``max_tokens`` (vLLM sampling_params.py ``_verify_args``: "min_tokens
  must be less than or equal to max_tokens"), so on the prefill hop of a P/D route at most 1.
- **Fields the rig reads** (:data:`MUST_READ`): ``return_token_ids`` false leaves no token IDs to
  compare (parity), so it is never drawn false.
- **Sampling needs a seed**: ``temperature > 0`` without ``seed`` on a hop is not reproducible,
  neither against the reference nor in a replay; ``n > 1`` needs ``temperature > 0`` (vLLM 0.32.0
  refuses several greedy choices, protocol.py ``to_sampling_params``).
- **Streamed hops carry no prompt logprobs**: vLLM refuses ``prompt_logprobs`` with ``stream``
  (completion/protocol.py ``check_logprobs``), so a streamed decode hop is not drawn beside them.
- **Chat templates add tokens**: a chat request carries the prompt's IDs as decimal words
  (rig.transport.bodies.chat_text: IDs below 1000, at most 4 bytes each with the space) inside the
  chat template; a byte-level tokenizer makes at most one token per byte, so the chat prompt is at
  most ``4 * n - 1 + chat_overhead`` tokens (the overhead measured with the server's
  ``/tokenize``, :func:`rig.explore.probe.chat_overhead`, else :data:`DEFAULT_CHAT_OVERHEAD`).
- **Within max_model_len**: each step's prompt as D gets it (P's first token appended by a
  ``transform``) plus its ``max_tokens``; a reused or extended prompt is the step's own length.
- **Start rules that can happen**: a step that starts after an event of a cancelled step other than
  ``sent`` may never start (a cut at 0 ms ends the step before P answers): only ``sent`` follows a
  cancelled step.
"""

from __future__ import annotations

from typing import Any

from rig.config.sequence import Step
from rig.explore.grammar import DEFAULT_CHAT_OVERHEAD, Action, Topology

MUST_READ: dict[str, Any] = {"return_token_ids": True}  # field -> the only value the rig can read
__all__ = ["DEFAULT_CHAT_OVERHEAD", "MUST_READ", "chat_room", "clean_fields", "problems", "step_problems"]
CHAT_BYTES_PER_ID = 4  # "999 ": prompt IDs are below 1000 (rig/workload/prompts.py DEFAULT_HI)
ONE_HOP = ("decode", "prefill", "router")
P_HOP = ("pd", "pd-abandon", "pd-retry", "pd-swallow-cancel")  # routes whose prefill hop the rig sends


def hop_limits(step: Step) -> dict[str, int]:
    """``{hop: max_tokens}`` of the hops ``step`` sends: the prefill hop of a P/D route asks for 1
    token, the decode hop (also the one hop of a one-hop route) and the reference for the step's."""
    out = {"reference": step.max_tokens}
    if step.route in P_HOP:
        out["prefill"] = 1
    if step.route != "pd-abandon":
        out["decode"] = step.max_tokens
    return out


def _field_problems(fields: dict[str, Any], max_tokens: int) -> list[str]:
    """What is wrong with one hop's ``fields`` under its ``max_tokens`` (the module's rules)."""
    out = []
    mt = fields.get("min_tokens")
    if isinstance(mt, int) and mt > max_tokens:
        out.append(f"min_tokens {mt} > the hop's max_tokens {max_tokens}")
    for k, v in MUST_READ.items():
        if k in fields and fields[k] != v:
            out.append(f"{k} {fields[k]!r}: the rig must read it ({v!r})")
    temp = fields.get("temperature") or 0
    if temp and fields.get("seed") is None:
        out.append(f"temperature {temp} without a seed: not reproducible")
    if (fields.get("n") or 1) > 1 and not temp:
        out.append(f"n {fields['n']} with greedy sampling: vLLM refuses several greedy choices")
    pl = fields.get("prompt_logprobs")
    if fields.get("stream") and isinstance(pl, int) and (pl > 0 or pl == -1):
        out.append("prompt_logprobs on a streamed hop: vLLM refuses it (completion/protocol.py)")
    return out


def step_problems(step: Step, topo: Topology) -> list[str]:
    """The rig-made problems of ``step`` on ``topo`` (empty: it may be sent)."""
    out = []
    for hop, mt in hop_limits(step).items():
        # a one-hop route sends its hop with the decode fields (rig.config.sequence.Step)
        fields = step.fields_for("decode" if hop == "decode" or step.route in ONE_HOP else hop)
        if hop == "reference":
            fields = step.fields_for("reference")
        out += [f"{hop} hop: {p}" for p in _field_problems(fields, mt)]
    d_prompt = step.prompt_tokens + (1 if step.appends else 0)
    if d_prompt + step.max_tokens > topo.max_model_len:
        out.append(f"prompt {d_prompt} + max_tokens {step.max_tokens} > max_model_len {topo.max_model_len}")
    if step.endpoint == "chat":
        chat = chat_tokens(step.prompt_tokens, topo.chat_overhead)
        if chat + step.max_tokens > topo.max_model_len:
            out.append(f"chat prompt of {step.prompt_tokens} IDs is up to {chat} tokens with the template: "
                       f"+ max_tokens {step.max_tokens} > max_model_len {topo.max_model_len}")
    return out


def problems(action: Action, topo: Topology) -> list[str]:
    """Every rig-made problem of ``action`` on ``topo``, each naming the step (empty: send it)."""
    out = [f"step {s.id}: {p}" for s in action.steps for p in step_problems(s, topo)]
    by_id = {s.id: s for s in action.steps}
    for s in action.steps:
        ref = by_id.get(s.start.after) if s.start else None
        if ref is not None and s.start is not None and ref.cancel_after_ms is not None and s.start.event != "sent":
            out.append(f"step {s.id}: starts after {ref.id} {s.start.event}, which {ref.id}'s cancel at "
                       f"{ref.cancel_after_ms[0]:g} ms may prevent: only 'sent' follows a cancelled step")
        if ref is not None and s.start is not None and ref.route == "pd-retry" and s.start.event == "answered":
            out.append(f"step {s.id}: starts after {ref.id} answered, which a retry refused cleanly (an HTTP "
                       "error, a pass on route pd-retry) never reaches: start it at decode-sent at the latest")
    return out


def chat_tokens(n: int, overhead: int) -> int:
    """Upper bound (tokens) of a chat prompt carrying ``n`` prompt IDs as decimal words."""
    return CHAT_BYTES_PER_ID * n - 1 + overhead


def chat_room(topo: Topology, max_tokens: int) -> int:
    """The longest prompt (IDs) a chat step with ``max_tokens`` may carry on ``topo`` (>= 1; when
    even 1 does not fit, the caller uses the completions endpoint)."""
    return max(1, (topo.max_model_len - max_tokens - topo.chat_overhead + 1) // CHAT_BYTES_PER_ID)


def chat_fits(topo: Topology, max_tokens: int) -> bool:
    """True when a one-ID chat prompt with ``max_tokens`` fits ``max_model_len``."""
    return chat_tokens(1, topo.chat_overhead) + max_tokens <= topo.max_model_len


def clean_fields(fields: dict[str, Any], route: str, max_tokens: int) -> dict[str, Any]:
    """``fields`` (drawn for every hop of a step on ``route``) without what the rig would make
    invalid: ``min_tokens`` lowered to the smallest ``max_tokens`` of the hops (1 when a P/D route
    sends a prefill hop), :data:`MUST_READ` fields set to their one value, ``n`` > 1 dropped unless
    sampled with a seed, ``temperature`` dropped without a ``seed``. Pure: consumes no random number."""
    out = dict(fields)
    cap = 1 if route in P_HOP else max_tokens
    if isinstance(out.get("min_tokens"), int) and out["min_tokens"] > cap:
        out["min_tokens"] = cap
    for k, v in MUST_READ.items():
        if k in out:
            out[k] = v
    if out.get("temperature") and out.get("seed") is None:
        out.pop("temperature")
    if (out.get("n") or 1) > 1 and not out.get("temperature"):
        out.pop("n")
    return out
