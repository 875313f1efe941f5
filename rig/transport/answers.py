"""Reading vLLM's answers: error bodies, whole answers and SSE streams, for completions and chat.

The shapes are vLLM 0.32.0's (vllm/entrypoints/openai/completion/protocol.py
``CompletionResponse``/``CompletionStreamResponse``; chat_completion/protocol.py
``ChatCompletionResponse``/``ChatCompletionStreamResponse``): a choice carries ``token_ids``
(the request sets ``return_token_ids``) and ``text`` (completions), ``message.content`` (chat) or
``delta.content`` (chat stream). Choices are ordered by ``index`` (prompt index * ``n`` + sample).
The token-in generate endpoint's answer (entrypoints/scale_out/token_in_token_out/protocol.py
``GenerateTokensResponse``) has the same ``choices[].token_ids`` / ``finish_reason``, ``usage`` and
top-level ``kv_transfer_params``, and no text (``output_mode: tokens``): it is read by the same code
(tests/data/vllm-0.32.0-generate-*.json are recorded answers).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

import msgspec

from rig.transport.records import Hop, HopFailure

# msgspec's JSON codec: bodies (token-ID lists) encode and answers decode several times faster than
# the standard library's json (figures: docs/measurements.md). Its DecodeError is a ValueError.
encode = msgspec.json.Encoder().encode
decode = msgspec.json.Decoder().decode


def error_text(status: int, text: str) -> str:
    """``HTTP <code>: <message>`` from vLLM's error JSON (``{"error": {"message": ...}}`` or
    ``{"message": ...}``), else the first 300 characters of the body."""
    try:
        body = json.loads(text)
        err = body.get("error") if isinstance(body, dict) else None
        msg = err.get("message") if isinstance(err, dict) else (body.get("message") if isinstance(body, dict) else None)
        return f"HTTP {status}: {msg or text[:300]}"
    except ValueError:
        return f"HTTP {status}: {text[:300]}"


def _text(choice: dict[str, Any]) -> str:
    """A choice's text: ``text`` (completions), ``message.content`` or ``delta.content`` (chat)."""
    if "text" in choice:
        return choice.get("text") or ""
    part = choice.get("message") or choice.get("delta") or {}
    return part.get("content") or ""


# Choice fields the rig reads on their own (``token_ids`` is compared token by token) and so are
# not kept in ``Hop.answer_fields``.
CHOICE_SKIP = frozenset({"index", "token_ids"})
# Top-level answer fields that are content (chat puts the prompt's logprobs and IDs there, vLLM
# 0.32.0 chat_completion/protocol.py ``ChatCompletionResponse``); the others (id, created, model,
# system_fingerprint, kv_transfer_params, ...) say how it was served, not what was answered.
TOP_CONTENT = ("prompt_logprobs", "prompt_token_ids")


def answer_fields(choices: list[dict[str, Any]], body: dict[str, Any]) -> dict[str, Any]:
    """``Hop.answer_fields`` of an answer: ``{"choices": [choice without index/token_ids, ...]}``
    (``choices`` already in index order) plus :data:`TOP_CONTENT` fields ``body`` carries."""
    out: dict[str, Any] = {"choices": [{k: v for k, v in c.items() if k not in CHOICE_SKIP} for c in choices]}
    out.update({k: body[k] for k in TOP_CONTENT if k in body})
    return out


CONCATENATED = frozenset({"text", "content", "reasoning", "reasoning_content"})


def merge_chunk(acc: dict[str, Any], part: dict[str, Any]) -> None:
    """Merge one stream chunk's choice ``part`` into the choice ``acc`` built so far, in place:
    strings (``text``, ``content``) are concatenated, lists (``token_logprobs``, ``top_logprobs``,
    ``text_offset``, chat's ``content`` logprobs, ``prompt_token_ids``) extended, mappings merged
    key by key, anything else (``finish_reason``, ``stop_reason``, ``role``) replaced; None
    adds nothing. A chat ``delta`` is merged as ``message`` (the shape of a whole answer)."""
    for k, v in part.items():
        if v is None or k in CHOICE_SKIP:
            continue
        k = "message" if k == "delta" else k
        old = acc.get(k)
        if isinstance(v, str) and isinstance(old, str) and k in CONCATENATED:
            acc[k] = old + v
        elif isinstance(v, list) and isinstance(old, list):
            old.extend(v)
        elif isinstance(v, dict):
            if not isinstance(old, dict):
                old = acc[k] = {}
            merge_chunk(old, v)
        else:
            acc[k] = list(v) if isinstance(v, list) else v


def fill_from_answer(hop: Hop, body: dict[str, Any]) -> None:
    """Copy usage, token IDs, text, finish reason and ``kv_transfer_params`` of a whole
    ``/v1/completions`` or ``/v1/chat/completions`` answer into ``hop``; with several choices,
    ``hop.choices`` holds each one's token IDs and ``token_ids``/``text`` their concatenation.
    Every other choice field (logprobs, prompt_logprobs, stop_reason, ...) goes to
    ``hop.answer_fields`` (:func:`answer_fields`)."""
    choices = sorted(body.get("choices") or [{}], key=lambda c: c.get("index", 0))
    choice = choices[0]
    hop.answer_fields = answer_fields(choices, body)
    hop.usage = body.get("usage")
    hop.token_ids = choice.get("token_ids")
    hop.text = _text(choice)
    hop.finish_reason = choice.get("finish_reason")
    hop.kv_transfer_params = body.get("kv_transfer_params")
    if len(choices) > 1:
        hop.choices = [list(c.get("token_ids") or []) for c in choices]
        hop.token_ids = [t for ids in hop.choices for t in ids]
        hop.text = "".join(_text(c) for c in choices)


class StreamReader:
    """Reads one SSE answer into ``hop``: ``feed`` each ``data:`` payload, then :meth:`finish`.

    Fills ``ttft_s`` (seconds from ``t0`` to the first token), ``usage``, the token IDs per
    choice index and ``stream_problem`` when the stream is not complete and in order (a choice
    without a ``finish_reason``, tokens after its choice finished, no ``[DONE]``).
    ``stop_after`` tokens: ``feed`` returns True (stop reading) and the hop's finish reason is
    ``cancelled`` (an intentional cancellation during D's stream), unless a choice already finished.
    """

    __slots__ = ("hop", "t0", "stop_after", "per_choice", "finished", "problems", "done", "count", "text",
                 "fields", "top", "on_first")

    def __init__(self, hop: Hop, t0: float, stop_after: int | None = None,
                 on_first: Callable[[], None] | None = None):
        self.hop, self.t0, self.stop_after = hop, t0, stop_after
        self.on_first = on_first  # called once, at the first payload (the hop's "first-byte" event)
        self.per_choice: dict[int, list[int]] = {}
        self.finished: dict[int, str] = {}
        self.problems: list[str] = []
        self.done, self.count = False, 0
        self.text: list[str] = []
        self.fields: dict[int, dict[str, Any]] = {}  # per choice index, merged (merge_chunk)
        self.top: dict[str, Any] = {}

    def feed(self, payload: bytes | str) -> bool:
        """One SSE ``data:`` payload (JSON or ``[DONE]``); True = stop reading. Raises
        ValueError for a payload that is not JSON."""
        if self.on_first is not None:
            first, self.on_first = self.on_first, None
            first()
        if payload[:1] == "[" or payload[:1] == b"[":  # [DONE]
            self.done = True
            return False
        return self.feed_obj(decode(payload))

    def feed_obj(self, chunk: dict[str, Any]) -> bool:
        """One parsed stream chunk; True = stop reading."""
        hop = self.hop
        if chunk.get("usage"):
            hop.usage = chunk["usage"]
        for k in TOP_CONTENT:
            if chunk.get(k) is not None:
                self.top.setdefault(k, chunk[k])
        for choice in chunk.get("choices") or ():
            i = choice.get("index", 0)
            merge_chunk(self.fields.setdefault(i, {}), choice)
            ids = choice.get("token_ids") or ()
            text = _text(choice)
            if (ids or text) and hop.ttft_s is None:
                hop.ttft_s = time.monotonic() - self.t0
            if i in self.finished and (ids or text):
                self.problems.append(f"choice {i} got tokens after finish_reason {self.finished[i]!r}")
            self.per_choice.setdefault(i, []).extend(ids)
            self.count += len(ids)
            self.text.append(text)
            if choice.get("finish_reason"):
                self.finished[i] = hop.finish_reason = choice["finish_reason"]
        # A finished stream is never cut (its usage chunk after the finish_reason is no token).
        if self.stop_after is not None and hop.finish_reason is None and self.count >= self.stop_after:
            hop.finish_reason = "cancelled"
            return True
        return False

    def finish(self) -> Hop:
        """Set the hop's tokens, text, choices and ``stream_problem``; returns the hop."""
        hop, order = self.hop, sorted(self.per_choice)
        hop.token_ids = [t for i in order for t in self.per_choice[i]]
        hop.text = "".join(self.text)
        hop.answer_fields = answer_fields([self.fields[i] for i in sorted(self.fields)], self.top)
        if len(order) > 1:
            hop.choices = [self.per_choice[i] for i in order]
        if hop.error is None and hop.finish_reason != "cancelled":
            unfinished = [i for i in order if i not in self.finished]
            if unfinished:
                self.problems.append(f"choice(s) {unfinished} ended without a finish_reason")
            if not self.done:
                self.problems.append("no [DONE] at the end of the stream")
            hop.stream_problem = "; ".join(self.problems)
        return hop


async def consume_sse(hop: Hop, status: int, read_body: Callable[[], Awaitable[bytes]],
                      lines: AsyncIterable[bytes] | AsyncIterable[str], reader: StreamReader) -> bool:
    """Read one streamed answer into ``hop`` through ``reader``: the HTTP ``status``; on a non-200
    the error body (``read_body()``) as ``hop.error``; else every ``data:`` line of ``lines``
    until the reader asks to stop. Returns True when it stopped early (the caller then drops the
    connection so vLLM aborts the request). Raises ValueError for a chunk that is not JSON."""
    hop.status = status
    if status != 200:
        hop.fail(HopFailure.HTTP_ERROR, error_text(status, (await read_body()).decode("utf-8", "replace")))
        return False
    async for line in lines:
        if line[:6] in (b"data: ", "data: ") and reader.feed(line[6:].rstrip()):
            return True
    return False


def hop_error(e: BaseException, timeouts: type[BaseException] | tuple[type[BaseException], ...],
              connection: type[BaseException] | tuple[type[BaseException], ...]) -> tuple[HopFailure, str]:
    """A hop's failure kind and error text for an exception of the HTTP library (for
    :meth:`Hop.fail`): timeout, ``timeout: <class>`` for its ``timeouts``; connection_error,
    ``connection error: <class>: <message>`` for its ``connection`` errors and
    ``connection error: bad SSE chunk: <message>`` for a ValueError raised by a stream chunk."""
    if isinstance(e, timeouts):
        return HopFailure.TIMEOUT, f"timeout: {type(e).__name__}"
    if isinstance(e, ValueError) and not isinstance(e, connection):
        return HopFailure.CONNECTION_ERROR, f"connection error: bad SSE chunk: {e}"
    return HopFailure.CONNECTION_ERROR, f"connection error: {type(e).__name__}: {e}"
