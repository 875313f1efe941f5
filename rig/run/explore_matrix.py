"""``pdrig matrix --explore RUN_DIR``: an exploration's minimal failures replayed on other builds.

``pdrig explore`` (rig/explore) writes each distinct failure it found, shrunk, as a one-scenario
suite YAML under ``<run>/findings/`` and lists them in ``<run>/explore.json``. This module gathers
the findings of one or more exploration run directories, copies each scenario (renamed
``<build the exploration ran on>-<finding>``, so two explorations' ``explore-1-1`` stay apart) into
one suite per set of overrides under ``<out>/explore-suites/`` (the ``--set``s of the finding's
topology when it was drawn from vLLM's knobs, and the exploration's ``nixl.kv_lease_duration``: a
decode hop held past the lease reproduces only with that lease), and hands those suites to
:class:`rig.run.matrix.Matrix`: one build at a time, one deployment per build and suite, each
build's interpreter and ``fixes`` as ``pdrig matrix`` applies them. The grid is then read per finding:

- **holds**: the failure showed on that build: ``XFAIL`` (the known issue the explorer named
  showed its symptom) or ``FAIL`` (a new finding's checks failed again, or a known one failed
  outside its declared ``affects``);
- **does not hold**: ``PASS`` or ``XPASS`` (every check held; a known issue's symptom did not show);
- **other failure**: ``FAIL`` of a finding that carries a known issue, without that issue's
  symptom (the scenario fails there another way);
- **error**: ``ERROR`` / ``BROKEN``: the build could not say (inconclusive, an instance died before
  any answer, the build could not be created);
- **not run**: ``NOT RUN``: no recorded run has it (interrupted, or ``--report-only`` before the build ran).

``matrix.md`` is that table (finding, where it was found, its signature and known issue, then one
column per build), followed by the ordinary scenario x build grid; ``matrix.json`` holds the grid
(rig.report.grid) plus ``findings`` with each build's holds/does not hold/error.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rig.cluster.builds import SuiteSpec
from rig.config import ConfigError
from rig.config.files import MAX_JSON_BYTES, load_yaml, read_text
from rig.errors import InputFileError
from rig.report.explore_model import EXPLORE_REPORT_VERSION, ExploreReport
from rig.report.grid import Grid

HOLDS = {"XFAIL": "holds", "FAIL": "holds", "PASS": "does not hold", "XPASS": "does not hold"}
SUITES_DIR = "explore-suites"


@dataclass
class ExploreFinding:
    """One minimal failure of an exploration, as the matrix replays it. ``scenario``: its name in
    the copied suite (``<found_on>-<stem>``); ``origin``: the exploration's run directory;
    ``source``: the emitted YAML; ``found_on``: the vLLM version the exploration ran (explore.json
    ``vllm_version``, "" when unknown); ``signature``/``known_issue``/``stability``: as the
    explorer recorded them; ``overrides``: the ``--set`` it needs (its drawn topology's, the lease);
    ``cells``: build name -> "holds (XFAIL)" / "does not hold (PASS)" / "error (BROKEN: why)"."""

    scenario: str
    origin: str
    source: str
    found_on: str
    signature: str
    known_issue: str
    stability: str
    overrides: list[str] = field(default_factory=list)
    cells: dict[str, str] = field(default_factory=dict)


def _slug(text: str) -> str:
    """``text`` as a scenario name part (rig.config.base NAME_PATTERN: lower case, digits, '-')."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def exploration_overrides(run_dir: Path) -> list[str]:
    """The ``--set`` overrides a finding of the exploration in ``run_dir`` needs to reproduce:
    ``nixl.kv_lease_duration`` when its ``config.yaml`` (the effective config the explorer wrote)
    sets one; [] otherwise (vLLM's default lease)."""
    try:
        data = load_yaml(run_dir / "config.yaml", "--explore", "the run directory of a `pdrig explore` run")
    except ConfigError:
        return []
    nixl = data.get("nixl")
    lease = nixl.get("kv_lease_duration") if isinstance(nixl, dict) else None
    return [] if lease is None else [f"nixl.kv_lease_duration={lease}"]


def read_exploration(run_dir: Path) -> ExploreReport:
    """The report of the exploration in ``run_dir``: its ``explore.json`` read with
    :meth:`ExploreReport.model_validate_json`. Raises ConfigError when the directory has none, and
    InputFileError (a ConfigError) naming the file and the first field for one that cannot be read
    or is not an explore report of this model's version (one an older pdrig wrote: explore again)."""
    path = run_dir / "explore.json"
    fix = "give the run directory of a `pdrig explore` run"
    if not path.is_file():
        raise ConfigError(f"--explore {run_dir}: no readable explore.json; give the run directory of a "
                          "`pdrig explore` run (runs/<stamp>-<config>-explore)")
    text = read_text(path, "--explore", MAX_JSON_BYTES, fix)
    try:
        return ExploreReport.model_validate_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise InputFileError(f"--explore {path}: not an explore report of version {EXPLORE_REPORT_VERSION}: "
                             f"{loc}: {first['msg'].removeprefix('Value error, ')}{more}; {fix} (an exploration "
                             "an older pdrig recorded: run pdrig explore again)", str(path)) from None


def collect_findings(run_dirs: list[Path]) -> list[tuple[ExploreFinding, dict[str, Any]]]:
    """Each finding with an emitted YAML in the explorations ``run_dirs`` (in their order), with
    its scenario mapping renamed to :attr:`ExploreFinding.scenario`. Raises ConfigError naming the
    directory without an ``explore.json`` or with one that is no explore report
    (:func:`read_exploration`), a YAML that is missing or holds no scenario, or the whole set when
    no exploration found anything to replay."""
    out: list[tuple[ExploreFinding, dict[str, Any]]] = []
    names: set[str] = set()
    for d in run_dirs:
        rep = read_exploration(d)
        lease = exploration_overrides(d)
        found_on = rep.vllm_version
        for f in rep.findings:
            if not f.yaml:  # not emitted (not replayed, or the exploration stopped first)
                continue
            # a topology drawn from vLLM's knobs is the config plus its --sets (rig/explore/topologies.py)
            overrides = list(f.topology.sets)
            if not any(o.startswith("nixl.kv_lease_duration=") for o in overrides):
                overrides += lease
            path = Path(f.yaml)
            path = path if path.is_file() else d / "findings" / path.name  # a moved run directory
            scenarios = load_yaml(path, f"--explore {d}: finding", "a findings/*.yaml of pdrig explore", list)
            if not isinstance(scenarios, list) or not scenarios or not isinstance(scenarios[0], dict):
                raise ConfigError(f"--explore {d}: {path} holds no scenario (a findings/*.yaml of pdrig explore)")
            base = "-".join(p for p in (_slug(found_on) or _slug(d.name), path.stem) if p)
            name, n = base, 1
            while name in names:
                n += 1
                name = f"{base}-{n}"
            names.add(name)
            sc = {**scenarios[0], "name": name}
            out.append((ExploreFinding(name, str(d), str(path), found_on, f.signature, f.known_issue, f.stability,
                                       overrides), sc))
    if not out:
        raise ConfigError(f"--explore {', '.join(map(str, run_dirs))}: no finding with an emitted YAML "
                          "(explore.json lists none): nothing to replay")
    return out


def write_suites(found: list[tuple[ExploreFinding, dict[str, Any]]], out: Path) -> dict[str, SuiteSpec]:
    """Write one suite per distinct set of overrides under ``<out>/explore-suites/`` (each finding's
    scenario, renamed, with a comment naming its origin); returns label -> SuiteSpec for
    :class:`rig.run.matrix.Matrix` (labels ``explore``, ``explore-2``, ... in first-seen order).
    One suite per override set keeps one deployment per build for all findings that share it."""
    groups: dict[tuple[str, ...], list[tuple[ExploreFinding, dict[str, Any]]]] = {}
    for f, sc in found:
        groups.setdefault(tuple(f.overrides), []).append((f, sc))
    d = out / SUITES_DIR
    d.mkdir(parents=True, exist_ok=True)
    specs: dict[str, SuiteSpec] = {}
    for k, (sets, members) in enumerate(groups.items(), 1):
        label = "explore" if k == 1 else f"explore-{k}"
        head = "".join(f"# {f.scenario}: {f.source} (found on {f.found_on or 'unknown'}; {f.signature}; "
                       f"known issue {f.known_issue}; {f.stability})\n" for f, _ in members)
        path = d / f"{label}.yaml"
        path.write_text(f"# pdrig matrix --explore: minimal failures, replayed with {list(sets) or 'no --set'}\n"
                        + head + yaml.safe_dump([sc for _, sc in members], sort_keys=False, width=120))
        specs[label] = SuiteSpec(file=str(path.resolve()), set=list(sets))
    return specs


def holds(verdict: str, reason: str = "", known: bool = False) -> str:
    """A finding's cell from the scenario's verdict on a build: "holds (XFAIL)", "does not hold
    (PASS)", "error (BROKEN: <reason>)", "not run (NOT RUN: <reason>)" (see the module docstring).
    ``known``: the finding carries a known issue; its FAIL then holds only when the verdict engine
    matched that issue's symptom outside its ``affects`` (rig/judge/verdict.py "matches known issue"); any other FAIL is
    "other failure" (the scenario failed there, but not the way it was found)."""
    word = "not run" if verdict == "NOT RUN" else HOLDS.get(verdict, "error")
    if verdict == "FAIL" and known and "matches known issue" not in reason:
        word = "other failure"
    why = f": {reason[:120]}" if word in ("error", "not run", "other failure") and reason else ""
    return f"{word} ({verdict}{why})"


def fill_cells(findings: list[ExploreFinding], grid: Grid) -> None:
    """Set each finding's ``cells`` from ``grid`` (its scenario on each of the grid's builds)."""
    for f in findings:
        known = f.known_issue != "new"
        f.cells = {b: holds(c.verdict, c.reason, known) for b in grid.builds
                   if (c := grid.cells.get((f.scenario, b))) is not None}


def render_findings_md(findings: list[ExploreFinding], builds: list[str]) -> str:
    """The failure -> build table of ``matrix.md`` (markdown)."""
    lines = ["| finding | found on | signature | known issue | stability there | " + " | ".join(builds) + " |",
             "|---|---|---|---|---|" + "---|" * len(builds)]
    for f in findings:
        lines.append(f"| `{f.scenario}` | {f.found_on or '?'} | `{f.signature}` | {f.known_issue} | {f.stability} | "
                     + " | ".join(f.cells.get(b, "not run") for b in builds) + " |")
    sources = [f"- `{f.scenario}`: {f.source}" + (f" (with --set {' --set '.join(f.overrides)})" if f.overrides else "")
               for f in findings]
    return "\n".join([*lines, "", "Minimal YAMLs:", "", *sources]) + "\n"


def findings_json(findings: list[ExploreFinding]) -> list[dict[str, Any]]:
    """``matrix.json``'s ``findings``."""
    return [asdict(f) for f in findings]
