"""Runs a suite end to end: config -> plan -> cluster -> workload -> observations -> verdict -> report.

Scenarios are grouped into *phases* by the (prefill, decode) pair they need, in suite order.
The cluster keeps what the next phase still needs (the prefill instance) and swaps the rest,
so each topology is started once and reused by all its scenarios. On a 2-core CPU host this
also keeps two servers running at a time instead of four (each idle CPU instance with NIXL
spins about two cores; see configs/cpu-tiny.yaml).

The report is rewritten after every scenario and once more on the way out, whatever the way
out is (pass, fail, exception, Ctrl-C, SIGTERM), so the run directory always holds what was
observed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import yaml

from rig import aio
from rig import metrics as m
from rig.client import PDClient
from rig.cluster import Cluster, ClusterError, log_size, scan_fatal, scan_kv_integrity
from rig.config import ConfigError, RigConfig, ScenarioConfig
from rig.observations import ScenarioObservation, SnapshotStore, TransferEvidence, wait_idle
from rig.plan import Plan, build_plan
from rig.report import RunResult, print_summary, write_report
from rig.tiny_model import ensure_tiny_model
from rig.verdict import ScenarioVerdict
from rig.workload.edge import Endpoint
from rig.workload.kinds import KINDS, ScenarioContext
from rig.workload.prompts import make_prompt


def new_run_dir(cfg: RigConfig, label: str | None = None) -> Path:
    """``<run_root>/<YYYYmmdd-HHMMSS>-<label or config name>``, created (never reused)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.run_root) / f"{stamp}-{label or cfg.name}"
    d, n = base, 1
    while d.exists():
        n += 1
        d = base.with_name(f"{base.name}-{n}")
    (d / "logs").mkdir(parents=True)
    return d


def resolve_model(cfg: RigConfig) -> str:
    """The model argument for vLLM: the built tiny model's directory, a local path or a hub id.

    Raises ConfigError when ``model.source: path`` names a directory that does not exist.
    """
    if cfg.model.source == "tiny":
        return str(ensure_tiny_model(cfg.model.tiny, Path(cfg.cache_dir) / "models").resolve())
    if cfg.model.source == "path":
        p = Path(cfg.model.path or "")
        if not p.is_dir():
            raise ConfigError(f"model.path: {str(p)!r} is not a directory; give a local model "
                              "directory or use model.source: hub on a machine with hub access")
        return str(p.resolve())
    return str(cfg.model.path)


@dataclass(frozen=True)
class Phase:
    """Scenarios that share one (prefill, decode) pair."""

    prefill: str
    decode: str
    scenarios: tuple[ScenarioConfig, ...]


def phases_of(cfg: RigConfig, scenarios: list[ScenarioConfig]) -> list[Phase]:
    """Group ``scenarios`` by their (prefill, decode) pair, keeping first-appearance order."""
    order: list[tuple[str, str]] = []
    groups: dict[tuple[str, str], list[ScenarioConfig]] = {}
    for sc in scenarios:
        key = (sc.prefill or cfg.prefill[0].name, sc.decode or cfg.decode[0].name)
        if key not in groups:
            order.append(key)
            groups[key] = []
        groups[key].append(sc)
    return [Phase(p, d, tuple(groups[(p, d)])) for p, d in order]


def select_scenarios(cfg: RigConfig, names: list[str] | None) -> list[ScenarioConfig]:
    """The scenarios to run: all, or those named (raises ConfigError for an unknown name)."""
    if not names:
        return list(cfg.scenarios)
    known = {s.name: s for s in cfg.scenarios}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"--scenario: unknown {unknown}; this config has {sorted(known)}")
    return [known[n] for n in names]


class SuiteRunner:
    """Runs the selected scenarios of a config against a cluster it starts and stops."""

    def __init__(self, cfg: RigConfig, scenarios: list[ScenarioConfig], run_dir: Path, quiet: bool = False,
                 attach: bool = False):
        self.cfg = cfg
        self.attach = attach  # judge endpoints started elsewhere (Compose); start/stop nothing
        self.scenarios = scenarios
        self.run_dir = run_dir
        self.quiet = quiet
        self.result = RunResult(name=cfg.name, run_dir=str(run_dir), config=cfg.model_dump(mode="json"))
        self._log_offsets: dict[str, int] = {}  # instance -> byte offset of its log not yet scanned
        # scenario -> what its kind returned (wave statistics, store counters, retrieval rates)
        self.kind_results: dict[str, object] = {}
        # The scenario in flight and its observation as filled so far: kept in the report
        # (ERROR, "interrupted mid-scenario") when Ctrl-C or a crash stops the run inside it.
        self._in_flight: tuple[ScenarioConfig, ScenarioObservation, float] | None = None
        self.versions: dict[str, str] = {}  # instance -> vLLM version from its /version ('' = unknown)

    def log(self, msg: str) -> None:
        """Progress line on stderr (the report is the real output)."""
        if not self.quiet:
            print(f"[pdrig {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def run(self) -> RunResult:
        """Run everything; always writes the report. Never raises for failures of the system
        under test; KeyboardInterrupt (Ctrl-C, SIGTERM via the CLI's handlers) is recorded as
        ``interrupted`` and re-raised after teardown and the report."""
        t0 = time.monotonic()
        cluster: Cluster | None = None
        interrupted: BaseException | None = None
        try:
            model_path = resolve_model(self.cfg)
            plan = build_plan(self.cfg, self.run_dir, model_path, sys.executable)
            self.result.plan = plan.to_json()
            (self.run_dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=1))
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(self.result.config, sort_keys=False))
            cluster = Cluster(plan, self.cfg.timeouts.startup_s, self.cfg.timeouts.shutdown_grace_s,
                              attach=self.attach)
            aio.run(self._run_phases(cluster, plan))
        except KeyboardInterrupt as e:
            self.result.status, self.result.error = "interrupted", f"interrupted ({e or 'SIGINT'})"
            interrupted = e
            self._keep_partial("interrupted mid-scenario")
        except (ClusterError, ConfigError) as e:
            self.result.status, self.result.error = "error", str(e)
        except Exception as e:  # the rig's own bug: keep the evidence, then report it
            self.result.status, self.result.error = "error", f"{type(e).__name__}: {e}"
            import traceback

            (self.run_dir / "rig-traceback.txt").write_text(traceback.format_exc())
            self._keep_partial(f"the rig failed mid-scenario: {type(e).__name__}: {e}")
        finally:
            if cluster is not None:
                t_stop = time.monotonic()
                cluster.stop_all()
                self.result.timings["teardown"] = time.monotonic() - t_stop
            self.result.timings["total"] = time.monotonic() - t0
            self.result.finish_status()
            write_report(self.result)
            if not self.quiet:
                print_summary(self.result)
        if interrupted is not None:
            raise interrupted
        return self.result

    def run_on(self, cluster: Cluster, scenarios: list[ScenarioConfig]) -> list[ScenarioVerdict]:
        """Run ``scenarios`` on a ``cluster`` the caller owns and keeps up between calls (the pytest
        plugin's session topology); returns their verdicts. Phases work as in :meth:`run`
        (instances a phase lacks are started, those it does not need stopped), but the cluster is
        never torn down here. Verdicts accumulate in ``self.result``, and the report in the run
        directory is rewritten on every exit path. Exceptions (ClusterError, KeyboardInterrupt,
        the rig's own) propagate after the scenario in flight is kept as ERROR."""
        self.scenarios = list(scenarios)
        first = len(self.result.verdicts)
        try:
            aio.run(self._run_phases(cluster, cluster.plan))
        except BaseException as e:
            self._keep_partial(f"the run stopped mid-scenario: {type(e).__name__}: {e}")
            raise
        finally:
            self.result.status = "running"  # recomputed from all verdicts so far
            self.result.finish_status()
            write_report(self.result)
        return self.result.verdicts[first:]

    def _keep_partial(self, why: str) -> None:
        """Put the scenario that was in flight into the result as an ERROR verdict with its
        partial observation (records answered so far, stall diagnosis, log lines)."""
        if self._in_flight is None:
            return
        sc, obs, started = self._in_flight
        self._in_flight = None
        answered = sum(r.outcome == "ok" for r in obs.records)
        obs.wall_s = time.monotonic() - started
        obs.error = obs.error or f"{why}: partial observation ({answered}/{len(obs.records)} requests answered)"
        self.result.observations.append(obs)
        try:  # the kind's own judge gives ERROR (obs.error is set) with the scenario's expectation
            verdict = KINDS[sc.kind].judge(sc, obs, None, self.result.extra_sections)
        except Exception:  # a judge that needs what the interrupted run never produced
            verdict = ScenarioVerdict(sc.name, "ERROR", "pass", obs.error)
        self.result.verdicts.append(verdict)

    async def _run_phases(self, cluster: Cluster, plan: Plan) -> None:
        timeouts = self.cfg.timeouts
        store = SnapshotStore(self.run_dir)
        client = PDClient(self.cfg.model.served_name, timeout_s=max(timeouts.request_s, 5.0))
        # A fresh connection per scrape: on a keep-alive connection, D's /metrics answered up to
        # 4.6 s late during the 0.32.0 livelock on a 2-core host, against < 1 s for new ones.
        http = httpx.AsyncClient(timeout=10.0, limits=httpx.Limits(max_keepalive_connections=0))
        extra = [p.name for p in plan.processes if p.role == "mooncake-master"]
        try:
            for i, ph in enumerate(phases_of(self.cfg, self.scenarios)):
                needed = set(extra) | {ph.prefill, ph.decode}
                stale = [n for n in cluster.procs if n not in needed]
                if stale:
                    self.log(f"stopping {', '.join(stale)}")
                    await asyncio.to_thread(cluster.stop, stale)
                self.log(f"phase {i + 1}: starting {', '.join(n for n in sorted(needed) if n not in cluster.procs) or 'nothing new'}")
                t = time.monotonic()
                await asyncio.to_thread(cluster.start, [n for n in [*extra, ph.prefill, ph.decode]])
                self.result.timings[f"startup phase {i + 1}"] = time.monotonic() - t
                # Fatal log lines count from the phase start (warm-up included), each once.
                for n in cluster.procs:
                    self._log_offsets.setdefault(n, log_size(cluster.plan.by_name(n).log_path))
                t = time.monotonic()
                version = await self._warm_up(client, http, cluster, ph)
                self.result.vllm_version = self.result.vllm_version or version
                self.result.timings[f"warm-up phase {i + 1}"] = time.monotonic() - t
                for sc in ph.scenarios:
                    self.log(f"scenario {sc.name} on {ph.prefill} -> {ph.decode}")
                    obs, kind_result = await self._scenario(sc, ph, cluster, client, http, store, version)
                    self._in_flight = None
                    self.result.observations.append(obs)
                    self.kind_results[sc.name] = kind_result
                    verdict = KINDS[sc.kind].judge(sc, obs, kind_result, self.result.extra_sections)
                    self.result.verdicts.append(verdict)
                    self.log(f"  {verdict.verdict}: {verdict.reason[:200]}")
                    write_report(self.result)
        finally:
            store.close()
            await client.aclose()
            await http.aclose()

    async def _warm_up(self, client: PDClient, http: httpx.AsyncClient, cluster: Cluster, ph: Phase) -> str:
        """One short direct request per instance and one P/D round trip (pays JIT, first-request
        and NIXL handshake costs outside the scenarios' deadlines); returns the vLLM version
        reported by the decode's ``/version``."""
        for name in (ph.prefill, ph.decode):
            hop = await client.direct(name, cluster.url(name), make_prompt(8, 7), 2)
            if hop.error:
                # Not fatal: the scenarios will meet the same failure and be judged on it.
                self.log(f"warm-up request to {name} failed: {hop.error}")
                self.result.timings.setdefault(f"warm-up failed {name}", 0.0)
        # One throw-away P/D round trip: the NIXL handshake and D's first UCX transfer (seconds on
        # a CPU host) then happen here, not inside the first scenario's deadline and stall window.
        p_hop = await client.prefill(ph.prefill, cluster.url(ph.prefill), make_prompt(8, 11), 2)
        if p_hop.kv_transfer_params:
            d_hop = await client.decode(ph.decode, cluster.url(ph.decode), make_prompt(8, 11), 2,
                                        p_hop.kv_transfer_params)
            if d_hop.error:
                self.log(f"warm-up P/D request to {ph.decode} failed: {d_hop.error}")
        # Both sides' versions: a known issue is judged only when P and D run one known version.
        for name in (ph.prefill, ph.decode):
            try:
                self.versions[name] = (await http.get(cluster.url(name) + "/version")).json().get("version", "")
            except (httpx.HTTPError, ValueError, AttributeError):
                self.versions[name] = ""
        return self.versions[ph.decode]

    async def _scenario(self, sc: ScenarioConfig, ph: Phase, cluster: Cluster, client: PDClient,
                        http: httpx.AsyncClient, store: SnapshotStore,
                        version: str) -> tuple[ScenarioObservation, object]:
        """Run one scenario of any kind; returns its observation and the kind's own result."""
        timeouts = self.cfg.timeouts
        kind_result: object = None
        obs = ScenarioObservation(scenario=sc.name, decode=ph.decode, prefill=ph.prefill, vllm_version=version,
                                  versions={n: v for n in (ph.prefill, ph.decode) if (v := self.versions.get(n))})
        t0 = time.monotonic()
        self._in_flight = (sc, obs, t0)
        logs = {n: cluster.plan.by_name(n).log_path for n in cluster.procs}
        p = Endpoint(ph.prefill, cluster.url(ph.prefill))
        d = Endpoint(ph.decode, cluster.url(ph.decode))
        try:
            before = {e.name: await m.scrape(http, e.url, e.name) for e in (p, d)}
            for s in before.values():
                store.save(f"{sc.name}-before", s)
            ctx = ScenarioContext(self.cfg, cluster, p, d, client, http, store, self.run_dir, self.quiet)
            kind_result = await KINDS[sc.kind].run(sc, ctx, obs)
            after_d = await m.scrape(http, d.url, d.name)
            store.save(f"{sc.name}-after", after_d)
            obs.evidence = TransferEvidence.between(before[d.name], after_d)
            # D first (the subject), then P, which may hold blocks for an abandoned transfer
            # until its kv_lease_duration (30 s by default) expires.
            for e in (d, p):
                obs.drains.append(await wait_idle(http, e.name, e.url, before[e.name].value(m.KV_USAGE),
                                                  timeouts.drain_s))
            for e in (p, d):
                store.save(f"{sc.name}-idle", await m.scrape(http, e.url, e.name))
        except httpx.HTTPError as e:
            # An instance that died is an observation (the `alive` check fails), not a rig error.
            if not cluster.dead():
                obs.error = f"metrics unavailable: {type(e).__name__}: {e}"
        obs.dead = cluster.dead()
        obs.fatal_lines = {}
        for n, path in logs.items():
            obs.fatal_lines[n] = scan_fatal(path, self._log_offsets.get(n, 0))
            obs.kv_integrity_lines[n] = scan_kv_integrity(path, self._log_offsets.get(n, 0))
            self._log_offsets[n] = log_size(path)
        obs.wall_s = time.monotonic() - t0
        return obs, kind_result
