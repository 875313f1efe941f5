"""``pdrig wave``'s run: one wave scenario on servers that are already up, as a one-scenario suite.

The command line (rig/run/wave_cli.py) turns its flags into a scenario and endpoints;
:func:`run_attached_wave` then runs that scenario the way a suite runs each of its scenarios:
through :class:`rig.run.ledger.RunLedger` (the scenario in flight kept on Ctrl-C, a rig exception
as that scenario's ERROR with rig-traceback.txt, the report rewritten after the scenario and on
every exit path) and :func:`rig.run.lifecycle.run_scenario` (alive? -> snapshots -> the wave ->
transfer evidence -> drains -> deaths and log lines -> the verdict). What differs from a suite is
only where the facts come from: no cluster is started, so the deployment is
:class:`WatchedEndpoints` (the ``endpoints.json`` entries of ``pdrig up``, or bare URLs) and the
block geometry and served model are asked of the servers (:func:`ask_servers`) before the wave.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from rig.config import ConfigError, RigConfig, ScenarioConfig
from rig.config.blocks import usable_in_pool
from rig.judge.verdict import ScenarioVerdict
from rig.judge.wave_checks import explain_stall, judge_wave
from rig.observe import metrics as m
from rig.observe.endpoint_watch import EndpointWatch
from rig.observe.observations import ScenarioObservation, SnapshotStore
from rig.observe.stall import cache_info
from rig.report.build import RunResult
from rig.run.ledger import RunLedger
from rig.run.lifecycle import ScenarioSteps
from rig.transport import aio
from rig.transport.endpoint import Endpoint
from rig.workload.waves import run_wave, served_model, stall_settings, usable_blocks_of


@dataclass(frozen=True)
class WaveOptions:
    """What ``pdrig wave``'s flags say beyond the scenario: the served ``model`` name, the
    ``block_size`` (tokens) and the usable blocks of every P (``prefill_blocks``) and every D
    (``decode_blocks``), ``drain_s`` (seconds; None for each: ask the servers, else the config),
    the ``config_file`` the config came from (None without one), the live display ``progress``
    (auto, rich, lines, off) and ``quiet`` (no progress, no summary table)."""

    model: str | None = None
    block_size: int | None = None
    prefill_blocks: int | None = None
    decode_blocks: int | None = None
    drain_s: float | None = None
    config_file: str | None = None
    progress: str = "auto"
    quiet: bool = False


@dataclass
class WaveServers:
    """What the wave learnt from the servers before it (and what the flags and the config said
    where the servers do not): the served ``model`` name, ``max_model_len`` (tokens),
    ``block_size`` (tokens), usable ``blocks`` per instance, the request ``deadline_s`` and the
    ``drain_s`` (seconds)."""

    model: str
    max_model_len: int | None
    block_size: int | None
    blocks: dict[str, int | None]
    deadline_s: float
    drain_s: float


async def ask_servers(opts: WaveOptions, cfg: RigConfig | None, sc: ScenarioConfig, ps: list[Endpoint],
                      ds: list[Endpoint], known: set[str], http: httpx.AsyncClient) -> WaveServers:
    """Ask the servers what they serve (P's ``/v1/models``, every instance's ``/metrics`` cache
    config); the usable blocks of an instance are the flag's, else its pool less the null block
    (rig.config.blocks.usable_in_pool), else the config's (``known`` names only). Raises
    ConfigError when one does not answer or the prompt does not fit its ``max_model_len``."""
    url = ps[0].url
    try:
        model, mml = await served_model(http, url)
        before = {}
        for e in [*ps, *ds]:
            url = e.url
            before[e.name] = await m.scrape(http, e.url, e.name)
    except (httpx.HTTPError, ValueError, KeyError) as err:
        raise ConfigError(f"cannot reach {url} ({type(err).__name__}: {err}); is `pdrig up` running, "
                          "are the URLs right?") from None
    mml = mml or (cfg.max_model_len if cfg else None)
    if mml is not None and sc.prompt_tokens >= mml:
        raise ConfigError(f"--prompt-tokens {sc.prompt_tokens} must be below the server's max_model_len {mml}")
    block_size = (opts.block_size or cache_info(before[ps[0].name]).get("block_size")
                  or (cfg.block_size if cfg else None))
    blocks = usable_blocks_of(cfg, [e.name for e in [*ps, *ds] if e.name in known]) if cfg else {}
    for e in [*ps, *ds]:
        explicit = opts.prefill_blocks if e in ps else opts.decode_blocks
        if explicit is not None:
            blocks[e.name] = explicit
        elif cache_info(before[e.name]).get("num_gpu_blocks"):
            blocks[e.name] = usable_in_pool(cache_info(before[e.name])["num_gpu_blocks"])
    return WaveServers(opts.model or model, mml, block_size, blocks,
                       sc.deadline_s or (cfg.timeouts.request_s if cfg else 60.0),
                       opts.drain_s or (cfg.timeouts.drain_s if cfg else 40.0))


class WatchedEndpoints:
    """The wave's servers as a :class:`rig.run.lifecycle.Deployment`: deaths, stops and log lines
    from their ``endpoints.json`` entries (rig.observe.endpoint_watch.EndpointWatch); at bare URLs
    nothing is watched and nothing is called dead."""

    def __init__(self, prefills: list[Endpoint], decodes: list[Endpoint], watch: EndpointWatch) -> None:
        self.prefills, self.decodes, self.watch = prefills, decodes, watch

    async def deaths(self, http: httpx.AsyncClient) -> dict[str, int]:
        """The watched instances that are gone (their owner's stops excluded)."""
        probe = ScenarioObservation("", "", "")
        await self.watch.observe(http, probe)
        return probe.dead

    async def observe(self, http: httpx.AsyncClient, obs: ScenarioObservation) -> None:
        """Deaths, stops and the log lines written since the watch started."""
        await self.watch.observe(http, obs)


class AttachedWave:
    """One wave scenario ``sc`` on the attached prefills ``ps`` and decodes ``ds`` (``known``: their
    names the config ``cfg`` describes), reported into ``run_dir`` (see the module docstring)."""

    def __init__(self, sc: ScenarioConfig, cfg: RigConfig | None, ps: list[Endpoint], ds: list[Endpoint],
                 known: set[str], run_dir: Path, opts: WaveOptions) -> None:
        self.sc, self.cfg, self.ps, self.ds, self.known, self.opts = sc, cfg, ps, ds, known, opts
        self.ledger = RunLedger(RunResult(name=f"wave-{sc.kind.removesuffix('-wave')}", run_dir=str(run_dir),
                                          config={}), run_dir)
        self.run_dir = run_dir
        self.asked = False  # the servers answered: from here on the run has a report
        self.verdict: ScenarioVerdict | None = None

    def log(self, msg: str) -> None:
        """A progress line on stderr unless quiet."""
        if not self.opts.quiet:
            print(f"[pdrig wave] {msg}", file=sys.stderr, flush=True)

    def run(self) -> int:
        """Run and report the wave; returns the exit code (0 PASS, 1 FAIL or ERROR, 3 when the run
        broke outside the scenario). Raises ConfigError, leaving no report, when the servers do not
        answer or the prompt does not fit (:func:`ask_servers`); KeyboardInterrupt is re-raised
        after the report (the scenario in flight as ERROR with its partial observation)."""
        t0 = time.monotonic()
        interrupted: BaseException | None = None
        try:
            aio.run(self._run())
        except (KeyboardInterrupt, Exception) as e:
            if not self.asked:  # refused before any request: nothing to report
                raise
            interrupted = self.ledger.stopped(e, "running the wave")
        finally:
            if self.asked:
                self.ledger.result.timings["total"] = time.monotonic() - t0
                self.ledger.finish(self.opts.quiet)
                self._print_checks()
        if interrupted is not None:
            raise interrupted
        return {"passed": 0, "failed": 1}.get(self.ledger.result.status, 3)

    async def _run(self) -> None:
        """:func:`ask_servers`, then the scenario through the ledger on :class:`WatchedEndpoints`."""
        sc, ps, ds, cfg = self.sc, self.ps, self.ds, self.cfg
        watch = EndpointWatch([*ps, *ds])  # logs and pids from endpoints.json (`pdrig up`)
        watch.start()
        http = httpx.AsyncClient(timeout=10.0)
        store = SnapshotStore(self.run_dir)
        try:
            srv = await ask_servers(self.opts, cfg, sc, ps, ds, self.known, http)
            self.asked = True
            self.log(f"{sc.name} -> {self.run_dir} (seed {sc.seed}; P {', '.join(e.url for e in ps)}; "
                     f"D {', '.join(e.url for e in ds)})")
            self.ledger.result.config = {
                "scenario": sc.model_dump(mode="json"), "model": srv.model, "prefill": {e.name: e.url for e in ps},
                "decode": {e.name: e.url for e in ds}, "block_size": srv.block_size,
                "max_model_len": srv.max_model_len, "usable_blocks": srv.blocks, "deadline_s": srv.deadline_s,
                "drain_s": srv.drain_s, "config_file": self.opts.config_file if cfg else None}
            obs = ScenarioObservation(scenario=sc.name, decode=",".join(e.name for e in ds),
                                      prefill=",".join(e.name for e in ps))
            with contextlib.suppress(httpx.HTTPError, ValueError):
                obs.vllm_version = (await http.get(ds[0].url + "/version")).json().get("version", "")
            self.ledger.result.vllm_version = obs.vllm_version

            async def requests(o: ScenarioObservation) -> object:
                wave = await run_wave(sc, srv.model, ps, ds, http, store, self.run_dir / "waves",
                                      deadline_s=srv.deadline_s, usable_blocks=srv.blocks, block_size=srv.block_size,
                                      max_model_len=srv.max_model_len,
                                      progress="off" if self.opts.quiet else self.opts.progress,
                                      explain=explain_stall, **(stall_settings(cfg) if cfg else {}))
                o.error = "" if wave.records else wave.error
                self.log(f"waiting up to {srv.drain_s:g} s for P and D to return to idle")
                return wave

            # Bare URLs: no process to watch, no log to scan; the wave's rule then does not require
            # alive / no-fatal-log / kv-integrity, and says so (rig.judge.wave_checks.judge_wave).
            steps = ScenarioSteps(obs, requests, lambda o, wave: judge_wave(sc, o, wave, unwatched=not watch.watched),  # type: ignore[arg-type]
                                  http, store, srv.drain_s, self.ledger.rig_exception)
            out = await self.ledger.run(sc, WatchedEndpoints(ps, ds, watch), steps)
            self.verdict = out.verdict
            self.ledger.result.timings["wave"] = getattr(out.kind_result, "wall_s", 0.0)
        finally:
            store.close()
            await http.aclose()

    def _print_checks(self) -> None:
        """The verdict's checks under the table, in the words of summary.md and junit.xml (ok /
        FAILED / not checked)."""
        if self.opts.quiet or self.verdict is None:
            return
        for c in self.verdict.checks:
            said = c.detail if c.detail.startswith(c.state) else f"{c.state}: {c.detail}"
            print(f"  {c.name}: {'FAILED' + said[6:] if c.ok is False else said}", file=sys.stderr)


def run_attached_wave(sc: ScenarioConfig, cfg: RigConfig | None, ps: list[Endpoint], ds: list[Endpoint],
                      known: set[str], run_dir: Path, opts: WaveOptions) -> int:
    """:meth:`AttachedWave.run` of the wave; returns its exit code."""
    return AttachedWave(sc, cfg, ps, ds, known, run_dir, opts).run()
