"""The import-layers contract: rig/'s packages import only their own layer and the ones below.

The contract itself is import-linter's, in pyproject.toml (``[tool.importlinter]``: a ``layers``
contract in the order of the README's pipeline, ``acyclic_siblings``, and an ``independence`` contract
between the deployment backends of rig/cluster/backends/); ``make lint`` runs it with
``lint-imports`` and this file runs the same contract from ``make test``. Two planted violations (an
upward import, a cycle between siblings) in a copy of the tree show that it can fail. A third check
lists the imports of rig modules made inside functions: each is either a documented lazy import for
start-up speed (``LAZY``) or a known cycle dodge that the branch named is removing (``PENDING``).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.fake_rig import ROOT

LINT_IMPORTS = [sys.executable, "-c",
                "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with ``root``'s pyproject.toml over ``root``'s ``rig`` package (no cache)."""
    env = {**os.environ, "PYTHONPATH": str(root), "NO_COLOR": "1"}
    return subprocess.run([*LINT_IMPORTS, "--config", str(root / "pyproject.toml"), "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_layers_contract_holds():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Contracts: 4 kept, 0 broken." in r.stdout


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """A copy of pyproject.toml and rig/ (sources only) to plant violations in."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "rig", tmp_path / "rig", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_an_upward_import_breaks_the_contract(tree_copy: Path):
    config_help = tree_copy / "rig" / "config" / "help.py"
    config_help.write_text(config_help.read_text() + "\nfrom rig.report import render  # planted\n")
    r = lint_imports(tree_copy)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "rig.config is not allowed to import rig.report" in r.stdout
    assert "rig.config.help -> rig.report.render" in r.stdout


def test_a_cycle_inside_one_layer_breaks_the_contract(tree_copy: Path):
    report = tree_copy / "rig" / "report"
    (report / "planted_a.py").write_text("from rig.report import planted_b  # noqa\n")
    (report / "planted_b.py").write_text("from rig.report import planted_a  # noqa\n")
    r = lint_imports(tree_copy)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "No cycles are allowed in rig.report." in r.stdout
    assert "rig layers" in r.stdout and "KEPT" in r.stdout  # only the cycle contract broke


def test_a_backend_importing_another_breaks_the_contract(tree_copy: Path):
    """The deployment backends share only their base: a container backend that reused the local
    one's code would break the independence contract."""
    containers = tree_copy / "rig" / "cluster" / "backends" / "containers.py"
    containers.write_text(containers.read_text() + "\nfrom rig.cluster.backends import local  # planted\n")
    r = lint_imports(tree_copy)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "rig.cluster.backends.containers -> rig.cluster.backends.local" in r.stdout
    assert "rig layers" in r.stdout and "KEPT" in r.stdout  # only the independence contract broke


def test_a_renderer_that_imports_the_judge_breaks_the_contract(tree_copy: Path):
    """The renderers read the plain report model only (rig/report/model.py); rig/report/build.py
    is the one report module that may import the judge."""
    junit = tree_copy / "rig" / "report" / "junit.py"
    junit.write_text(junit.read_text() + "\nfrom rig.judge import verdict  # planted\n")
    r = lint_imports(tree_copy)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the report renderers cannot import the judge or the workload BROKEN" in r.stdout
    assert "rig.report.junit is not allowed to import rig.judge" in r.stdout


def test_a_new_top_level_package_must_be_given_a_layer(tree_copy: Path):
    (tree_copy / "rig" / "newthing").mkdir()
    (tree_copy / "rig" / "newthing" / "__init__.py").write_text("")
    r = lint_imports(tree_copy)
    assert r.returncode == 1 and "rig.newthing" in r.stdout, r.stdout + r.stderr


# --- imports inside functions -------------------------------------------------------------------------

_CLI = ("each `pdrig` subcommand imports its machinery when it runs, so `pdrig --help`, `plan`, "
        "`config`, `k8s` do not load aiohttp, prometheus_client or the runner")
_WAVE_CLI = ("rig.cli builds the `pdrig wave` parser on every call: the wave's machinery (aiohttp, metrics, "
             "the runner) is imported only when a wave runs")
_PLUGIN = ("the pytest plugin is loaded by every pytest session of an environment that has the rig installed "
           "(entry point pytest11): loading registers options and markers only, the rig is imported when a "
           "test asks for a fixture")

# (importing module, imported module) -> why it is imported inside a function.
LAZY: dict[tuple[str, str], str] = {
    ("rig.cli", "rig.cluster.signals"): _CLI + " (a refusal of a bad flag or file does not load httpx)",
    **{("rig.cli.args", m): _CLI for m in ("rig.cluster.builds", "rig.run.matrix")},
    **{("rig.cli.deploy", m): _CLI for m in (
        "rig.cluster.builds", "rig.cluster.mooncake", "rig.cluster.preflight", "rig.cluster.probes",
        "rig.cluster.processes", "rig.config.schema", "rig.connectors.mooncake", "rig.plan.processes",
        "rig.report.explore_model", "rig.report.model", "rig.transport.aio",
        "rig.cluster.ports", "rig.config.help", "rig.plan.compose", "rig.plan.k8s", "rig.proxy", "rig.run.runner",
        "rig.run.topology", "rig.transport.client", "rig.transport.endpoint", "rig.workload.baseline",
        "rig.workload.warmup")},
    **{("rig.cli.host", m): _CLI for m in ("rig.proxy", "rig.run.hostruns", "rig.transport.aio")},
    **{("rig.cli.run", m): _CLI for m in (
        "rig.cluster.logs", "rig.cluster.preflight", "rig.explore.explorer", "rig.explore.known", "rig.explore.grammar",
        "rig.explore.history",
        "rig.explore.topologies", "rig.run.docker_run", "rig.run.request_check", "rig.run.runner",
        "rig.run.topology", "rig.workload.prompts")},
    **{("rig.run.wave_cli", m): _WAVE_CLI for m in ("rig.config", "rig.run.wave_run", "rig.transport.endpoint")},
    **{("rig.pytest_plugin", m): _PLUGIN for m in (
        "rig.cluster.builds", "rig.cluster.mooncake", "rig.cluster.ports", "rig.cluster.preflight",
        "rig.cluster.processes", "rig.config",
        "rig.plan.processes",
        "rig.proxy", "rig.report.build", "rig.run.runner", "rig.transport.aio", "rig.transport.client",
        "rig.transport.endpoint", "rig.transport.records")},
}

# Imports inside functions that dodge a cycle or serve nothing; the branch named removes them.
PENDING: dict[tuple[str, str], str] = {
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_rig_modules(node: ast.Import | ast.ImportFrom, package: str, root: Path) -> list[str]:
    """The rig modules an import statement names (``from rig.plan import mooncake`` -> rig.plan.mooncake)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "rig"]
    base = node.module or ""
    if node.level:  # relative: resolve against the importing package
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
    if base.split(".")[0] != "rig":
        return []
    out = []
    for alias in node.names:
        sub = root / Path(*f"{base}.{alias.name}".split("."))
        out.append(f"{base}.{alias.name}" if sub.with_suffix(".py").is_file() or sub.is_dir() else base)
    return out


def function_level_imports(path: Path, root: Path = ROOT) -> set[tuple[str, str]]:
    """(this module, imported rig module) for every import of a rig module inside a function of ``path``
    (a file of the package tree under ``root``)."""
    importer = module_name(path, root)
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    found = set()
    for fn in ast.walk(ast.parse(path.read_text())):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found |= {(importer, m) for m in imported_rig_modules(node, package, root)}
    return found


def all_function_level_imports() -> set[tuple[str, str]]:
    return set().union(*(function_level_imports(p) for p in sorted((ROOT / "rig").rglob("*.py"))))


def test_imports_inside_functions_are_documented_lazy_imports():
    unexplained = sorted(all_function_level_imports() - set(LAZY) - set(PENDING))
    assert not unexplained, (
        "imports of rig modules inside functions: import at module level (a cycle is fixed by moving code to "
        f"its layer, not by hiding the import), or add to LAZY with the start-up reason: {unexplained}")


def test_the_lists_name_only_imports_that_exist():
    stale = sorted((set(LAZY) | set(PENDING)) - all_function_level_imports())
    assert not stale, f"no longer imported inside a function: remove from LAZY/PENDING: {stale}"


def test_the_finder_sees_a_function_level_import(tree_copy: Path):
    """The walk above can fail: it finds imports inside (nested) functions, absolute or relative, and
    leaves module-level ones alone."""
    probe = tree_copy / "rig" / "plan" / "probe.py"
    probe.write_text("import rig.judge.verdict\n\n\ndef f():\n    def g():\n        from ..config import load_config\n"
                     "    import rig.cluster.ports\n    from rig.observe.metrics import parse\n")
    assert function_level_imports(probe, tree_copy) == {
        ("rig.plan.probe", "rig.config"), ("rig.plan.probe", "rig.cluster.ports"),
        ("rig.plan.probe", "rig.observe.metrics")}
