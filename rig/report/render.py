"""Step 7 of the rig's flow: the report, written into the run directory.

``report.json`` (everything: config, plan, versions, timings, observations, verdicts),
``junit.xml`` (one testcase per scenario: XFAIL as skipped, FAIL/XPASS as failure, ERROR as
error, so CI systems show it natively; ``tests`` counts the scenarios, and each scenario's
checks are properties of its testcase, a "not checked" one with its reason) and ``summary.md``
(one row per scenario: expectation, verdict, tokens, latency per hop, time-to-verdict, parity,
check counts, diagnosis; then every check that failed or was not checked, with the requests it
failed on). The terminal shows the
same table with rich. :func:`write_report` is called on every exit path, also for a failed or
interrupted run, with whatever was observed so far.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rig.judge.verdict import ScenarioVerdict, run_passed
from rig.observe.observations import ScenarioObservation
from rig.observe.parity import summarize


@dataclass
class RunResult:
    """A whole run: its scenarios' observations and verdicts plus run-level facts.

    ``timings`` are seconds (``startup`` per phase, ``total``); ``status`` is
    ``passed`` | ``failed`` | ``interrupted`` | ``error``.
    """

    name: str
    run_dir: str
    config: dict[str, Any]
    plan: dict[str, Any] = field(default_factory=dict)
    vllm_version: str = ""
    observations: list[ScenarioObservation] = field(default_factory=list)
    verdicts: list[ScenarioVerdict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    status: str = "running"
    error: str = ""
    extra_sections: list[str] = field(default_factory=list)  # markdown appended to summary.md
    # Scenarios of the suite that never started because the run stopped first (Ctrl-C, a cluster
    # error): listed as NOT RUN so an interrupted run cannot read as "every scenario passed".
    not_run: list[str] = field(default_factory=list)
    # Per instance, its (latest) start: rig.cluster.startup.StartupWatch.figures() (seconds to
    # ready, seconds per start-up phase, CPU-s, host load at start and end, outcome).
    startup: dict[str, dict[str, Any]] = field(default_factory=dict)

    def finish_status(self) -> str:
        """Set and return ``status`` from the verdicts unless the run was interrupted/errored."""
        if self.status == "running":
            self.status = "passed" if run_passed(self.verdicts) else "failed"
        return self.status


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


# The bug-record reference a regression scenario's description starts with (configs/suites/
# regressions*.yaml): "R11 (vllm PRs #50297, #48245): ...", "bug record R14 (vllm #46240, ...): ...".
# The run's table carries it, so a reader goes from a verdict to the public report it replays.
_REFERENCE = re.compile(r"^\s*(?:bug record\s+)?(R\d{2}\b[^:()]*(?:\([^)]*\))?[^:()]*?)\s*:")


def reference_of(description: str | None) -> str:
    """The leading bug-record reference of a scenario ``description`` (see ``_REFERENCE``), '' if none."""
    m = _REFERENCE.match(" ".join((description or "").split()))
    return m.group(1).strip() if m else ""


def scenario_references(result: RunResult) -> dict[str, str]:
    """Scenario name -> its reference (:func:`reference_of`), from the run's config."""
    return {sc.get("name", ""): reference_of(sc.get("description")) for sc in result.config.get("scenarios", [])
            if isinstance(sc, dict)}


def _tokens(records: list[Any]) -> str:
    """'8/72' per answered request; a run of equal values is shown once with its count ('8/136 x138')."""
    vals = [f"{r.completion_tokens}/{r.total_tokens}" for r in records]
    if not vals:
        return "-"
    out: list[str] = []
    for v in dict.fromkeys(vals):
        n = vals.count(v)
        out.append(v if n == 1 else f"{v} x{n}")
    return ", ".join(out)


def scenario_rows(result: RunResult) -> list[dict[str, str]]:
    """The summary table's rows (one per scenario) as display strings. A ``reference`` column (the
    scenario's bug-record reference, :func:`reference_of`) follows ``scenario`` when any scenario of
    the run has one (the regression suite)."""
    rows = []
    obs_by = {o.scenario: o for o in result.observations}
    refs = scenario_references(result)
    with_refs = any(refs.get(v.scenario) for v in result.verdicts)
    for v in result.verdicts:
        o = obs_by.get(v.scenario)
        recs = o.records if o else []
        ok = [r for r in recs if r.outcome == "ok"]
        toks = _tokens(ok)
        p_lat = max((r.prefill.latency_s for r in recs if r.prefill and r.prefill.latency_s), default=None)
        d_lat = max((r.decode.latency_s for r in recs if r.decode and r.decode.latency_s), default=None)
        ttv = max((r.verdict_after_s for r in recs if r.verdict_after_s is not None), default=None)
        ps = summarize(o.parity) if o else {"compared": 0, "equal": 0}
        rows.append({
            "scenario": v.scenario,
            **({"reference": refs.get(v.scenario) or "-"} if with_refs else {}),
            "decode": o.decode if o else "-",
            "expectation": v.expectation,
            "verdict": v.verdict,
            "tokens (completion/total)": toks,
            "P ms": _ms(p_lat),
            "D ms": _ms(d_lat),
            "time to verdict s": "-" if ttv is None else f"{ttv:.1f}",
            "parity": f"{ps['equal']}/{ps['compared']} equal" if ps["compared"] else "-",
            "checks": check_counts(v),
            "diagnosis": v.reason,
        })
    return rows


def check_counts(v: ScenarioVerdict) -> str:
    """'6 ok, 1 failed, 1 not checked' over the scenario's checks (tri-state, rig.judge.checks)."""
    n: dict[str, int] = {}
    for c in v.checks:
        n[c.state] = n.get(c.state, 0) + 1
    return ", ".join(f"{n[k]} {k}" for k in ("ok", "failed", "not checked") if n.get(k)) or "-"


def checks_md(result: RunResult) -> list[str]:
    """summary.md lines: every check that failed or was not checked, per scenario, with why."""
    lines = []
    for v in result.verdicts:
        for c in v.checks:
            if c.ok is not True:
                on = f" (on {', '.join(c.requests)})" if c.requests else ""
                lines.append(f"| {v.scenario} | {c.name} | {c.state} | "
                             + f"{c.detail}{on}".replace("|", "\\|").replace("\n", " ") + " |")
    return (["", "### Checks not ok", "", "| scenario | check | state | detail |", "|---|---|---|---|", *lines]
            if lines else [])


VERDICT_LEGEND = (
    "PASS every check held; FAIL a check failed; XFAIL expected failure: a known issue showed its "
    "named symptom on a vLLM version it affects (the run still passes); XPASS a known issue did not "
    "reproduce where expected (the run fails: update the expectation); ERROR the rig could not judge "
    "the scenario (no answer, a server died, the run broke)")


def known_issue_lines(result: RunResult) -> list[str]:
    """The legend and, per known issue of the run's scenarios, ``id: title (affects; upstream)``
    with the scenarios expecting it; [] when no scenario of the run declares one. The table's
    ``expectation`` column shows only the id (config: ``ScenarioConfig.known_issue``)."""
    judged = {v.scenario for v in result.verdicts}
    scs = list(result.config.get("scenarios") or []) + [result.config.get("scenario") or {}]
    issues: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for sc in scs:
        ki = sc.get("known_issue") if isinstance(sc, dict) else None
        if ki and sc.get("name") in judged:
            issues.setdefault(ki["id"], (ki, []))[1].append(sc["name"])
    if not issues:
        return []
    lines = [f"Verdicts: {VERDICT_LEGEND}.", "Known issues:"]
    for kid, (ki, names) in issues.items():
        up = f"; upstream: {ki['upstream']}" if ki.get("upstream") else ""
        sym = ki["symptom"].get("kind", "?") if isinstance(ki["symptom"], dict) else ki["symptom"]
        lines.append(f"- {kid}: {ki['title']} (vLLM {ki['affects']}, symptom {sym}{up}); "
                     f"expected on {', '.join(names)}")
    return lines


def render_summary_md(result: RunResult) -> str:
    """summary.md: status line, timings, the scenario table, extra sections."""
    rows = scenario_rows(result)
    lines = [f"# pdrig run `{Path(result.run_dir).name}`: {result.status.upper()}", ""]
    lines.append(f"- config: `{result.name}`; vLLM {result.vllm_version or 'unknown'}")
    if result.timings:
        lines.append("- timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.timings.items()))
    if result.error:
        lines.append(f"- error: {result.error}")
    counts: dict[str, int] = {}
    for v in result.verdicts:
        counts[v.verdict] = counts.get(v.verdict, 0) + 1
    lines.append("- verdicts: " + (", ".join(f"{k} {n}" for k, n in sorted(counts.items())) or "none"))
    if result.not_run:
        lines.append(f"- NOT RUN ({len(result.not_run)}, the run stopped first): " + ", ".join(result.not_run))
    for n, f in result.startup.items():
        if f.get("outcome") not in ("ready", "starting"):
            lines.append(f"- did not start: {f.get('reason') or n + ': ' + str(f.get('outcome'))}")
    lines.append("")
    lines += startup_table_md(result.startup)
    if rows:
        cols = list(rows[0])
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "---|" * len(cols))
        for r in rows:
            lines.append("| " + " | ".join(str(r[c]).replace("|", "\\|").replace("\n", " ") for c in cols) + " |")
    lines += checks_md(result)
    legend = known_issue_lines(result)
    lines += ["", legend[0], "", *legend[1:]] if legend else []
    lines += ["", *result.extra_sections] if result.extra_sections else []
    return "\n".join(lines) + "\n"


def render_junit(result: RunResult) -> str:
    """junit.xml: one testcase per scenario (classname = the config name), so ``tests`` counts the
    scenarios: the judged ones and those the run never reached (``result.not_run``, an ``error``
    "NOT RUN": a stopped run must not look green to CI).

    A scenario's checks are in its testcase's ``<properties>`` (``check.<name>`` = ``ok`` /
    ``failed`` / ``not checked`` with the detail) and the text of its failure/error; a check that could not
    look is never a pass. A run that stopped before any scenario (a start-up failure) is the
    one synthetic testcase ``pdrig-run`` with the error; the run's status and error are also the
    suite's properties."""
    suite = ET.Element("testsuite", name=f"pdrig.{result.name}")
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="pdrig_run_status", value=result.status)
    if result.error:
        ET.SubElement(props, "property", name="pdrig_run_error", value=result.error[:1000])
    n_fail = n_err = n_skip = n_cases = 0
    obs_by = {o.scenario: o for o in result.observations}
    for v in result.verdicts:
        o = obs_by.get(v.scenario)
        n_cases += 1
        case = ET.SubElement(suite, "testcase", classname=f"pdrig.{result.name}", name=v.scenario,
                             time=f"{o.wall_s:.3f}" if o else "0")
        if v.checks:
            checks = ET.SubElement(case, "properties")
            for c in v.checks:
                said = c.detail if c.detail.startswith(c.state) else f"{c.state}: {c.detail}"  # "not checked" once
                ET.SubElement(checks, "property", name=f"check.{c.name}", value=said[:1000])
        detail = "\n".join(f"{c.name}: {c.state} - {c.detail}" for c in v.checks)
        if v.verdict == "XFAIL":
            n_skip += 1
            ET.SubElement(case, "skipped", message=f"xfail: {v.reason}"[:1000]).text = detail
        elif v.verdict in ("FAIL", "XPASS"):
            n_fail += 1
            ET.SubElement(case, "failure", message=f"{v.verdict}: {v.reason}"[:1000]).text = detail
        elif v.verdict == "ERROR":
            n_err += 1
            ET.SubElement(case, "error", message=v.reason[:1000]).text = "\n".join(filter(None, [v.reason, detail]))
        ref = scenario_references(result).get(v.scenario)
        ET.SubElement(case, "system-out").text = v.expectation + (f"\nreference: {ref}" if ref else "")
    for name in result.not_run:  # never started: an error with the reason, never a pass
        n_cases += 1
        n_err += 1
        case = ET.SubElement(suite, "testcase", classname=f"pdrig.{result.name}", name=name, time="0")
        why = f"NOT RUN: the run stopped first ({result.status}: {result.error})"
        ET.SubElement(case, "error", message=why[:1000])
    if n_cases == 0 and result.status in ("error", "interrupted"):
        # A run that ended before any scenario must not look green to CI just because none failed.
        n_err += 1
        n_cases += 1
        case = ET.SubElement(suite, "testcase", classname=f"pdrig.{result.name}", name="pdrig-run")
        ET.SubElement(case, "error", message=f"run {result.status}: {result.error}"[:1000]).text = result.error
    suite.set("tests", str(n_cases))
    suite.set("failures", str(n_fail))
    suite.set("errors", str(n_err))
    suite.set("skipped", str(n_skip))
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def startup_line(name: str, f: dict[str, Any]) -> str:
    """'prefill ready 212 s, CPU 96.3 s, load 8.1 -> 9.0' (or the outcome when it was not ready)."""
    state = f"ready {f['ready_s']:.0f} s" if f.get("ready_s") is not None else \
        f"{f.get('outcome', '?')} after {f.get('elapsed_s') or 0:.0f} s"
    cpu = f", CPU {f['cpu_s']:.1f} s" if f.get("cpu_s") is not None else ""
    end = f.get("load_at_end")
    return f"{name} {state}{cpu}, load {f.get('load_at_start', 0):.1f} -> " + ("?" if end is None else f"{end:.1f}")


def startup_table_md(startup: dict[str, dict[str, Any]]) -> list[str]:
    """summary.md's start-up table: per instance its outcome, seconds to ready, CPU-s, host load
    (1 min) at start and at the end of the start, and the seconds of each start-up phase; [] when
    nothing was started."""
    if not startup:
        return []
    out = ["## Start-up", "", "| instance | outcome | ready (s) | CPU (s) | load at start | load at end | phases (s) |",
           "|---|---|---|---|---|---|---|"]
    for n, f in startup.items():
        phases = ", ".join(f"{k} {v:.0f}" for k, v in (f.get("phases_s") or {}).items())
        ready = "-" if f.get("ready_s") is None else f"{f['ready_s']:.1f}"
        cpu = "-" if f.get("cpu_s") is None else f"{f['cpu_s']:.1f}"
        end = "-" if f.get("load_at_end") is None else f"{f['load_at_end']:.2f}"
        out.append(f"| {n} | {f.get('outcome', '')} | {ready} | {cpu} | {f.get('load_at_start', 0):.2f} | {end} | "
                   f"{phases} |")
    return [*out, ""]


def result_json(result: RunResult) -> dict[str, Any]:
    """The full report as a JSON-able dict."""
    return {
        "name": result.name, "run_dir": result.run_dir, "status": result.status,
        "error": result.error, "vllm_version": result.vllm_version, "timings": result.timings,
        "startup": result.startup, "not_run": result.not_run,
        "config": result.config, "plan": result.plan,
        "scenarios": [{"verdict": v.to_json(),
                       "observation": next((o.to_json() for o in result.observations
                                            if o.scenario == v.scenario), None)}
                      for v in result.verdicts],
    }


def write_report(result: RunResult) -> Path:
    """Write report.json, junit.xml and summary.md into ``result.run_dir``; returns the dir."""
    d = Path(result.run_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "report.json").write_text(json.dumps(result_json(result), indent=1, default=str))
    (d / "junit.xml").write_text(render_junit(result))
    (d / "summary.md").write_text(render_summary_md(result))
    return d


_STYLE = {"PASS": "green", "XFAIL": "yellow", "XPASS": "bold red", "FAIL": "bold red", "ERROR": "bold magenta"}


def print_summary(result: RunResult, console: Console | None = None) -> None:
    """The verdict table and the run directory on the terminal."""
    # Off a terminal (CI logs, redirects) rich would wrap at 80 columns, one word per line.
    console = console or (Console() if Console().is_terminal else Console(width=240))
    rows = scenario_rows(result)
    # The title is a line of its own, cut to the terminal's width: as the table's title rich wraps
    # it to the table's width, over several lines when the table is narrow (or empty).
    console.print(f"[bold]pdrig {escape(result.name)}: {result.status.upper()}[/]", no_wrap=True, overflow="ellipsis")
    if rows:
        table = Table(show_lines=False)
        for col in rows[0]:
            table.add_column(col, overflow="fold", max_width={"diagnosis": 70, "reference": 36}.get(col))
        for r in rows:
            # Cell text comes from servers and logs: escape it, "[/dev/shm]" must not be markup.
            table.add_row(*[f"[{_STYLE.get(v, '')}]{v}[/]" if k == "verdict" else escape(str(v))
                            for k, v in r.items()])
        console.print(table)
    else:
        console.print("no scenario was judged")
    for line in known_issue_lines(result):
        console.print(escape(line))
    if result.error:
        console.print(f"[bold red]error:[/] {escape(result.error)}")
    if result.not_run:
        console.print(f"[bold magenta]NOT RUN[/] ({len(result.not_run)}, the run stopped first): "
                      + escape(", ".join(result.not_run)))
    if result.timings:
        console.print("timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.timings.items()))
    if result.startup:
        console.print("start-up: " + escape("; ".join(startup_line(n, f) for n, f in result.startup.items())))
    console.print(f"run directory: {escape(result.run_dir)}")
