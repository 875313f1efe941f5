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
import json
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rig.config import ConfigError, RigConfig
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


async def _run(args: argparse.Namespace, cfg: RigConfig | None, sc: Any, ps: list[Any], ds: list[Any],
               known: set[str], run_dir: Path) -> int:
    import httpx

    from rig.judge.wave_checks import explain_stall, judge_wave
    from rig.observe import metrics as m
    from rig.observe.drain import check_drains
    from rig.observe.endpoint_watch import EndpointWatch
    from rig.observe.observations import ScenarioObservation, SnapshotStore, TransferEvidence
    from rig.observe.stall import cache_info
    from rig.report.render import RunResult, print_summary, write_report
    from rig.report.wave_section import wave_section
    from rig.workload.waves import run_wave, served_model, stall_settings, usable_blocks_of

    endpoints = ps + ds
    watch = EndpointWatch(endpoints)  # logs and pids from endpoints.json (`pdrig up`)
    watch.start()
    http = httpx.AsyncClient(timeout=10.0)
    store = SnapshotStore(run_dir)
    t0 = time.monotonic()
    try:
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
        model = args.model or model
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
                blocks[e.name] = cache_info(before[e.name])["num_gpu_blocks"] - 1
        deadline = sc.deadline_s or (cfg.timeouts.request_s if cfg else 60.0)
        drain_s = args.drain or (cfg.timeouts.drain_s if cfg else 40.0)
        progress = "off" if args.quiet else args.progress
        if not args.quiet:
            print(f"[pdrig wave] {sc.name} -> {run_dir} (seed {sc.seed}; P {', '.join(e.url for e in ps)}; "
                  f"D {', '.join(e.url for e in ds)})", file=sys.stderr, flush=True)
        wave = await run_wave(sc, model, ps, ds, http, store, run_dir / "waves", deadline_s=deadline,
                              usable_blocks=blocks, block_size=block_size, max_model_len=mml, progress=progress,
                              explain=explain_stall, **(stall_settings(cfg) if cfg else {}))
        after = {}
        for e in ds:
            with contextlib.suppress(httpx.HTTPError):
                after[e.name] = await m.scrape(http, e.url, e.name)
        ev = None
        for e in ds:
            if e.name in after:
                one = TransferEvidence.between(before[e.name], after[e.name])
                ev = one if ev is None else TransferEvidence(**{k: getattr(ev, k) + getattr(one, k)
                                                                 for k in ev.__dict__})
        if not args.quiet:
            print(f"[pdrig wave] waiting up to {drain_s:g} s for P and D to return to idle",
                  file=sys.stderr, flush=True)
        wave.drains = await check_drains(http, endpoints, wave.baseline_kv, drain_s)
        for e in endpoints:
            with contextlib.suppress(httpx.HTTPError):
                store.save(f"{sc.name}-idle", await m.scrape(http, e.url, e.name))
        obs = ScenarioObservation(scenario=sc.name, decode=",".join(e.name for e in ds),
                                  prefill=",".join(e.name for e in ps), evidence=ev, drains=wave.drains,
                                  wall_s=time.monotonic() - t0, error="" if wave.records else wave.error,
                                  timeline=store.rows_of(sc.name))  # counters-monotonic (bug record R12)
        await watch.observe(http, obs)
        with contextlib.suppress(httpx.HTTPError, ValueError):
            obs.vllm_version = (await http.get(ds[0].url + "/version")).json().get("version", "")
        result = RunResult(name=f"wave-{args.kind}", run_dir=str(run_dir), vllm_version=obs.vllm_version,
                           config={"scenario": sc.model_dump(mode="json"), "model": model,
                                   "prefill": {e.name: e.url for e in ps}, "decode": {e.name: e.url for e in ds},
                                   "block_size": block_size, "max_model_len": mml, "usable_blocks": blocks,
                                   "deadline_s": deadline, "drain_s": drain_s,
                                   "config_file": args.config if cfg else None})
        # Bare URLs: no process to watch, no log to scan; the wave's rule then does not require
        # alive / no-fatal-log / kv-integrity, and says so (rig.judge.wave_checks.judge_wave).
        verdict = judge_wave(sc, obs, wave, unwatched=not watch.watched)
        result.extra_sections.append(wave_section(wave, verdict))
        result.observations.append(obs)
        result.verdicts.append(verdict)
        result.timings = {"wave": wave.wall_s, "total": time.monotonic() - t0}
        result.finish_status()
        (run_dir / "waves" / f"{sc.name}.json").parent.mkdir(parents=True, exist_ok=True)
        (run_dir / "waves" / f"{sc.name}.json").write_text(json.dumps(wave.to_json(), indent=1, default=str))
        write_report(result)
        if not args.quiet:
            print_summary(result)
            for c in verdict.checks:  # the words of summary.md and junit.xml: ok / FAILED / not checked
                said = c.detail if c.detail.startswith(c.state) else f"{c.state}: {c.detail}"
                print(f"  {c.name}: {'FAILED' + said[6:] if c.ok is False else said}", file=sys.stderr)
        return 0 if verdict.verdict == "PASS" else 1
    finally:
        store.close()
        await http.aclose()


def cmd_wave(args: argparse.Namespace) -> int:
    """Run the wave; exit 0 on PASS, 1 on FAIL/ERROR (ConfigError -> 2 via pdrig's main)."""
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

