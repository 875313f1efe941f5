"""The exploration loop: one long-lived deployment per topology, seeded actions, oracles, coverage,
history, then reproduce, shrink, emit and triage each distinct finding.

Per topology (a (prefill, decode) pair of the config, or one drawn from vLLM's knobs) the
deployment (rig.explore.deployment) is started once, and every action runs on it as the scenario
:func:`rig.explore.emit.scenario_of` makes of it, through the runner's
:meth:`rig.run.runner.SuiteRunner.run_in` (the start-up, warm-up, metric snapshots, drain-to-idle,
log scanning and death detection of ``pdrig e2e``); an instance that died is restarted by the
runner before the next run. Every action is appended to ``history.jsonl``. With ``swarm_every``
the actions of each topology come in segments, each drawing a random subset of the generator's
features (rig.explore.swarm; the subset is in every history line).

Each run is judged in three steps: the verdict engine's checks; the nemesis' designed
consequences excused by name (rig.explore.excuses); the violation's mechanism (what vLLM did,
rig.explore.mechanism), which is the finding's identity. A finding with a new mechanism is then
replayed, shrunk, emitted and matched to the known issues on its mechanism (rig.explore.reproduce).

Ctrl-C (or SIGTERM through the CLI's handlers) stops the loop: the history, the findings so far and
the report are kept, and every server is stopped.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rig.cluster.processes import ClusterError
from rig.config import ConfigError, RigConfig
from rig.explore.coverage import Coverage
from rig.explore.deployment import Deployment
from rig.explore.emit import resource_scenarios, scenario_of
from rig.explore.excuses import Excuse, excuse
from rig.explore.findings import Finding, finding_id, nemesis_row
from rig.explore.generate import Generator, drawable_fields
from rig.explore.grammar import RESOURCE_ROUTES, Action, Resource, Topology
from rig.explore.history import History, action_of, counter_fields, read_history, record_entries
from rig.explore.known import load_known, match_known
from rig.explore.lives import Lives
from rig.explore.mechanism import Mechanism, mechanism_of
from rig.explore.oracles import could_not_judge, signature_of
from rig.explore.report import new_report, write_explore_report
from rig.explore.reproduce import Reproducer
from rig.explore.schemas import request_schemas
from rig.explore.settings import ExploreSettings
from rig.explore.swarm import Subset, SwarmLog, available_features, draw_subset, narrow
from rig.explore.topologies import Variant, caps_of, draw_variants
from rig.explore.whole_history import HistoryFailure, run_checks
from rig.judge.verdict import ScenarioVerdict
from rig.observe.metrics import MetricSnapshot
from rig.observe.observations import ScenarioObservation
from rig.report.explore_model import (
    DrawnTopologyReport,
    ExploreReport,
    HistoryCheckReport,
    NotJudgedReport,
    SwarmReport,
)
from rig.run.runner import SuiteRunner
from rig.workload.prompts import seed_of

__all__ = ["ExploreSettings", "Explorer", "nemesis_row", "topology_of"]
RESOURCE_POOL = 8  # prompt resources kept (the latest actions'): a later action may reuse one
KEEP_IN_REPORT = 20  # scenarios the runner's report keeps (history.jsonl keeps every one)


def topology_of(cfg: RigConfig, decode: str, variant: Variant | None = None) -> Topology:
    """The grammar's :class:`Topology` of (first prefill, ``decode``) from the config (a drawn
    ``variant``'s config, named with its ``--set`` strings, when given)."""
    if variant is not None:
        cfg = variant.cfg
    inst = cfg.instance(decode)
    spec = inst.speculative
    return Topology(prefill=cfg.prefill[0].name, decode=decode, block_size=inst.block_size or cfg.block_size,
                    max_model_len=cfg.max_model_len, usable_blocks=cfg.instance(decode).usable_blocks,
                    spec_tokens=spec.num_speculative_tokens if spec else 0, lease_s=cfg.nixl.lease_s,
                    variant=variant.name if variant else "", sets=variant.sets if variant else (),
                    caps={f"{side}.{k}": v for side, name in (("prefill", cfg.prefill[0].name), ("decode", decode))
                          for k, v in caps_of(cfg, name).items()})


def _held_past_lease(action: Action, topo: Topology) -> bool:
    """True when the action holds the decode hop (a hold, or a nemesis delay) at least P's lease."""
    held = action.hold_s >= topo.lease_s > 0
    if action.nemesis is not None:
        held |= any((f.delay_s or 0) >= topo.lease_s or (f.action == "sigstop" and (f.stop_s or 0) >= topo.lease_s)
                    for f in action.nemesis.faults)
    return held


class Explorer:
    """Runs an exploration of ``cfg`` into ``run_dir`` (history.jsonl, findings/, explore.md,
    explore.json, explore-junit.xml, the servers' logs and the runner's report of the last
    actions). Raises ConfigError (before any server starts) when a drawn topology does not
    validate or a ``--known`` suite cannot be read."""

    def __init__(self, cfg: RigConfig, run_dir: Path, settings: ExploreSettings, quiet: bool = False):
        self.run_dir, self.s, self.quiet = run_dir, settings, quiet
        self.history = History(run_dir / "history.jsonl")
        self.report = new_report(cfg.name, settings, run_dir)
        self.coverage = Coverage()
        self.findings: dict[str, Finding] = {}
        self.known = load_known(cfg, settings.known)
        self.runner = SuiteRunner(cfg, [], run_dir, quiet=True)
        # drawn and validated here, before any server starts (ConfigError names a bad combination)
        first = settings.decodes[0] if settings.decodes else None
        knobs = tuple(settings.knobs) if settings.knobs else None
        self.drawn = draw_variants(cfg, settings.seed, settings.draw_topologies, first, knobs) \
            if settings.draw_topologies else []
        self.dep = Deployment(cfg, run_dir, {v.name: v for v in self.drawn}, quiet, self.log)
        self.report.topologies = [DrawnTopologyReport(name=v.name, decode=v.decode, knobs=v.knobs, sets=list(v.sets))
                                  for v in self.drawn]
        self.resources: list[Resource] = []  # prompts earlier actions sent (rig.explore.grammar.Resource)
        self.repro = Reproducer(self.run_judged, self.history, self.log, settings.seed, run_dir, self.known,
                                lambda: self.runner.result.vllm_version, lambda: self.dep.cfg)
        self._runs = 0
        self._t_start = time.monotonic()
        self.swarm = SwarmLog()  # the segments' features and findings (rig.explore.swarm)
        self._subset: Subset | None = None  # the swarm segment the next action is drawn in
        self._segments = 0
        self.lives = Lives()  # deployment lives (rig.explore.lives)
        self._pre: dict[str, MetricSnapshot | None] = {}  # the explorer's scrape before the last run
        self.entries: list[dict[str, Any]] = []  # this run's exploring history lines (whole-history checks)
        self.history_findings: dict[str, Finding] = {}  # by mechanism key (rig.explore.whole_history)
        self._history_judged = False

    def log(self, msg: str) -> None:
        """A progress line on stderr."""
        if not self.quiet:
            print(f"[explore {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    # --- one run ----------------------------------------------------------------------------------
    def run_action(self, action: Action, topo: Topology, name: str, seed: int,
                   known_issue: dict[str, Any] | None = None,
                   origin: bool = False) -> tuple[ScenarioVerdict, ScenarioObservation, dict, dict[str, str]]:
        """Run ``action`` on the live deployment as scenario ``name`` with prompt seed ``seed``;
        returns its verdict, observation, scenario mapping and the log text of the instances that
        died in it. Its prompt resources are the earlier actions' prompts with ``origin``
        (exploring: validated beside the action, not run again), else primers sent first with
        seeds of their own (re-runs). Raises ConfigError when the scenario does not validate
        against the config (a grammar bug), ClusterError when an instance cannot start."""
        sc = {**scenario_of(action, topo, name, known_issue, origin=origin), "seed": seed}
        pre = resource_scenarios(action, name, origin)
        if not origin:
            pre = [{**p, "seed": seed_of(f"{seed}/{p['name']}")} for p in pre]
        try:
            cfg = RigConfig.model_validate({**self.dep.cfg_json(), "scenarios": [*pre, sc]})
        except ValueError as e:
            raise ConfigError(f"explore: action {action.index} does not validate as a scenario: {e}") from None
        cluster = self.dep.use(topo)
        pair = [topo.prefill, topo.decode]
        marks = self.dep.marks(pair)
        self._pre = self.dep.scrape(pair)  # no request of the rig in flight here (rig.explore.lives)
        out = self.runner.run_in(cluster, cfg, cfg.scenarios[-1:] if origin else list(cfg.scenarios),
                                 keep=KEEP_IN_REPORT)
        self._runs += 1
        logs = self.dep.since(marks, [n for n in pair if n in out.observation.dead])
        return out.verdict, out.observation, sc, logs

    def judge(self, action: Action, topo: Topology, v: ScenarioVerdict, obs: ScenarioObservation,
              logs: dict[str, str]) -> tuple[Mechanism | None, str | None, ScenarioVerdict, list[Excuse]]:
        """``(mechanism, signature, verdict, excuses)`` of one run: the nemesis' designed
        consequences excused (rig.explore.excuses), then the check-based signature
        (rig.explore.oracles) and, for a violation, its mechanism (rig.explore.mechanism)."""
        v, excused = excuse(action, v, obs, topo)
        roles = {topo.prefill: "prefill", topo.decode: "decode"}
        sig = signature_of(v, obs, roles)
        if sig is None:
            return None, None, v, excused
        return (mechanism_of(v, obs, topo, roles, sig, logs, _held_past_lease(action, topo), action.hold_s),
                sig, v, excused)

    def run_judged(self, action: Action, topo: Topology, name: str, seed: int,
                   known_issue: dict[str, Any] | None) -> tuple[str | None, ScenarioVerdict, dict]:
        """One re-run (replay, shrink candidate, emitted check): its mechanism key, verdict, scenario."""
        v, obs, sc, logs = self.run_action(action, topo, name, seed, known_issue)
        mech, _, v, _ = self.judge(action, topo, v, obs, logs)
        return (mech.key if mech else None), v, sc

    # --- the loop -------------------------------------------------------------------------------
    def run(self) -> ExploreReport:
        """Explore (or replay), then reproduce, shrink and emit every distinct violation. Always
        writes the report and stops every server; KeyboardInterrupt is re-raised after that."""
        t0 = self._t_start = time.monotonic()
        interrupted: BaseException | None = None
        try:
            self.dep.prepare()
            cfg = self.dep.cfg
            schemas = request_schemas(_python_of(cfg), cfg.cache_dir)
            fields = drawable_fields(schemas, self.s.allow_logprobs)
            self.report.fields = {ep: sorted(f) for ep, f in fields.items()}
            if not schemas:
                self.log("vLLM's request models could not be read from launch.command's interpreter: "
                         "no extra request fields are drawn")
            if self.s.replay:
                self._replay(Path(self.s.replay), t0)
            else:
                self._explore(fields, t0)
            self._judge_history()
            for i, f in enumerate(self.findings.values(), 1):
                self.repro.process(i, f, self.s.replays, self.s.shrink_runs, lambda: self._runs)
                self._write()
        except KeyboardInterrupt as e:
            interrupted = e
            self.report.status = "interrupted"
        except (ClusterError, ConfigError) as e:
            self.report.status, self.report.error = "error", str(e)
        finally:
            self.dep.stop()
            self.history.close()
            self._judge_history()  # also after an interrupt: the history so far is checked
            self.report.wall_s = time.monotonic() - t0
            self._write()
        if interrupted is not None:
            raise interrupted
        return self.report

    def _budget_left(self, done: int, spent_before: float, share_s: float) -> bool:
        if done >= self.s.actions:
            return False
        # The bound counts time spent in actions, not in start-ups (minutes on a loaded host).
        return not (self.s.minutes and (self.report.action_s > self.s.minutes * 60
                                        or self.report.action_s - spent_before > share_s))

    def _generator(self, topo: Topology, fields: dict[str, dict[str, dict]]) -> Generator:
        """The flags' generator of ``topo`` (every feature they allow)."""
        shares = (("cancel_share", self.s.cancel_share), ("resource_share", self.s.resource_share),
                  ("sample_share", self.s.sample_share), ("background_share", self.s.background_share))
        return Generator(self.s.seed, topo, fields, routes=self.s.routes or None, motifs=self.s.motifs,
                         **{key: val for key, val in shares if val is not None})

    def _segment(self, base: Generator, topo: Topology, first: bool) -> Generator:
        """Start the next swarm segment on ``topo`` (rig.explore.swarm; ``first``: the topology's
        first, every feature on); returns ``base`` narrowed to its subset."""
        kinds = self.s.nemesis if self.s.nemesis_every else []  # None: every kind
        name = topo.variant or f"{topo.prefill}+{topo.decode}"
        self._subset = draw_subset(self.s.seed, self._segments, available_features(base, kinds), first, name,
                                   self.s.swarm_every)
        self._segments += 1
        self.log(f"swarm segment {self._subset.segment} on {name}: "
                 + ("every feature" if first else f"off: {', '.join(self._subset.off) or 'none'}"))
        return narrow(base, self._subset)

    def _explore(self, fields: dict[str, dict[str, dict]], t0: float) -> None:
        decodes = self.s.decodes or [d.name for d in self.dep.base_cfg.decode]
        pairs: list[tuple[str, Variant | None]] = [(v.decode, v) for v in self.drawn] or [(d, None) for d in decodes]
        done = 0
        for k, (decode, variant) in enumerate(pairs):
            topo = topology_of(self.dep.base_cfg, decode, variant)
            self.dep.use(topo)
            topo = replace(topo, chat_overhead=self.dep.chat_overhead(topo))
            gen = base = self._generator(topo, fields)
            self.resources.clear()  # another pair or a new deployment: no cache holds the earlier prompts
            share, mine, spent_before = (self.s.actions - done) // (len(pairs) - k), 0, self.report.action_s
            while mine < share and self._budget_left(done, spent_before, self.s.minutes * 60 / len(pairs)):
                if self.s.swarm_every and mine % self.s.swarm_every == 0:
                    gen = self._segment(base, topo, first=mine == 0)
                kinds = self._subset.nemesis_kinds() if self._subset else self.s.nemesis
                if self.s.nemesis_every and mine and mine % (self.s.nemesis_every + 1) == self.s.nemesis_every \
                        and kinds != []:  # a swarm segment that kept no nemesis kind has no phase
                    # a phase of its own between batches of actions: inject, requests under the fault, heal,
                    # liveness (the fault kind's recovery checks)
                    action = gen.nemesis(done, kinds)
                else:
                    hints = {g.name: g.hint for g in self.coverage.goals}
                    action = gen.action(done, self.coverage.unreached(), hints, self.resources)
                self._explore_one(action, topo)
                done, mine = done + 1, mine + 1
                self._progress(done, t0)
                if self.s.stop_at_first and self.findings:
                    return

    def _explore_one(self, action: Action, topo: Topology) -> None:
        t = time.monotonic()
        v, obs, sc, logs = self.run_action(action, topo, f"x{action.index:05d}",
                                           seed_of(f"{self.s.seed}/{action.index}"), origin=True)
        mech, sig, v, excused = self.judge(action, topo, v, obs, logs)
        self._keep_resources(action, sc, obs)
        goals = self.coverage.update(action, obs, topo)
        self.report.actions += 1
        self.report.action_s += time.monotonic() - t
        if action.nemesis is not None:
            self.report.nemeses.append(nemesis_row(action, v, excused))
        roles = {topo.prefill: "prefill", topo.decode: "decode"}
        entry = {
            "phase": "nemesis" if action.nemesis is not None else "explore", "index": action.index,
            "topology": topo.__dict__,
            "action": action.model_dump(mode="json"), "scenario": sc, "verdict": v.verdict, "reason": v.reason,
            "checks": [{"name": c.name, "state": c.state, "detail": c.detail} for c in v.checks],
            "records": record_entries(obs),
            **counter_fields(obs, self._pre, roles, self.lives, (topo.variant, topo.prefill, topo.decode)),
            "evidence": obs.evidence.__dict__ if obs.evidence else None,
            "prefill_evidence": obs.prefill_evidence.__dict__ if obs.prefill_evidence else None,
            "dead": obs.dead, "goals": goals, "signature": sig, "mechanism": mech.to_json() if mech else None,
            "excused": [e.describe() for e in excused], "wall_s": obs.wall_s,
            **({"swarm": self._subset.to_json()} if self._subset else {})}
        self.history.append(entry)
        self.entries.append(entry)
        judged = mech is not None and sig is not None and not could_not_judge(v, obs)
        if self._subset is not None:
            self.swarm.add(self._subset, action.index, mech.key if judged and mech else None)
        if mech is None or sig is None:
            return
        if could_not_judge(v, obs):  # "not checked" is never a finding, and never ok
            self.report.not_judged.append(NotJudgedReport(action=action.index, reason=v.reason))
            return
        if mech.key in self.findings:
            self.findings[mech.key].seen += 1
            return
        self.log(f"action {action.index}: new failure {mech.key} ({sig}): {v.reason[:160]}")
        self.findings[mech.key] = Finding(mech, sig, topo, action, v.reason)
        if self.report.first_failure_s is None:
            self.report.first_failure_s = time.monotonic() - self._t_start
            self.report.first_failure_actions = self.report.actions

    def _keep_resources(self, action: Action, sc: dict[str, Any], obs: ScenarioObservation) -> None:
        """Add the prompts of an action whose requests all answered to the resource pool (the last
        :data:`RESOURCE_POOL`): steps with one fresh completions prompt per request, no transform."""
        if action.nemesis is not None or not obs.records or any(r.outcome != "ok" for r in obs.records):
            return
        edge = sc.get("kind", "edge") == "edge"
        for s in action.steps:
            if (s.route in RESOURCE_ROUTES and s.prompts == 1 and s.endpoint == "completions" and s.transform is None
                    and not (s.same_as or s.head_of or s.prefix_of or s.repeat_of)):
                self.resources.append(Resource(name="r0", origin=sc, step=None if edge else s.id, route=s.route,
                                               prompt_tokens=s.prompt_tokens))
        del self.resources[:-RESOURCE_POOL]

    def _replay(self, path: Path, t0: float) -> None:
        for entry in read_history(path):
            topo = Topology(**{**entry["topology"], "sets": tuple(entry["topology"].get("sets") or ())})
            # the segment the action was drawn in, for the report's swarm tables (None: drawn without swarm)
            self._subset = Subset.from_json(entry["swarm"]) if entry.get("swarm") else None
            self._explore_one(action_of(entry), topo)
            self._progress(self.report.actions, t0)

    def _judge_history(self) -> None:
        """The whole-history checks over this run's exploring actions (rig.explore.whole_history),
        once: their table in the report, and each distinct failure a finding matched to the known
        issues by mechanism. Not replayed or shrunk (it names several actions): it says so."""
        if self._history_judged or not self.entries:
            return
        self._history_judged = True
        checks = run_checks(self.entries)
        self.report.history_checks = [HistoryCheckReport.model_validate(c.to_json()) for c in checks]
        by_index = {e.get("index"): e for e in self.entries}
        for fail in (f for c in checks for f in c.failures):
            if fail.key in self.history_findings:
                self.history_findings[fail.key].seen += 1
                continue
            self.history_findings[fail.key] = self._history_finding(fail, by_index)
            self.log(f"whole history: new failure {fail.key}: {fail.detail[:200]}")

    def _history_finding(self, fail: HistoryFailure, by_index: dict[Any, dict[str, Any]]) -> Finding:
        """The finding of one whole-history failure: its first named action and topology, the
        known issue matched on its mechanism, or new."""
        first = by_index.get(fail.actions[0]) or self.entries[0]
        t = first["topology"]
        f = Finding(fail.mechanism(), f"history {fail.key}", Topology(**{**t, "sets": tuple(t.get("sets") or ())}),
                    action_of(first), fail.detail, actions=list(fail.actions), requests=list(fail.requests),
                    scope="whole-history",
                    note=f"not replayed or shrunk: a whole-history finding names {len(fail.actions)} action(s) "
                         f"({', '.join(map(str, fail.actions))}); replaying them as a set is not built")
        hit = match_known(f.mechanism, self.known, self.runner.result.vllm_version)
        if hit is not None:
            f.known_issue, f.known_why = hit.label(), f"matched by mechanism: {hit.why}"
        else:
            f.known_why = f"no known issue explains {fail.key}"
        if self.report.first_failure_s is None:
            self.report.first_failure_s = time.monotonic() - self._t_start
            self.report.first_failure_actions = self.report.actions
        return f

    def _progress(self, done: int, t0: float) -> None:
        el = max(time.monotonic() - t0, 1e-9)
        self._write()
        reached = sum(1 for r in self.report.coverage if r.reached)
        self.log(f"{done} actions ({done / el * 60:.1f}/min), goals {reached}/{len(self.report.coverage)}, "
                 f"failures {len(self.findings)}")

    def _write(self) -> None:
        self.report.coverage = self.coverage.table()
        self.report.findings = [f.to_report(finding_id(self.s.seed, i)) for i, f in
                                enumerate((*self.findings.values(), *self.history_findings.values()), 1)]
        swarm = self.swarm.to_json()
        self.report.swarm = SwarmReport.model_validate(swarm) if swarm else None
        self.report.runs = self._runs
        self.report.startup_s, self.report.startups = self.dep.startup_s, self.dep.startups
        self.report.vllm_version = self.runner.result.vllm_version
        write_explore_report(self.report, self.run_dir)


def _python_of(cfg: RigConfig) -> str:
    """The interpreter of ``launch.command`` (``{python}`` = this one)."""
    first = cfg.launch.command[0]
    return sys.executable if first == "{python}" else first
