"""``pdrig wave prefix|pressure``: a prefix or pressure wave against servers that are already up.

    pdrig up --config configs/cpu-tiny.yaml --instances prefill,decode-6blk     # terminal 1
    pdrig wave pressure --endpoints runs/<dir>/endpoints.json --requests 500    # terminal 2
    pdrig wave prefix --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8201 \\
        --groups 8 --per-group 16 --prefix-tokens 40 --prompt-tokens 56

No process is started. Endpoints come from ``endpoints.json`` (written by ``pdrig up``) or from
``--prefill``/``--decode`` URLs (repeatable: requests go round robin). ``endpoints.json`` also
gives each instance's log path and pid: the wave scans the logs written meanwhile and checks that
the processes live (alive, no-fatal-log, kv-integrity), and tells an instance ``pdrig up`` stopped
from one that died. At bare URLs those three checks are "not checked" and not required; the
checks and the verdict's reason say so. The config (``--config``,
default configs/cpu-tiny.yaml, optional) supplies what the servers cannot be asked: usable KV
blocks per instance (matched by name, or by port for bare URLs), block size and
``max_model_len`` when ``/metrics`` and ``/v1/models`` do not say, and the run root. The served
model name is read from P's ``/v1/models``.

Output: a run directory (``runs/<stamp>-wave-<kind>``) with summary.md, report.json, junit.xml,
``waves/<name>-records.jsonl``, ``waves/<name>-timeline.png`` and ``metrics/timeline.jsonl``.
Exit code 0 when the wave passes, 1 when it fails, 2 for bad arguments or unreachable servers.

Wire-up in rig/cli.py ``build_parser``: ``from rig.run.wave_cli import add_wave_parser; add_wave_parser(sub)``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rig.config import ConfigError, RigConfig
from rig.config.blocks import usable_in_pool
from rig.config.endpoints_file import by_role, read_endpoints
from rig.config.help import DEFAULT_CONFIG, config_path
from rig.run.hostruns import RUN_MARKER_FILE, make_run_dir
from rig.transport import aio


def add_wave_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``wave`` subcommand to ``pdrig``'s subparsers; returns its parser."""
    p = subparsers.add_parser(
        "wave", help="run a prefix or pressure wave against running P/D servers (no process is started)",
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=["prefix", "pressure"], help="prefix: shared-prefix groups; pressure: many requests")
    src = p.add_argument_group("servers")
    src.add_argument("--endpoints", metavar="FILE", help="endpoints.json written by `pdrig up`")
    src.add_argument("--prefill", action="append", default=[], metavar="URL", help="P base URL (repeatable)")
    src.add_argument("--decode", action="append", default=[], metavar="URL", help="D base URL (repeatable)")
    src.add_argument("--config", "-c", default=DEFAULT_CONFIG, type=config_path,
                     help=f"rig config for block counts, block size, max_model_len "
                          f"(default {DEFAULT_CONFIG}; optional)")
    src.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                     help="override a config field (repeatable)")
    src.add_argument("--model", help="served model name (default: read from P's /v1/models)")
    src.add_argument("--block-size", type=int, help="KV block size in tokens (default: /metrics, else config)")
    src.add_argument("--prefill-blocks", type=int, help="usable KV blocks of every P (default: config/metrics)")
    src.add_argument("--decode-blocks", type=int, help="usable KV blocks of every D (default: config/metrics)")
    w = p.add_argument_group("wave")
    w.add_argument("--requests", "-n", type=int, help="pressure: number of requests (default 2048)")
    w.add_argument("--concurrency", "-C", type=int, help="requests in flight (default 64; prefix 8)")
    w.add_argument("--cancel-fraction", "-X", type=float,
                   help="fraction cancelled on purpose (default pressure 0.1, prefix 0)")
    w.add_argument("--cancel-points", help="comma list of before-prefill,between,during-decode (default all)")
    w.add_argument("--prompt-tokens", type=int, help="prompt length in tokens (default 48)")
    w.add_argument("--max-tokens", type=int, help="completion tokens (default 8)")
    w.add_argument("--groups", "-G", type=int, help="prefix: groups (default 4)")
    w.add_argument("--per-group", "-N", type=int, help="prefix: requests per group (default 8)")
    w.add_argument("--prefix-tokens", "-K", type=int, help="prefix: shared prefix tokens (default 32)")
    w.add_argument("--stream", choices=["always", "never", "mixed"], help="stream D's answer (default mixed)")
    w.add_argument("--parity-fraction", type=float, help="share compared with a direct request to P (default 0.1)")
    w.add_argument("--client", choices=["aiohttp", "httpx", "fast"], help="HTTP client of the engine (default fast)")
    w.add_argument("--deadline", type=float, help="seconds per request, both hops (default timeouts.request_s)")
    w.add_argument("--drain", type=float, help="seconds to return to idle afterwards (default timeouts.drain_s)")
    w.add_argument("--seed", type=int, help="prompt seed (default: new each run, so P's cache starts cold)")
    w.add_argument("--sample-interval", type=float, help="metrics sampling period in s (default 1)")
    w.add_argument("--name", help="scenario name (default prefix-wave / pressure-wave)")
    o = p.add_argument_group("output")
    o.add_argument("--run-dir", help="output directory (default <run_root>/<stamp>-wave-<kind>)")
    o.add_argument("--progress", choices=["auto", "rich", "lines", "off"], default="auto",
                   help="live display: rich on a TTY, plain lines otherwise (default auto)")
    o.add_argument("--quiet", action="store_true", help="no progress, no summary table")
    p.set_defaults(func=cmd_wave)
    return p


def _load_config(args: argparse.Namespace) -> RigConfig | None:
    from rig.config import load_config

    if not Path(args.config).is_file():
        if args.config != config_path(DEFAULT_CONFIG) or args.overrides:
            raise ConfigError(f"--config {args.config!r} not found")
        return None
    return load_config(args.config, args.overrides)


def _endpoints(args: argparse.Namespace, cfg: RigConfig | None) -> tuple[list[Any], list[Any], set[str]]:
    """(prefills, decodes, names known to the config) from --endpoints or the URLs.

    ``endpoints.json`` names are the config's instance names; a bare URL gets the name of the
    config instance on its port, else ``prefill``/``decode`` (``-2``, ... for several), which
    is then *not* looked up in the config (its block count would belong to another server).
    """
    from rig.transport.endpoint import Endpoint

    if args.endpoints:
        if args.prefill or args.decode:
            raise ConfigError("give either --endpoints or --prefill/--decode, not both")
        entries = read_endpoints(args.endpoints)
        ps = [Endpoint(n, v.url, v.log, v.pid) for n, v in by_role(entries, "prefill")]
        ds = [Endpoint(n, v.url, v.log, v.pid) for n, v in by_role(entries, "decode")]
        known = {e.name for e in ps + ds}
    else:
        by_port = {i.port: i.name for _, i in cfg.instances()} if cfg else {}
        known = set()

        def named(urls: list[str], role: str) -> list[Endpoint]:
            out = []
            for k, u in enumerate(urls):
                u = u.rstrip("/")
                parts = urlsplit(u)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    raise ConfigError(f"--{role} {u!r}: expected a base URL like http://127.0.0.1:8100")
                name = by_port.get(parts.port or 80)
                if name:
                    known.add(name)
                else:
                    name = role if len(urls) == 1 else f"{role}-{k + 1}"
                out.append(Endpoint(name, u))
            return out

        ps, ds = named(args.prefill, "prefill"), named(args.decode, "decode")
    if not ps or not ds:
        raise ConfigError("a wave needs at least one prefill and one decode: --endpoints "
                          "runs/<dir>/endpoints.json (from `pdrig up`) or --prefill URL --decode URL")
    names = [e.name for e in ps + ds]
    if len(set(names)) != len(names):
        raise ConfigError(f"endpoint names repeat: {names}")
    return ps, ds, known


def build_scenario(args: argparse.Namespace, cfg: RigConfig | None) -> Any:
    """The ScenarioConfig of the wave from the arguments (pydantic validation -> ConfigError)."""
    from pydantic import ValidationError

    from rig.config import ScenarioConfig

    kind = f"{args.kind}-wave"
    wave: dict[str, Any] = {}
    for arg, key in (("requests", "requests"), ("concurrency", "concurrency"), ("cancel_fraction", "cancel_fraction"),
                     ("groups", "groups"), ("per_group", "per_group"), ("prefix_tokens", "prefix_tokens"),
                     ("stream", "stream"), ("parity_fraction", "parity_fraction"), ("client", "client"),
                     ("sample_interval", "sample_interval_s")):
        if getattr(args, arg) is not None:
            wave[key] = getattr(args, arg)
    if args.cancel_points:
        wave["cancel_points"] = [c.strip() for c in args.cancel_points.split(",") if c.strip()]
    wave.setdefault("cancel_fraction", 0.1 if args.kind == "pressure" else 0.0)
    wave.setdefault("concurrency", 64 if args.kind == "pressure" else 8)
    data: dict[str, Any] = {"name": args.name or kind, "kind": kind, "wave": wave,
                            "seed": args.seed if args.seed is not None else time.time_ns() % (1 << 31)}
    if args.prompt_tokens is not None:
        data["prompt_tokens"] = args.prompt_tokens
    if args.max_tokens is not None:
        data["max_tokens"] = args.max_tokens
    if args.deadline is not None:
        data["deadline_s"] = args.deadline
    try:
        sc = ScenarioConfig.model_validate(data)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'wave'}: {err['msg'].removeprefix('Value error, ')}"
                         for err in e.errors())
        raise ConfigError(f"pdrig wave {args.kind}: {msgs}") from None
    return sc


@dataclass
class WaveServers:
    """What the wave learnt from the servers before it (and what the arguments and the config
    said where the servers do not): the served ``model`` name, ``max_model_len`` (tokens),
    ``block_size`` (tokens), usable ``blocks`` per instance, the request ``deadline_s`` and the
    ``drain_s`` (seconds)."""

    model: str
    max_model_len: int | None
    block_size: int | None
    blocks: dict[str, int | None]
    deadline_s: float
    drain_s: float


async def _servers(args: argparse.Namespace, cfg: RigConfig | None, sc: Any, ps: list[Any], ds: list[Any],
                   known: set[str], http: Any) -> WaveServers:
    """Ask the servers what they serve (``/v1/models``, ``/metrics``' cache config); ConfigError
    when one does not answer or the prompt does not fit its ``max_model_len``."""
    import httpx

    from rig.observe import metrics as m
    from rig.observe.stall import cache_info
    from rig.workload.waves import served_model, usable_blocks_of

    endpoints = ps + ds
    url = ps[0].url
    try:
        model, mml = await served_model(http, url)
        before = {}
        for e in endpoints:
            url = e.url
            before[e.name] = await m.scrape(http, e.url, e.name)
    except (httpx.HTTPError, ValueError, KeyError) as err:
        raise ConfigError(f"cannot reach {url} ({type(err).__name__}: {err}); is `pdrig up` running, "
                          "are the URLs right?") from None
    mml = mml or (cfg.max_model_len if cfg else None)
    if mml is not None and sc.prompt_tokens >= mml:
        raise ConfigError(f"--prompt-tokens {sc.prompt_tokens} must be below the server's max_model_len {mml}")
    info = cache_info(before[ps[0].name])
    block_size = args.block_size or info.get("block_size") or (cfg.block_size if cfg else None)
    blocks = usable_blocks_of(cfg, [e.name for e in endpoints if e.name in known]) if cfg else {}
    for e in endpoints:
        explicit = args.prefill_blocks if e in ps else args.decode_blocks
        if explicit is not None:
            blocks[e.name] = explicit
        elif cache_info(before[e.name]).get("num_gpu_blocks"):
            blocks[e.name] = usable_in_pool(cache_info(before[e.name])["num_gpu_blocks"])
    return WaveServers(args.model or model, mml, block_size, blocks,
                       sc.deadline_s or (cfg.timeouts.request_s if cfg else 60.0),
                       args.drain or (cfg.timeouts.drain_s if cfg else 40.0))


def _raise(scenario: str, doing: str, e: Exception) -> str:
    """A rig bug in ``pdrig wave`` is not a verdict: the command fails with its traceback."""
    raise e


async def _run(args: argparse.Namespace, cfg: RigConfig | None, sc: Any, ps: list[Any], ds: list[Any],
               known: set[str], run_dir: Path) -> int:
    """The wave as a one-scenario run on the attached servers: :func:`_servers`, then
    :func:`rig.run.lifecycle.run_scenario` (snapshots, transfer evidence, drains, deaths and log
    lines through the endpoints' watch, the verdict) and the report; returns the exit code."""
    import httpx

    from rig.judge.wave_checks import explain_stall, judge_wave
    from rig.observe.endpoint_watch import EndpointWatch
    from rig.observe.observations import ScenarioObservation, SnapshotStore
    from rig.report.build import RunResult, print_summary, write_report
    from rig.run.lifecycle import ScenarioSteps, run_scenario
    from rig.workload.waves import run_wave, stall_settings

    watch = EndpointWatch(ps + ds)  # logs and pids from endpoints.json (`pdrig up`)
    watch.start()
    http = httpx.AsyncClient(timeout=10.0)
    store = SnapshotStore(run_dir)
    t0 = time.monotonic()
    try:
        srv = await _servers(args, cfg, sc, ps, ds, known, http)
        if not args.quiet:
            print(f"[pdrig wave] {sc.name} -> {run_dir} (seed {sc.seed}; P {', '.join(e.url for e in ps)}; "
                  f"D {', '.join(e.url for e in ds)})", file=sys.stderr, flush=True)

        async def run(obs: ScenarioObservation) -> object:
            wave = await run_wave(sc, srv.model, ps, ds, http, store, run_dir / "waves", deadline_s=srv.deadline_s,
                                  usable_blocks=srv.blocks, block_size=srv.block_size, max_model_len=srv.max_model_len,
                                  progress="off" if args.quiet else args.progress, explain=explain_stall,
                                  **(stall_settings(cfg) if cfg else {}))
            obs.error = "" if wave.records else wave.error
            if not args.quiet:
                print(f"[pdrig wave] waiting up to {srv.drain_s:g} s for P and D to return to idle",
                      file=sys.stderr, flush=True)
            return wave

        # Bare URLs: no process to watch, no log to scan; the wave's rule then does not require
        # alive / no-fatal-log / kv-integrity, and says so (rig.judge.wave_checks.judge_wave).
        steps = ScenarioSteps(run, lambda obs, wave: judge_wave(sc, obs, wave, unwatched=not watch.watched),  # type: ignore[arg-type]
                              http, store, srv.drain_s, _raise)
        obs = ScenarioObservation(scenario=sc.name, decode=",".join(e.name for e in ds),
                                  prefill=",".join(e.name for e in ps))
        with contextlib.suppress(httpx.HTTPError, ValueError):
            obs.vllm_version = (await http.get(ds[0].url + "/version")).json().get("version", "")
        out = await run_scenario(sc, WatchedEndpoints(ps, ds, watch), steps, obs)
        wave = out.kind_result
        result = RunResult(name=f"wave-{args.kind}", run_dir=str(run_dir), vllm_version=obs.vllm_version,
                           config={"scenario": sc.model_dump(mode="json"), "model": srv.model,
                                   "prefill": {e.name: e.url for e in ps}, "decode": {e.name: e.url for e in ds},
                                   "block_size": srv.block_size, "max_model_len": srv.max_model_len,
                                   "usable_blocks": srv.blocks, "deadline_s": srv.deadline_s, "drain_s": srv.drain_s,
                                   "config_file": args.config if cfg else None})
        result.add(sc.kind, out.observation, out.verdict, wave)
        result.timings = {"wave": getattr(wave, "wall_s", 0.0), "total": time.monotonic() - t0}
        result.finish_status()
        write_report(result)
        if not args.quiet:
            print_summary(result)
            for c in out.verdict.checks:  # the words of summary.md and junit.xml: ok / FAILED / not checked
                said = c.detail if c.detail.startswith(c.state) else f"{c.state}: {c.detail}"
                print(f"  {c.name}: {'FAILED' + said[6:] if c.ok is False else said}", file=sys.stderr)
        return 0 if out.verdict.verdict == "PASS" else 1
    finally:
        store.close()
        await http.aclose()


class WatchedEndpoints:
    """The wave's servers as a :class:`rig.run.lifecycle.Deployment`: deaths, stops and log lines
    from their ``endpoints.json`` entries (rig.observe.endpoint_watch.EndpointWatch); at bare URLs
    nothing is watched and nothing is called dead."""

    def __init__(self, prefills: list[Any], decodes: list[Any], watch: Any) -> None:
        self.prefills, self.decodes, self.watch = prefills, decodes, watch

    async def deaths(self, http: Any) -> dict[str, int]:
        """The watched instances that are gone (their owner's stops excluded)."""
        from rig.observe.observations import ScenarioObservation

        probe = ScenarioObservation("", "", "")
        await self.watch.observe(http, probe)
        return probe.dead

    async def observe(self, http: Any, obs: Any) -> None:
        """Deaths, stops and the log lines written since the watch started."""
        await self.watch.observe(http, obs)


def _check_numbers(args: argparse.Namespace) -> None:
    """Raise ConfigError naming the first of ``--block-size`` / ``--prefill-blocks`` /
    ``--decode-blocks`` (whole numbers >= 1), ``--drain`` (finite seconds >= 0) or ``--seed``
    (>= 0) that is out of range, before any folder or request."""
    for flag, value in (("--block-size", args.block_size), ("--prefill-blocks", args.prefill_blocks),
                        ("--decode-blocks", args.decode_blocks)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value}: give a whole number >= 1 (or leave it out: /metrics, else the config)")
    if args.drain is not None and not (math.isfinite(args.drain) and args.drain >= 0):
        raise ConfigError(f"--drain {args.drain}: give finite seconds >= 0 (or leave it out: timeouts.drain_s)")
    if args.seed is not None and args.seed < 0:
        raise ConfigError(f"--seed {args.seed}: give a whole number >= 0")


def _check_urls(urls: list[str], flag: str) -> None:
    """Raise ConfigError for a URL of ``urls`` whose port is not 1-65535."""
    for u in urls or []:
        try:
            port = urlsplit(u).port
        except ValueError:
            raise ConfigError(f"{flag} {u[:120]!r}: its port is not 1-65535; give http://HOST:PORT") from None
        if port == 0:
            raise ConfigError(f"{flag} {u[:120]!r}: port 0 is not a TCP port; give 1-65535")


def cmd_wave(args: argparse.Namespace) -> int:
    """Run the wave; exit 0 on PASS, 1 on FAIL/ERROR (ConfigError -> 2 via pdrig's main)."""
    _check_numbers(args)
    _check_urls(args.prefill, "--prefill")
    _check_urls(args.decode, "--decode")
    cfg = _load_config(args)
    ps, ds, known = _endpoints(args, cfg)
    sc = build_scenario(args, cfg)
    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        base = Path(cfg.run_root if cfg else "runs") / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-wave-{args.kind}"
        run_dir, n = base, 1
        while run_dir.exists():
            n += 1
            run_dir = base.with_name(f"{base.name}-{n}")
    created = not run_dir.exists()
    if created:  # with the marker `pdrig clean` looks for
        make_run_dir(run_dir, "--run-dir" if args.run_dir else "run_root")
    elif not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir}: is a file, not a folder; give a folder")
    try:
        return aio.run(_run(args, cfg, sc, ps, ds, known, run_dir))
    except ConfigError:
        # Refused before any request (servers unreachable, bad prompt length): a directory this
        # command created holds nothing worth keeping, so it does not stay behind empty.
        if created and not any(f.is_file() and f.stat().st_size and f.name != RUN_MARKER_FILE
                               for f in run_dir.rglob("*")):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise

