"""Where an expectation is shown (summary.md, the terminal table) the XFAIL/XPASS legend and the
known issue's title and upstream reference are shown too."""

from __future__ import annotations

from rich.console import Console

from rig.config import load_config
from rig.judge.verdict import ScenarioVerdict
from rig.report.build import RunResult, build_report, print_summary
from rig.report.render import render_summary_md
from tests.helpers.fake_rig import ROOT

XF = "xfail: spec-admission-livelock (stall) on vLLM >=0.32.0,<0.33"


def run(verdicts: list[ScenarioVerdict]) -> RunResult:
    cfg = load_config(ROOT / "configs" / "cpu-tiny.yaml")
    return RunResult(name="cpu-tiny", run_dir="/tmp/x", config=cfg.model_dump(mode="json"), verdicts=verdicts)


def test_summary_md_explains_xfail_and_names_the_issue():
    md = render_summary_md(build_report(run([ScenarioVerdict("edge-126", "XFAIL", XF, "stalled"),
                                ScenarioVerdict("edge-96-pair", "PASS", "pass", "all checks hold")])))
    assert "XFAIL expected failure: a known issue showed its named symptom" in md
    assert "XPASS a known issue did not reproduce" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("- spec-admission-livelock: "))
    assert "flat spec-decode block reservation blocks admission" in line
    assert "upstream: vllm/v1/core/sched/scheduler.py _spec_decode_step_blocks" in line
    assert line.endswith("expected on edge-126")  # only the scenarios of this run


def test_terminal_shows_the_same_lines():
    console = Console(record=True, width=400)
    print_summary(run([ScenarioVerdict("edge-127", "XPASS", XF, "known issue fixed")]), console)
    text = console.export_text()
    assert "Known issues:" in text and "spec-admission-livelock: flat spec-decode" in text
    assert "expected on edge-127" in text


def test_no_legend_without_a_known_issue():
    md = render_summary_md(build_report(run([ScenarioVerdict("edge-96-pair", "PASS", "pass", "all checks hold")])))
    assert "Known issues" not in md and "XFAIL expected failure" not in md


def test_terminal_title_is_one_line_cut_to_the_terminal_width():
    """A narrow terminal and a long config name: the title stays on one line (rich used to wrap it
    to the table's width, over three lines above an empty table)."""
    r = run([ScenarioVerdict("edge-127", "XPASS", XF, "known issue fixed")])
    r.name = "cpu-regressions-mooncake-with-a-long-name"
    console = Console(record=True, width=30)
    print_summary(r, console)
    lines = console.export_text().splitlines()
    assert lines[0].startswith("pdrig cpu-regressions") and len(lines[0]) <= 30
    assert not any("FAILED" in ln or "RUNNING" in ln for ln in lines[1:3])  # the rest of the title is cut, not wrapped
