"""The P/D client: the two-hop request exactly as vLLM's disaggregated proxy makes it.

1. Prefill hop: POST ``/v1/completions`` to P with ``max_tokens: 1`` and
   ``kv_transfer_params = {do_remote_decode: true, do_remote_prefill: false, remote_*: null}``.
   P computes the prompt's KV, keeps its blocks for decode and answers with
   ``kv_transfer_params`` (``do_remote_prefill: true``, ``remote_block_ids``,
   ``remote_engine_id``, ``remote_host``/``remote_port`` of its NIXL side channel, ...).
2. Decode hop: POST the same prompt and sampling parameters to D with P's
   ``kv_transfer_params``; D pulls the KV blocks over NIXL and generates.

(vLLM: tests/v1/kv_connector/nixl_integration/toy_proxy_server.py; the NixlConnector's
``request_finished`` builds P's answer.) Prompts are token-ID lists and every request sets
``temperature: 0``, ``ignore_eos: true`` and ``return_token_ids: true``, so token counts are
exact and outputs comparable token by token with a non-disaggregated reference
(:func:`PDClient.direct`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from rig.observe.stall import StallFacts

PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


@dataclass
class Hop:
    """One HTTP request of a P/D exchange (or a direct reference request).

    ``latency_s`` is wall time from send to full answer (seconds); ``ttft_s`` is set for
    streamed answers. ``token_ids`` are the generated token IDs.
    """

    instance: str
    status: int | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    usage: dict[str, Any] | None = None
    token_ids: list[int] | None = None
    text: str | None = None
    finish_reason: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    error: str | None = None
    # Token IDs per choice index (``n`` > 1, several prompts in one request); ``token_ids`` is
    # their concatenation in index order, which is what ``usage.completion_tokens`` counts.
    choices: list[list[int]] | None = None
    stream_problem: str = ""  # a streamed answer out of order or incomplete (rig.transport.client.stream)


@dataclass
class PDRecord:
    """Everything the rig saw of one P/D request.

    ``outcome``: ok | timeout | http_error | empty | cancelled | stalled | connection_error.
    ``decode_sent_at`` is monotonic seconds; ``verdict_after_s`` the time from sending to D
    until the rig decided (a stall diagnosis or the answer).
    """

    request_id: str
    prompt_len: int
    max_tokens: int
    prompt: list[int] = field(repr=False, default_factory=list)
    prefill: Hop | None = None
    decode: Hop | None = None
    outcome: str = "pending"
    diagnosis: str = ""
    decode_sent_at: float | None = None
    verdict_after_s: float | None = None
    stall: StallFacts | None = None  # the frozen state when the rig marked it ``stalled``

    @property
    def completion_tokens(self) -> int | None:
        """Completion tokens reported by D's ``usage`` (None without an answer)."""
        return (self.decode.usage or {}).get("completion_tokens") if self.decode else None

    @property
    def total_tokens(self) -> int | None:
        """Total tokens reported by D's ``usage`` (None without an answer)."""
        return (self.decode.usage or {}).get("total_tokens") if self.decode else None

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict (the prompt itself is left out; its length and seed identify it)."""
        d = asdict(self)
        d.pop("prompt")
        return d


def completion_body(model: str, prompt: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
    """The ``/v1/completions`` body every rig request uses (greedy, exact token counts)."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, **extra}


# Fields of a client's body that never reach the prefill hop: P answers once, not streamed, and
# its kv_transfer_params are the rig's (PREFILL_PARAMS), never the client's.
_NOT_TO_PREFILL = ("stream", "stream_options", "kv_transfer_params")


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill hop's body for any OpenAI ``/v1/completions`` or ``/v1/chat/completions``
    ``body``: the same prompt (or messages) and sampling parameters, ``max_tokens: 1`` (and
    ``max_completion_tokens: 1`` when given, chat's newer name), not streamed, with
    :data:`PREFILL_PARAMS` as ``kv_transfer_params``. A ``kv_transfer_params`` in ``body`` is
    dropped. (vLLM: tests/v1/kv_connector/nixl_integration/toy_proxy_server.py does the same.)
    """
    out = {k: v for k, v in body.items() if k not in _NOT_TO_PREFILL}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["kv_transfer_params"] = dict(PREFILL_PARAMS)
    return out


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any]) -> dict[str, Any]:
    """The decode hop's body: ``body`` unchanged (streamed or not) with P's
    ``kv_transfer_params``; whatever ``kv_transfer_params`` ``body`` carried is replaced."""
    return {**body, "kv_transfer_params": kv_transfer_params}


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


def fill_from_completion(hop: Hop, body: dict[str, Any]) -> None:
    """Copy usage, token IDs, text, finish reason and ``kv_transfer_params`` of a
    ``/v1/completions`` answer into ``hop``."""
    choices = sorted(body.get("choices") or [{}], key=lambda c: c.get("index", 0))
    choice = choices[0]
    hop.usage = body.get("usage")
    hop.token_ids = choice.get("token_ids")
    hop.text = choice.get("text")
    hop.finish_reason = choice.get("finish_reason")
    hop.kv_transfer_params = body.get("kv_transfer_params")
    if len(choices) > 1:
        hop.choices = [list(c.get("token_ids") or []) for c in choices]
        hop.token_ids = [t for ids in hop.choices for t in ids]
        hop.text = "".join(c.get("text") or "" for c in choices)


class PDClient:
    """Async client for P/D and direct requests against vLLM OpenAI servers.

    One ``httpx.AsyncClient`` is shared (connection pooling); ``timeout_s`` bounds each hop.
    """

    def __init__(self, model: str, timeout_s: float = 60.0, max_connections: int = 256):
        self.model = model
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.http.aclose()

    async def _post(self, hop: Hop, url: str, body: dict[str, Any]) -> Hop:
        t0 = time.monotonic()
        try:
            r = await self.http.post(f"{url}/v1/completions", json=body)
        except httpx.TimeoutException as e:
            hop.error = f"timeout: {type(e).__name__}"
            hop.latency_s = time.monotonic() - t0
            return hop
        except httpx.HTTPError as e:
            hop.error = f"connection error: {type(e).__name__}: {e}"
            hop.latency_s = time.monotonic() - t0
            return hop
        hop.latency_s = time.monotonic() - t0
        hop.status = r.status_code
        if r.status_code != 200:
            hop.error = error_text(r.status_code, r.text)
            return hop
        try:
            fill_from_completion(hop, r.json())
        except ValueError:
            hop.error = f"HTTP 200 with a body that is not JSON: {r.text[:200]!r}"
        return hop

    async def prefill(self, name: str, url: str, prompt: list[int], max_tokens: int,
                      fields: dict[str, Any] | None = None) -> Hop:
        """The prefill hop: ``max_tokens: 1`` plus ``do_remote_decode`` (see module docstring).

        ``max_tokens`` is the decode's cap; it is not sent to P but kept for symmetry of calls.
        ``fields``: extra completions fields passed through unchanged (rig.config.request_fields).
        """
        body = prefill_body(completion_body(self.model, prompt, 1, **(fields or {})))
        return await self._post(Hop(instance=name), url, body)

    async def decode(self, name: str, url: str, prompt: list[int], max_tokens: int,
                     kv_transfer_params: dict[str, Any], fields: dict[str, Any] | None = None) -> Hop:
        """The decode hop: same prompt, P's ``kv_transfer_params``; streamed (SSE) when ``fields``
        has ``stream: true`` (:meth:`stream`)."""
        if (fields or {}).get("stream"):
            return await self.stream(name, url, prompt, max_tokens, kv_transfer_params, fields)
        body = decode_body(completion_body(self.model, prompt, max_tokens, **(fields or {})), kv_transfer_params)
        return await self._post(Hop(instance=name), url, body)

    async def direct(self, name: str, url: str, prompt: list[int], max_tokens: int,
                     fields: dict[str, Any] | None = None) -> Hop:
        """A non-disaggregated request (no ``kv_transfer_params``): the parity reference."""
        if (fields or {}).get("stream"):
            return await self.stream(name, url, prompt, max_tokens, None, fields)
        return await self._post(Hop(instance=name), url, completion_body(self.model, prompt, max_tokens,
                                                                         **(fields or {})))

    async def stream(self, name: str, url: str, prompt: list[int], max_tokens: int,
                     kv_transfer_params: dict[str, Any] | None = None,
                     fields: dict[str, Any] | None = None) -> Hop:
        """A streamed request (SSE); fills ``ttft_s``, the delta ``token_ids`` per choice index
        (``Hop.choices`` when there are several) and ``Hop.stream_problem`` when the stream is
        not complete and in order (a choice without a ``finish_reason``, a chunk after its
        choice finished, no ``[DONE]``).

        Cancelling the awaiting task closes the connection, which makes vLLM abort the request.
        """
        hop = Hop(instance=name)
        extra: dict[str, Any] = {"stream_options": {"include_usage": True}, **(fields or {}), "stream": True}
        if kv_transfer_params is not None:
            extra["kv_transfer_params"] = kv_transfer_params
        body = completion_body(self.model, prompt, max_tokens, **extra)
        t0 = time.monotonic()
        per_choice: dict[int, list[int]] = {}
        finished: dict[int, str] = {}
        problems: list[str] = []
        done = False
        text: list[str] = []
        try:
            async with self.http.stream("POST", f"{url}/v1/completions", json=body) as r:
                hop.status = r.status_code
                if r.status_code != 200:
                    await r.aread()
                    hop.error = error_text(r.status_code, r.text)
                    return hop
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                        continue
                    if not line.startswith("data: "):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        hop.usage = chunk["usage"]
                    for choice in chunk.get("choices") or []:
                        i = choice.get("index", 0)
                        ids = choice.get("token_ids") or []
                        if (ids or choice.get("text")) and hop.ttft_s is None:
                            hop.ttft_s = time.monotonic() - t0
                        if i in finished and (ids or choice.get("text")):
                            problems.append(f"choice {i} got tokens after finish_reason {finished[i]!r}")
                        per_choice.setdefault(i, []).extend(ids)
                        text.append(choice.get("text") or "")
                        if choice.get("finish_reason"):
                            finished[i] = choice["finish_reason"]
                            hop.finish_reason = choice["finish_reason"]
        except httpx.TimeoutException as e:
            hop.error = f"timeout: {type(e).__name__}"
        except httpx.HTTPError as e:
            hop.error = f"connection error: {type(e).__name__}: {e}"
        hop.latency_s = time.monotonic() - t0
        order = sorted(per_choice)
        hop.token_ids, hop.text = [t for i in order for t in per_choice[i]], "".join(text)
        if len(order) > 1:
            hop.choices = [per_choice[i] for i in order]
        if hop.error is None:
            unfinished = [i for i in order if i not in finished]
            if unfinished:
                problems.append(f"choice(s) {unfinished} ended without a finish_reason")
            if not done:
                problems.append("no [DONE] at the end of the stream")
            hop.stream_problem = "; ".join(problems)
        return hop


def classify(hop: Hop | None) -> str:
    """The outcome class of a finished hop: ok | timeout | http_error | connection_error | empty."""
    if hop is None:
        return "cancelled"
    if hop.error:
        if hop.error.startswith("timeout"):
            return "timeout"
        return "http_error" if hop.status is not None else "connection_error"
    if not hop.token_ids:
        return "empty"
    return "ok"


def prefill_failure(hop: Hop) -> tuple[str, str] | None:
    """``(outcome, diagnosis)`` when a prefill hop cannot lead to a decode hop, else None: an
    error class from :func:`classify`, or an answer without ``kv_transfer_params`` (P is not a
    KV producer)."""
    outcome = classify(hop)
    if outcome == "ok" and hop.kv_transfer_params:
        return None
    if outcome == "ok":
        return "http_error", "prefill answered without kv_transfer_params (is P a kv_producer?)"
    return outcome, f"prefill: {hop.error or 'empty answer'}"


async def cancel_task(task: asyncio.Task) -> None:
    """Cancel ``task`` and wait for it to finish (closing its HTTP connection)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
