"""The overlay compatibility check (rig/cluster/compat.py) on fake vLLM trees and a fake op list:
a planted op the binaries lack refuses the build in one line naming it. No vLLM is imported."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rig.cluster import compat
from rig.cluster.compat import Refs, extension_modules, missing_ops, refuse_missing_ops, scan
from rig.errors import BuildError

CPU_ATTN = """
import torch
def forward(x):
    torch.ops._C.cpu_attention(x)
    if hasattr(torch.ops._C, "optional_cpu_thing"):
        torch.ops._C.optional_cpu_thing(x)
    return torch.ops._C_cache_ops.reshape_and_cache(x)
"""
CUSTOM_OPS = """
import torch
def gpu_only(x):
    return torch.ops._C.cutlass_scaled_mm(x)          # a GPU op: not CPU code, not checked
def fp8_cpu(x):
    return torch.ops._C.fp8_scaled_mm_cpu(x)          # a CPU op by its name
"""
FS_IO = """
try:
    from vllm.fs_io_C import (  # pyright: ignore[reportMissingImports]
        batch_load_block,
        batch_store_block as store,
    )
except ImportError:
    pass
"""


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


BASE_FILES = {"vllm/v1/attention/backends/cpu_attn.py": CPU_ATTN, "vllm/_custom_ops.py": CUSTOM_OPS,
              "vllm/v1/kv_offload/fs/io.py": FS_IO}
REGISTERED = {"_C.cpu_attention", "_C_cache_ops.reshape_and_cache", "_C.fp8_scaled_mm_cpu"}
MODULES = {"vllm.fs_io_C": ["batch_load_block", "batch_store_block"]}


def test_scan_reads_the_cpu_codes_ops_and_extension_imports(tmp_path):
    refs = scan(_tree(tmp_path, BASE_FILES), {"vllm.fs_io_C"})
    assert sorted(refs.ops) == ["_C.cpu_attention", "_C.fp8_scaled_mm_cpu", "_C_cache_ops.reshape_and_cache"]
    assert refs.ops["_C.cpu_attention"] == "vllm/v1/attention/backends/cpu_attn.py"
    assert sorted(refs.imports) == ["vllm.fs_io_C:batch_load_block", "vllm.fs_io_C:batch_store_block"]


def test_a_base_release_checked_against_itself_misses_nothing(tmp_path):
    site = _tree(tmp_path, BASE_FILES)
    refs = scan(site, {"vllm.fs_io_C"})
    assert missing_ops(refs, refs, REGISTERED, MODULES) == []


def test_a_planted_op_the_binaries_lack_is_named_with_its_file(tmp_path):
    base = scan(_tree(tmp_path / "base", BASE_FILES), {"vllm.fs_io_C"})
    newer = dict(BASE_FILES)
    newer["vllm/v1/attention/backends/cpu_attn.py"] = CPU_ATTN + "\ntorch.ops._C.cpu_attention_v2(x)\n"
    newer["vllm/v1/kv_offload/fs/io.py"] = FS_IO.replace("batch_load_block,", "batch_load_block, batch_lookup,")
    overlay = scan(_tree(tmp_path / "new", newer), {"vllm.fs_io_C"})
    assert missing_ops(overlay, base, REGISTERED, MODULES) == [
        "_C.cpu_attention_v2 (vllm/v1/attention/backends/cpu_attn.py)",
        "vllm.fs_io_C:batch_lookup (vllm/v1/kv_offload/fs/io.py)"]
    # what the base release itself references and lives without is not the overlay's to answer for
    assert missing_ops(overlay, overlay, REGISTERED, MODULES) == []
    # a registered op is never missing
    assert missing_ops(overlay, base, REGISTERED | {"_C.cpu_attention_v2"}, {"vllm.fs_io_C": ["batch_lookup"]
                       + MODULES["vllm.fs_io_C"]}) == []


def test_extension_modules_are_the_named_ones_not_the_op_libraries(tmp_path):
    for rel in ("vllm/_C.abi3.so", "vllm/_C_AVX2.abi3.so", "vllm/fs_io_C.abi3.so", "vllm/spinloop.abi3.so",
                "vllm/third_party/x/helper.abi3.so"):
        _tree(tmp_path, {rel: ""})
    assert extension_modules(tmp_path) == {"vllm.fs_io_C", "vllm.spinloop", "vllm.third_party.x.helper"}


def test_refusal_is_one_line_naming_the_missing_ops(tmp_path, monkeypatch):
    base = _tree(tmp_path / "base", BASE_FILES)
    newer = dict(BASE_FILES)
    newer["vllm/platforms/cpu.py"] = "import torch\ntorch.ops._C.new_kernel()\n"
    site = _tree(tmp_path / "new", newer)
    monkeypatch.setattr(compat, "probe", lambda python, mods: {"ops": sorted(REGISTERED), "modules": MODULES,
                                                               "errors": []})
    with pytest.raises(BuildError) as e:
        refuse_missing_ops("0.33.0", "0.32.0", Path("/py"), site, base)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("build 0.33.0 refused: its Python calls 1 op(s) that 0.32.0's binaries lack: "
                          "_C.new_kernel (vllm/platforms/cpu.py)")
    # the same tree on binaries that have it passes
    monkeypatch.setattr(compat, "probe", lambda python, mods: {"ops": sorted(REGISTERED | {"_C.new_kernel"}),
                                                               "modules": MODULES, "errors": []})
    refuse_missing_ops("0.33.0", "0.32.0", Path("/py"), site, base)


def test_kernels_that_fail_to_load_refuse_the_build(tmp_path, monkeypatch):
    site = _tree(tmp_path, BASE_FILES)
    monkeypatch.setattr(compat, "probe", lambda python, mods: {
        "ops": [], "modules": {}, "errors": ["import_kernels: ImportError('libfoo.so')"]})
    with pytest.raises(BuildError, match=r"build x refused: on b's compiled ops its vLLM does not load: import_"):
        refuse_missing_ops("x", "b", Path("/py"), site, site)


def test_the_probe_reads_what_an_interpreter_registers(tmp_path):
    """The probe as a subprocess of a fake 'python' that prints a probe line: parsed, and a
    failing interpreter is a BuildError with its last line."""
    good = tmp_path / "good"
    line = 'PDRIG-PROBE {"ops": ["_C.a"], "modules": {}, "errors": []}'
    good.write_text(f"#!/bin/sh\necho noise\necho '{line}'\n")
    bad = tmp_path / "bad"
    bad.write_text("#!/bin/sh\necho 'ModuleNotFoundError: torch' >&2\nexit 1\n")
    for p in (good, bad):
        p.chmod(0o755)
    assert compat.probe(good, set())["ops"] == ["_C.a"]
    with pytest.raises(BuildError, match="the op probe failed: ModuleNotFoundError: torch"):
        compat.probe(bad, set())


def test_refs_default_to_nothing():
    assert Refs().ops == {} and Refs().imports == {}


def _fake_python(tmp: Path, body: str) -> Path:
    py = tmp / "python"
    py.write_text(f"#!/bin/sh\n{body}\n")
    py.chmod(0o755)
    return py


def test_one_completion_from_a_server_that_answers(tmp_path):
    """The smoke server is the rig's fake vLLM (tests/fake_vllm.py) behind a fake interpreter that
    drops ``-m vllm.entrypoints.openai.api_server``: started, asked once, stopped."""
    fake = Path(__file__).resolve().parents[1] / "fake_vllm.py"
    py = _fake_python(tmp_path, f'shift 2\nexec {sys.executable} {fake} "$@"')
    text = compat.smoke_completion(py, tmp_path, tmp_path / "smoke.log", timeout_s=60)
    assert isinstance(text, str) and text


def test_a_server_that_dies_refuses_with_its_log(tmp_path):
    py = _fake_python(tmp_path, "echo 'ImportError: cannot import name X'\nexit 3")
    with pytest.raises(BuildError, match=r"the smoke server exited 3 before answering \(see .*smoke.log\)"):
        compat.smoke_completion(py, tmp_path, tmp_path / "smoke.log", timeout_s=60)
    assert "cannot import name X" in (tmp_path / "smoke.log").read_text()
