"""vLLM's own request models as JSON schemas, taken from the interpreter that serves.

The explorer draws request fields from the schema of ``CompletionRequest`` and
``ChatCompletionRequest`` (vllm/entrypoints/openai/completion/protocol.py and
chat_completion/protocol.py, 0.32.0) as the build under test defines them, not from a
hand-picked list: the rig's core never imports vLLM, so the rig's one schema reader
(rig/cluster/request_schemas.py) asks a subprocess of ``launch.command``'s interpreter, cached per
vLLM version. A build whose interpreter cannot answer yields ``{}``: the explorer then says so and
draws no extra fields. :func:`field_types` turns a schema into what the generator draws from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rig.cluster.request_schemas import request_schemas as cluster_request_schemas


def request_schemas(python: str, cache_dir: str | Path) -> dict[str, dict[str, Any]]:
    """``{endpoint: json_schema}`` for ``completions`` and ``chat`` as the vLLM under ``python``
    (``launch.command``'s interpreter) defines them, read by the rig's one schema reader
    (:func:`rig.cluster.request_schemas.request_schemas`, cached per vLLM version); ``{}`` when that
    interpreter cannot answer (no vLLM, the models moved): the explorer then draws no extra fields."""
    try:
        schemas = cluster_request_schemas(python, Path(cache_dir))
    except RuntimeError:
        return {}
    return {k: v for k, v in schemas.items() if k in ("completions", "chat") and isinstance(v, dict)}


def field_types(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{field: {"type": t, "minimum": .., "maximum": .., "enum": [..], "items": t}}`` of a
    pydantic JSON schema's top-level properties; ``anyOf`` with null is unwrapped to its non-null
    branch (the first one); fields whose type is an object or a ``$ref`` are left out (the
    explorer draws scalars and lists of scalars only)."""
    out: dict[str, dict[str, Any]] = {}
    for name, prop in (schema.get("properties") or {}).items():
        branches = prop.get("anyOf") or [prop]
        branch = next((b for b in branches if b.get("type") not in (None, "null", "object")), None)
        if branch is None:
            continue
        t: dict[str, Any] = {"type": branch["type"]}
        for k in ("minimum", "maximum", "enum", "maxItems"):
            if k in branch:
                t[k] = branch[k]
        if branch["type"] == "array":
            item = branch.get("items") or {}
            if item.get("type") not in ("integer", "string", "number", "boolean"):
                continue
            t["items"] = item["type"]
        out[name] = t
    return out
