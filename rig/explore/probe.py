"""What the explorer asks the live prefill instance once per deployment, before drawing actions.

:func:`chat_overhead`: the tokens P's chat template adds around one user message, from vLLM's
``POST /tokenize`` (vllm/entrypoints/serve/tokenize/protocol.py ``TokenizeChatRequest``: a
``messages`` body answers ``{"count": N, "tokens": [...], "max_model_len": M}``). The template's
tokens are what push a chat prompt past ``max_model_len`` (rig.explore.refusals bounds chat
lengths with it). A server without the route, or one that does not answer, gives ``default``.
"""

from __future__ import annotations

import httpx

from rig.explore.grammar import DEFAULT_CHAT_OVERHEAD

PROBE_CONTENT = "1"  # one byte, one token in a byte-level vocabulary
MARGIN = 2  # tokens on top of the measured overhead (a tokenizer that merges across the message edge)


def chat_overhead(base_url: str, model: str, timeout_s: float = 10.0, default: int = DEFAULT_CHAT_OVERHEAD) -> int:
    """Tokens (>= 0) the chat template of the server at ``base_url`` adds to a one-message
    conversation (generation prompt included) plus :data:`MARGIN`; ``default`` when ``/tokenize``
    is missing, refuses or does not answer within ``timeout_s`` (s)."""
    body = {"model": model, "messages": [{"role": "user", "content": PROBE_CONTENT}], "add_generation_prompt": True}
    try:
        r = httpx.post(f"{base_url}/tokenize", json=body, timeout=timeout_s)
        count = r.json().get("count") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return default
    if not isinstance(count, int) or count < 1:
        return default
    return max(0, count - len(PROBE_CONTENT.encode())) + MARGIN
