"""The bodies of the two P/D hops, for ``/v1/completions``, ``/v1/chat/completions`` and the
token-in generate endpoint ``/inference/v1/generate``.

1. Prefill hop: the request's body with ``max_tokens: 1`` (and ``max_completion_tokens: 1``,
   chat's newer name, when given), not streamed, and ``kv_transfer_params =
   {do_remote_decode: true, do_remote_prefill: false, remote_*: null}``. P computes the prompt's
   KV, keeps its blocks for decode and answers with ``kv_transfer_params``
   (``do_remote_prefill: true``, ``remote_block_ids``, ``remote_engine_id``,
   ``remote_host``/``remote_port`` of its NIXL side channel, ...).
2. Decode hop: the same body, streamed or not, with P's ``kv_transfer_params``; D pulls the KV
   blocks over NIXL and generates.

(vLLM: tests/v1/kv_connector/nixl_integration/toy_proxy_server.py; the NixlConnector's
``request_finished`` builds P's answer.) On the generate endpoint (:func:`generate_body`) the
sampling parameters are a nested ``sampling_params`` object, so ``max_tokens: 1`` goes there; the
``kv_transfer_params`` stay top-level, in the request and in the answer (vLLM 0.32.0
entrypoints/scale_out/token_in_token_out/protocol.py ``GenerateRequest`` /
``GenerateResponseBase``; served with ``--enable-scale-out`` or ``--tokens-only``). The rig's own
requests are greedy with exact token counts (:func:`request_body`); ``pdrig proxy`` applies
:func:`prefill_body` and :func:`decode_body` to any client's body.
"""

from __future__ import annotations

from typing import Any, Literal

PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}

ApiEndpoint = Literal["completions", "chat", "generate"]
API_ENDPOINTS: tuple[ApiEndpoint, ...] = ("completions", "chat", "generate")
ROUTE: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions",
                         "generate": "/inference/v1/generate"}

# A prompt: one token-ID list, or several in one completions request (vLLM answers one choice
# per prompt and ``n``; choice index = prompt index * n + sample index), or text (retrieval).
Prompt = str | list[int] | list[list[int]]


def completion_body(model: str, prompt: Prompt, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """The ``/v1/completions`` body every rig request uses: greedy (``temperature: 0``), exact
    token counts (``ignore_eos``) and the token IDs in the answer (``return_token_ids``)."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, **extra}


def chat_text(prompt: list[int]) -> str:
    """The user message a chat request carries for a token-ID ``prompt``: chat messages are text,
    so the IDs are written as decimal words (``"17 4 230"``). Its length in tokens is then the
    tokenizer's, not ``len(prompt)``; parity compares with a reference given the same message."""
    return " ".join(str(t) for t in prompt)


def chat_body(model: str, prompt: str | list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
    """The ``/v1/chat/completions`` body of the rig's request: one user message (text as it is,
    token IDs as :func:`chat_text`), greedy, ``ignore_eos``, ``return_token_ids`` (vLLM's
    ChatCompletionRequest extensions, vllm/entrypoints/openai/chat_completion/protocol.py)."""
    content = prompt if isinstance(prompt, str) else chat_text(prompt)
    return {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "return_token_ids": True, **extra}


def generate_body(model: str, prompt: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
    """The ``/inference/v1/generate`` body of the rig's request (vLLM 0.32.0 ``GenerateRequest``):
    ``token_ids`` in, and greedy exact-count ``sampling_params`` (``temperature: 0``,
    ``ignore_eos``, ``max_tokens``) merged with ``extra["sampling_params"]``; the other ``extra``
    fields (e.g. ``cache_salt``, ``stream``) go top-level. The answer carries the generated
    ``token_ids`` per choice in its default ``output_mode: tokens``."""
    sampling = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                **(extra.pop("sampling_params", None) or {})}
    return {"model": model, "token_ids": prompt, "sampling_params": sampling, **extra}


def request_body(endpoint: str, model: str, prompt: Prompt, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """:func:`completion_body`, :func:`chat_body` or :func:`generate_body` by ``endpoint`` (see
    :data:`API_ENDPOINTS`). Raises ValueError for another endpoint, for several prompts on chat
    (one conversation per request) or generate (one ``token_ids`` list), or for text on generate."""
    if endpoint == "completions":
        return completion_body(model, prompt, max_tokens, **extra)
    if endpoint not in API_ENDPOINTS:
        raise ValueError(f"endpoint {endpoint!r} is unknown; use one of {list(API_ENDPOINTS)}")
    if not isinstance(prompt, str) and prompt and isinstance(prompt[0], list):
        one = "one conversation" if endpoint == "chat" else "one token-ID list"
        raise ValueError(f"the {endpoint} endpoint takes {one} per request, not several prompts")
    if endpoint == "generate":
        if isinstance(prompt, str):
            raise ValueError("the generate endpoint takes token IDs, not text")
        return generate_body(model, prompt, max_tokens, **extra)  # type: ignore[arg-type]
    return chat_body(model, prompt, max_tokens, **extra)  # type: ignore[arg-type]


# Fields of a client's body that never reach the prefill hop: P answers once, not streamed, and
# its kv_transfer_params are the rig's (PREFILL_PARAMS), never the client's.
_NOT_TO_PREFILL = ("stream", "stream_options", "kv_transfer_params")


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill hop's body for any OpenAI ``/v1/completions`` or ``/v1/chat/completions``
    ``body``: the same prompt (or messages) and sampling parameters, ``max_tokens: 1`` (and
    ``max_completion_tokens: 1`` when given, chat's newer name; ``sampling_params.max_tokens: 1``
    for a generate body, :func:`generate_body`), not streamed, with
    :data:`PREFILL_PARAMS` as ``kv_transfer_params``. A ``kv_transfer_params`` in ``body`` is
    dropped. (vLLM: tests/v1/kv_connector/nixl_integration/toy_proxy_server.py does the same.)
    """
    out = {k: v for k, v in body.items() if k not in _NOT_TO_PREFILL}
    if isinstance(out.get("sampling_params"), dict):  # the generate endpoint (generate_body)
        out["sampling_params"] = {**out["sampling_params"], "max_tokens": 1}
    else:
        out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["kv_transfer_params"] = dict(PREFILL_PARAMS)
    return out


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any]) -> dict[str, Any]:
    """The decode hop's body: ``body`` unchanged (streamed or not) with P's
    ``kv_transfer_params``; whatever ``kv_transfer_params`` ``body`` carried is replaced."""
    return {**body, "kv_transfer_params": kv_transfer_params}
