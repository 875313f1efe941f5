"""The exploration's report files: explore.json (the dump of rig.report.explore_model.ExploreReport),
explore.md and explore-junit.xml (rendered from that dump read back, rig.report.explore_render), so
what the Markdown and the JUnit say is exactly what explore.json holds."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from rig.explore.settings import ExploreSettings
from rig.report.explore_model import ExploreReport, ExploreSettingsReport
from rig.report.explore_render import junit_suite, render_md
from rig.report.junit import render_junit


def settings_report(s: ExploreSettings) -> ExploreSettingsReport:
    """The report's record of what ``pdrig explore`` was asked for (field for field)."""
    return ExploreSettingsReport(**asdict(s))


def new_report(config: str, settings: ExploreSettings, run_dir: Path) -> ExploreReport:
    """The report of an exploration of config ``config`` into ``run_dir`` before its first action."""
    return ExploreReport(config=config, seed=settings.seed, run_dir=str(run_dir), settings=settings_report(settings))


def write_explore_report(r: ExploreReport, run_dir: Path) -> ExploreReport:
    """Write explore.json (``r`` with ``actions_per_min`` set from its actions and ``action_s``), then
    explore.md and explore-junit.xml from that file's text read back; returns the report read back.
    A value JSON cannot hold (in a mechanism's evidence) is written as its ``str``, a NaN as NaN, as
    explore.json always had them. Raises OSError when ``run_dir`` cannot be written."""
    r.actions_per_min = r.actions / r.action_s * 60 if r.action_s else 0.0
    text = r.model_dump_json(indent=1, fallback=str)
    (run_dir / "explore.json").write_text(text)
    back = ExploreReport.model_validate_json(text)
    (run_dir / "explore.md").write_text(render_md(back))
    (run_dir / "explore-junit.xml").write_text(render_junit(junit_suite(back)))
    return back
