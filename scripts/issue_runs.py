"""The known issues' record: one row per known issue, build and run that measured it
(docs/data/known-issue-runs.yaml), what scripts/bug_record.py renders into docs/bug-record.md, and
the rule that holds the suites' ``affects:`` ranges to it.

A row says whether the known issue's symptom was **seen** on that build in that run, **not seen**,
or that the run **could not tell** (the scenario was BROKEN, ERROR or did not run), with the cells
of the scenarios that carry the issue, the date, the command and the run it came from. Only runs
that measured something are rows: an issue nobody ran on a build has no row there.

The rule (:func:`range_conflicts`), per scenario of configs/suites/*.yaml that declares a
``known_issue`` with ``affects`` and per row of that issue whose cells include the scenario, on a
build that does not declare the issue fixed (``fixes:``):

- seen on vLLM v, and v outside ``affects``: the range ends at or below (or starts above) a build
  the table shows still affected;
- not seen on v, v inside ``affects``, and the known issue strict: the range claims affected a
  build the table shows clean. A non-strict issue (``strict: false``, timing-dependent as
  pytest's ``xfail(strict=False)``) that did not show proves nothing, so it is not held to that.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Literal

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "docs" / "data" / "known-issue-runs.yaml"
SUITES = ROOT / "configs" / "suites"

WORDS = {"seen": "seen", "not-seen": "not seen", "could-not-tell": "?"}


class IssueRun(BaseModel):
    """One known issue on one build in one run (one row of docs/data/known-issue-runs.yaml); a
    field nobody declared is an error."""

    model_config = ConfigDict(extra="forbid")

    issue: str
    """The known issue's ``id`` (configs/suites/*.yaml)."""
    build: str
    """The build's name (configs/builds.yaml)."""
    vllm: str = ""
    """The build's vLLM version when it is not the build's name (a patched build: 0.32.0-spec-fix
    is vLLM 0.32.0)."""
    fixed: bool = False
    """The build declares this issue fixed (``fixes:``): shown, never evidence for a range."""
    date: str
    verdict: Literal["seen", "not-seen", "could-not-tell"]
    cells: dict[str, str] = Field(min_length=1)
    """The scenarios carrying the issue that ran: scenario -> its cell (PASS, XFAIL, FAIL, BROKEN, ...)."""
    command: str
    run: str
    """The run it came from: its run directory, and where its figures are recorded when the
    directory was not kept."""
    load: str = "not stated"
    """The host's 1-min load average (``uptime``) at the start and end of the run."""
    wall_s: float | None = None
    """The run's wall time, seconds (the whole command, build start-ups included)."""
    note: str = ""

    @field_validator("date", "load", "vllm", "build", mode="before")
    @classmethod
    def _text(cls, v: object) -> object:
        """A YAML date (``2026-12-02`` unquoted) or number (a load of ``1.5``) is read as text."""
        if isinstance(v, date):
            return v.isoformat()
        return str(v) if isinstance(v, int | float) else v

    @property
    def version(self) -> str:
        """The vLLM version this row measured."""
        return self.vllm or self.build


def load_runs(path: Path = RUNS) -> list[IssueRun]:
    """The rows of ``path`` (a YAML list), in file order. Raises ValueError naming the row (its
    index, issue and build) and the field when one does not fit :class:`IssueRun`."""
    items = yaml.safe_load(path.read_text()) or []
    out = []
    for i, item in enumerate(items):
        try:
            out.append(IssueRun.model_validate(item))
        except ValidationError as e:
            err = e.errors()[0]
            where = f"row {i} ({item.get('issue', '?')} on {item.get('build', '?')})"
            raise ValueError(f"{path}: {where}: {'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None
    return out


def _order(build: str, version: str) -> tuple[Any, ...]:
    try:
        return (0, Version(version), build != version, build)
    except InvalidVersion:
        return (1, build)


def render_runs(rows: list[IssueRun]) -> list[str]:
    """The page's part for ``rows``: the known issue x build grid (each cell the verdicts of the
    runs that measured it, with their count), then every row. Lines of Markdown."""
    builds = sorted({(r.build, r.version) for r in rows}, key=lambda bv: _order(*bv))
    issues = list(dict.fromkeys(r.issue for r in rows))
    out = ["## Known issues by build", "",
           "Whether each known issue's symptom was seen on a build, per run that measured it (rows below;",
           "data: `docs/data/known-issue-runs.yaml`). \"?\": the run could not tell (BROKEN, ERROR);",
           "blank: not measured; \"(fix)\": the build declares the issue fixed. tests/repo/test_bug_record.py",
           "fails when an `affects:` range in configs/suites/ disagrees with these rows.", "",
           "| known issue | " + " | ".join(b for b, _ in builds) + " |", "|---|" + "---|" * len(builds)]
    for issue in issues:
        row = []
        for b, _ in builds:
            mine = [r for r in rows if r.issue == issue and r.build == b]
            counts = Counter(WORDS[r.verdict] for r in mine)
            text = ", ".join(w + (f" x{n}" if n > 1 else "") for w, n in counts.items())
            row.append(text + (" (fix)" if any(r.fixed for r in mine) else ""))
        out.append(f"| `{issue}` | " + " | ".join(row) + " |")
    out += ["", "### The runs", "",
            "| known issue | build | date | verdict | cells | command | run | load | wall |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (issues.index(r.issue), _order(r.build, r.version), r.date)):
        cells = "<br>".join(f"{s}: {c}" for s, c in r.cells.items())
        wall = f"{r.wall_s:.0f} s" if r.wall_s is not None else "-"
        build = r.build + (f" (vLLM {r.vllm})" if r.vllm and r.vllm != r.build else "")
        out.append("| " + " | ".join(x.replace("|", "/") for x in (
            f"`{r.issue}`", build, r.date, WORDS[r.verdict] + (" (fix)" if r.fixed else ""), cells,
            f"`{r.command}`", r.run + (f" ({r.note})" if r.note else ""), r.load, wall)) + " |")
    return out


@dataclass(frozen=True)
class Declared:
    """One scenario's known issue as a suite declares it: ``affects`` a PEP 440 specifier,
    ``strict`` as the suite says (default true), ``file`` the suite's path relative to the repo."""

    file: str
    scenario: str
    issue: str
    affects: str
    strict: bool


def declared_ranges(folder: Path = SUITES) -> list[Declared]:
    """Every scenario of ``folder/*.yaml`` with a ``known_issue`` that has an ``affects``."""
    out = []
    for path in sorted(folder.glob("*.yaml")):
        for item in yaml.safe_load(path.read_text()) or []:
            ki = item.get("known_issue") if isinstance(item, dict) else None
            if ki and ki.get("affects"):
                out.append(Declared(path.relative_to(folder.parent.parent).as_posix(), item["name"], ki["id"],
                                    str(ki["affects"]), bool(ki.get("strict", True))))
    return out


def range_conflicts(declared: list[Declared], rows: list[IssueRun]) -> list[str]:
    """One line per disagreement between a declared range and a row (the rule of the module
    docstring), naming the file, scenario, range, build and run; [] when they agree."""
    out = []
    for d in declared:
        spec = SpecifierSet(d.affects)
        for r in rows:
            if r.issue != d.issue or d.scenario not in r.cells or r.fixed or r.verdict == "could-not-tell":
                continue
            v = Version(r.version)
            inside = spec.contains(v, prereleases=True)
            where = f"{d.file}: {d.scenario}: affects {d.affects!r}"
            run = f"{r.run}, {r.date}"
            if r.verdict == "seen" and not inside:
                upper = any(s.operator in ("<", "<=") and not s.contains(v, prereleases=True) for s in spec)
                edge = "ends at or below" if upper else "starts above"
                out.append(f"{where} {edge} {r.build} (vLLM {v}), which the table shows still affected ({run}): "
                           "rewrite the range to what was measured")
            elif r.verdict == "not-seen" and inside and d.strict:
                out.append(f"{where} claims {r.build} (vLLM {v}) affected, which the table shows clean ({run}): "
                           "rewrite the range to what was measured")
    return out


def rows_from_matrix(matrix: dict[str, Any], declared: list[Declared], *, day: str, command: str,
                     load: str, run: str, wall_s: float | None, note: str = "") -> list[IssueRun]:
    """The rows of one matrix run: per known issue of ``matrix["known_issues"]`` (a ``matrix.json``
    of ``pdrig matrix``, rig/report/grid.py) and per build its finding names (seen / not seen /
    could not tell, and the builds declaring it fixed), with the cells of that issue's scenarios on
    that build; ``day``, ``command``, ``load``, ``run`` (the matrix's ``--out``; a row's run is
    ``run/<build>``), ``wall_s`` and ``note`` go on every row. Builds whose cells of the issue are
    all NOT RUN give no row (nothing measured)."""
    versions = {b["name"]: str(b.get("vllm_version") or "") for b in matrix.get("builds", [])}
    owner = {d.scenario: d.issue for d in declared}
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for c in matrix.get("cells", []):
        if c["scenario"] in owner and c["verdict"] != "NOT RUN":
            cells.setdefault((owner[c["scenario"]], c["build"]), {})[c["scenario"]] = c["verdict"]
    out = []
    for f in matrix.get("known_issues", []):
        states = [(b, "seen", False) for b in f["seen"]] + [(b, "not-seen", False) for b in f["not_seen"]]
        states += [(u.split(" (")[0], "could-not-tell", False) for u in f["unknown"]]
        for item in f["declared_fixed"]:
            b, state = item.split(": ", 1)
            states.append((b, {"SEEN": "seen", "not seen": "not-seen"}.get(state, "could-not-tell"), True))
        for b, verdict, fixed in states:
            mine = cells.get((f["id"], b))
            if not mine:
                continue
            vllm = versions.get(b, "")
            out.append(IssueRun(issue=f["id"], build=b, vllm="" if vllm == b else vllm, fixed=fixed, date=day,
                                verdict=verdict, cells=mine, command=command, run=f"{run}/{b}", load=load,
                                wall_s=wall_s, note=note))
    return out


def append_rows(rows: list[IssueRun], path: Path = RUNS) -> None:
    """Append ``rows`` to the YAML list in ``path``, one block mapping each (defaults left out), the
    file's other text untouched."""
    text = path.read_text()
    for r in rows:
        text += yaml.safe_dump([r.model_dump(exclude_defaults=True)], sort_keys=False, allow_unicode=True,
                               width=110)
    path.write_text(text)
