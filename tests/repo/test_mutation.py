"""`make mutation` (scripts/mutation.py): its reading of mutmut's results, and a small slice run
for real: every mutant of rig/judge/counter_rules.py against the tests that cover it, failing on
a survivor that tests/data/mutation_baseline.yaml does not list as equivalent."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers.fake_rig import ROOT

spec = importlib.util.spec_from_file_location("mutation", ROOT / "scripts" / "mutation.py")
assert spec is not None and spec.loader is not None
mutation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutation)

DIFF = """--- rig/judge/counter_rules.py
+++ rig/judge/counter_rules.py
@@ -10,7 +10,7 @@
     if lives > 1:
-        if rule.min is not None and rise >= rule.min and rule.max is None:
+        if rule.min is not None and rise > rule.min and rule.max is None:
             return True, f"{said} over {lives} process lives (a lower bound)"
"""


def test_names_and_changed_lines():
    assert mutation.module_of("rig.judge.checks.x_idle_check__mutmut_3") == "rig.judge.checks"
    assert mutation.function_of("rig.judge.checks.x_idle_check__mutmut_3") == "rig.judge.checks.idle_check"
    method = "rig.observe.stall.xǁStallWatcherǁfeed__mutmut_2"
    assert mutation.function_of(method) == "rig.observe.stall.StallWatcher.feed"
    assert mutation.changed_lines(DIFF) == (
        "if rule.min is not None and rise >= rule.min and rule.max is None:",
        "if rule.min is not None and rise > rule.min and rule.max is None:")


def test_modules_are_named_or_refused():
    assert mutation.selected(["judge.verdict", "rig/observe/stall.py"]) == ["rig/judge/verdict.py",
                                                                           "rig/observe/stall.py"]
    every = mutation.selected([])
    assert "rig/judge/checks.py" in every and "rig/observe/drain.py" in every
    assert not any(p.endswith("__init__.py") for p in every)
    with pytest.raises(SystemExit, match="MODULES: no module 'judge.nope'"):
        mutation.selected(["judge.nope"])


def test_baseline_entries_need_a_reason(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text("- {function: f, removed: a, added: b, reason: ''}\n")
    with pytest.raises(SystemExit, match="entry f has no reason"):
        mutation.load_baseline(p)
    assert mutation.load_baseline(tmp_path / "absent.yaml") == []
    for e in mutation.load_baseline(mutation.BASELINE):
        assert e["function"].startswith(("rig.judge.", "rig.observe.")) and e["reason"].strip()


SLICE_TESTS = ["tests/judge/test_counter_rules.py"]


@pytest.mark.skipif(importlib.util.find_spec("mutmut") is None, reason="mutmut not installed (make setup)")
def test_counter_rules_has_no_survivor_outside_the_baseline(tmp_path):
    """The CI slice of `make mutation`: one module, its test file, in a copy of the tree (so
    it never touches a `make mutation` run's mutants/)."""
    for d in ("rig", "tests", "configs", "scripts"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    text = (ROOT / "pyproject.toml").read_text()
    block = ('[tool.mutmut]\nsource_paths = ["rig"]\nonly_mutate = ["rig/judge/counter_rules.py"]\n'
             'also_copy = ["configs", "tests"]\npytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]\n'
             "timeout_constant = 10.0\n"
             f"pytest_add_cli_args_test_selection = {SLICE_TESTS!r}\n".replace("'", '"'))
    text = re.sub(r"\[tool\.mutmut\].*?\n\]\n", block, text, flags=re.S)
    assert block in text
    (tmp_path / "pyproject.toml").write_text(text)
    p = subprocess.run([sys.executable, str(tmp_path / "scripts" / "mutation.py"), "--modules", "judge.counter_rules",
                        "--baseline", str(mutation.BASELINE), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    print(p.stdout)  # the table (pytest -s shows it)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "| rig/judge/counter_rules.py | " in p.stdout
    assert "0 new" in p.stdout
