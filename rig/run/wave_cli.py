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
Exit code 0 when the wave passes, 1 when it fails, 2 for bad arguments or unreachable servers, 3
when the run broke outside the scenario (a rig bug: its traceback in rig-traceback.txt), 130 on
Ctrl-C (the report is written first, the wave as ERROR with what it observed so far).

The wave runs as a one-scenario suite on the attached servers (rig/run/wave_run.py): the same
lifecycle and bookkeeping as every suite scenario (rig.run.lifecycle, rig.run.ledger); this module
is the command line only.

Wire-up in rig/cli.py ``build_parser``: ``from rig.run.wave_cli import add_wave_parser; add_wave_parser(sub)``.
"""

from __future__ import annotations

import argparse
import math
import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rig.config import ConfigError, RigConfig
from rig.config.endpoints_file import by_role, read_endpoints
from rig.config.help import DEFAULT_CONFIG, config_path
from rig.run.hostruns import RUN_MARKER_FILE, make_run_dir


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
    from rig.run.wave_run import WaveOptions, run_attached_wave

    opts = WaveOptions(model=args.model, block_size=args.block_size, prefill_blocks=args.prefill_blocks,
                       decode_blocks=args.decode_blocks, drain_s=args.drain, config_file=args.config,
                       progress=args.progress, quiet=args.quiet)
    try:
        return run_attached_wave(sc, cfg, ps, ds, known, run_dir, opts)
    except ConfigError:
        # Refused before any request (servers unreachable, bad prompt length): a directory this
        # command created holds nothing worth keeping, so it does not stay behind empty.
        if created and not any(f.is_file() and f.stat().st_size and f.name != RUN_MARKER_FILE
                               for f in run_dir.rglob("*")):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise

