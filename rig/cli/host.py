"""The commands about this host and the processes on it: ``pdrig ps``, ``pdrig clean``, ``pdrig proxy``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rig.cli.args import config_args, finite, port
from rig.config import load_config
from rig.errors import ConfigError


def cmd_ps(args: argparse.Namespace) -> int:
    """List this host's live runs (run directory, pid, instances, ports, age) from the port locks."""
    from rig.run.hostruns import live_runs, ps_lines

    cfg = load_config(args.config, args.overrides)
    if Path(cfg.ports.lock_dir).exists() and not Path(cfg.ports.lock_dir).is_dir():
        raise ConfigError(f"ports.lock_dir: {cfg.ports.lock_dir} is a file, not a folder; give the folder the "
                          "runs' port locks are in (--set ports.lock_dir=DIR)")
    runs = live_runs(cfg.ports.lock_dir)
    if runs is None:
        print("pdrig: cannot read /proc/locks: which runs are live is unknown", file=sys.stderr)
        return 3
    print("\n".join(ps_lines(runs)))
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    """Remove the rig's stale port lock files and empty run directories (never a live run's, never
    what the rig cannot prove it made: those are listed as kept)."""
    from rig.run.hostruns import clean

    cfg = load_config(args.config, args.overrides)
    for field, path in (("ports.lock_dir", cfg.ports.lock_dir), ("run_root", cfg.run_root)):
        if Path(path).exists() and not Path(path).is_dir():
            raise ConfigError(f"{field}: {path} is a file, not a folder; give the folder the runs use "
                              f"(--set {field}=DIR)")
    done = clean(cfg.ports.lock_dir, cfg.run_root, args.min_age_s)
    if done is None:
        print("pdrig: cannot read /proc/locks: nothing removed (which runs are live is unknown)", file=sys.stderr)
        return 3
    print(f"removed {len(done.ports)} stale lock files from {cfg.ports.lock_dir}"
          + (f" (ports {', '.join(map(str, done.ports))})" if done.ports else "")
          + f" and {len(done.dirs)} empty run directories from {cfg.run_root}"
          + (": " + ", ".join(d.name for d in done.dirs) if done.dirs else ""))
    for kept, why in done.kept:
        print(f"kept {kept}: {why}")
    return 0


def cmd_proxy(args: argparse.Namespace) -> int:
    """Serve the OpenAI-compatible P/D proxy (rig/proxy.py) until Ctrl-C."""
    from rig.proxy import PDProxy, endpoints_from_file, serve
    from rig.transport import aio

    try:
        if args.endpoints:
            pre, dec = endpoints_from_file(args.endpoints)
        else:
            pre = [(f"prefill-{i}", u) for i, u in enumerate(args.prefill or [])]
            dec = [(f"decode-{i}", u) for i, u in enumerate(args.decode or [])]
        proxy = PDProxy(pre, dec, args.policy, timeout_s=args.timeout)
    except ValueError as e:
        raise ConfigError(f"proxy: {e} (give --endpoints F, or --prefill URL and --decode URL)") from None
    banner = (f"pdrig proxy on http://{args.host}:{args.port}  ({args.policy}) prefill: "
              f"{', '.join(u for _, u in pre)}  decode: {', '.join(u for _, u in dec)}")

    async def until_signal() -> None:
        # Signals end the loop cleanly here: the CLI's KeyboardInterrupt handlers, raised inside
        # a transport callback, would be swallowed by the event loop.
        import asyncio
        import signal
        import threading

        stop, loop, listening = asyncio.Event(), asyncio.get_running_loop(), threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        server = asyncio.create_task(serve(proxy, args.host, args.port, started=listening, stop=stop))
        while not listening.is_set() and not server.done():
            await asyncio.sleep(0.01)
        if listening.is_set():  # said once the port is bound: a refused bind is the only line
            print(banner, file=sys.stderr, flush=True)
        await server
    try:
        aio.run(until_signal())
    except OSError as e:  # the bind: the port is taken, or the host is not an address of this machine
        raise ConfigError(f"proxy --host {args.host} --port {args.port}: cannot listen there "
                          f"({e.strerror or e}); give a free port (`pdrig ps` lists the rig's runs)") from None
    return 0


def add_ps(sub) -> None:
    """Register ``pdrig ps`` (live runs)."""
    p = sub.add_parser("ps", help="list this host's live runs (run directory, pid, instances, ports, age)")
    config_args(p)  # its ports.lock_dir
    p.set_defaults(func=cmd_ps)


def add_clean(sub) -> None:
    """Register ``pdrig clean`` (what dead runs left)."""
    p = sub.add_parser("clean", help="remove stale port lock files and empty run directories (never a live run's)")
    config_args(p)  # its ports.lock_dir and run_root
    p.add_argument("--min-age-s", type=finite(0), default=600.0,
                   help="only remove empty run directories older than this (default 600: a run just "
                        "starting may not have written anything yet)")
    p.set_defaults(func=cmd_clean)


def add_proxy(sub) -> None:
    """Register ``pdrig proxy`` (the P/D proxy)."""
    p = sub.add_parser("proxy", help="OpenAI-compatible P/D proxy in front of running instances")
    p.add_argument("--endpoints", help="endpoints.json of a `pdrig up` run directory")
    p.add_argument("--prefill", action="append", metavar="URL", help="a prefill instance (repeatable)")
    p.add_argument("--decode", action="append", metavar="URL", help="a decode instance (repeatable)")
    p.add_argument("--policy", default="round-robin", choices=["round-robin", "least-outstanding"],
                   help="how each hop picks its instance")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--timeout", type=finite(0.001), default=600.0,
                   help="seconds an upstream may stay silent (504 after)")
    p.set_defaults(func=cmd_proxy)
