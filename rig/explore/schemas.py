"""vLLM's own request models as JSON schemas, taken from the interpreter that serves.

The explorer draws request fields from the schema of ``CompletionRequest`` and
``ChatCompletionRequest`` (vllm/entrypoints/openai/completion/protocol.py and
chat_completion/protocol.py, 0.32.0) as the build under test defines them, not from a
hand-picked list: the rig's core never imports vLLM, so a subprocess of ``launch.command``'s
interpreter dumps ``model_json_schema()`` once and the result is cached under ``cache_dir``
(keyed by the interpreter path and its vLLM version). A build whose interpreter cannot import
those models yields ``{}``: the explorer then says so and draws no extra fields.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

_DUMP = r"""
import json, sys
out = {}
try:
    import vllm
    out["version"] = getattr(vllm, "__version__", "")
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"})); sys.exit(0)
for name, mod, cls in (("completions", "vllm.entrypoints.openai.completion.protocol", "CompletionRequest"),
                       ("chat", "vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest")):
    try:
        m = __import__(mod, fromlist=[cls])
        out[name] = getattr(m, cls).model_json_schema()
    except Exception as e:
        out.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def request_schemas(python: str, cache_dir: str | Path, timeout_s: float = 600) -> dict[str, dict[str, Any]]:
    """``{endpoint: json_schema}`` for ``completions`` and ``chat`` as the vLLM under ``python``
    (an interpreter path, ``launch.command[0]`` with ``{python}`` resolved) defines them; ``{}``
    when that interpreter has no vLLM or the models moved. Cached as JSON under
    ``<cache_dir>/request-schemas/``. Raises nothing for a missing vLLM; ``OSError`` only when
    the interpreter cannot be executed at all."""
    key = hashlib.blake2b(str(Path(python).resolve()).encode(), digest_size=8).hexdigest()
    cache = Path(cache_dir) / "request-schemas" / f"{key}.json"
    if cache.is_file():
        data = json.loads(cache.read_text())
    else:
        try:
            out = subprocess.run([python, "-c", _DUMP], capture_output=True, text=True, timeout=timeout_s,
                                 check=False)
            lines = out.stdout.strip().splitlines()
            data = json.loads(lines[-1]) if lines else {"error": out.stderr[-500:]}
        except (subprocess.TimeoutExpired, ValueError) as e:
            data = {"error": f"{type(e).__name__}: {e}"}
        if "error" not in data:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(data))
    return {k: v for k, v in data.items() if k in ("completions", "chat") and isinstance(v, dict)}


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
