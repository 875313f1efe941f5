"""The commands that show, start or render a deployment: ``pdrig plan``, ``config``, ``build-model``,
``up``, ``compose``, ``k8s``, ``schema``."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from dataclasses import asdict
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING

from rig.cli.args import check_folders, config_args, output_dir, output_file, port, write_output
from rig.config import RigConfig, load_config
from rig.config.deployment import DNS_LABEL, IMAGE_REF, LABEL_WORDS, k8s_name_problem
from rig.config.files import cut
from rig.errors import ClusterError, ConfigError

if TYPE_CHECKING:
    from rig.cluster.processes import Cluster

# The commands' heavy imports (the cluster, the plan, the report model, httpx) are inside them:
# refusing a bad flag or file costs only the config's import (rig/cli/__init__.py, ELSEWHERE).


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the plan (no process is started, no model built)."""
    cfg = load_config(args.config, args.overrides)  # first: a refusal imports no cluster machinery
    from rig.cluster import mooncake
    from rig.cluster.preflight import cpu_problem
    from rig.cluster.probes import busy_ports
    from rig.plan.processes import LAYOUT_WORDS, build_plan
    from rig.run.runner import resolve_model

    plan = build_plan(cfg, Path(cfg.run_root) / "<timestamp>-" f"{cfg.name}", resolve_model(cfg, build=False),
                      sys.executable, mooncake.master_binary(cfg))
    if args.json:
        print(json.dumps(asdict(plan), indent=1))
        return 0
    other = " or ".join(f"--set launch.layout={lay}" for lay in LAYOUT_WORDS if lay != plan.layout)
    print(f"# launch.layout: {plan.layout}: {LAYOUT_WORDS[plan.layout]}; {other} for another\n")
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
    cfg = check_folders(load_config(args.config, args.overrides))
    from rig.run.runner import resolve_model

    print(resolve_model(cfg))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    """Start instances (default: :func:`rig.run.topology.default_instances`, the pair a manual wave
    needs), warm every P->D pair up as `e2e` does, write ``endpoints.json``, and keep them up
    until Ctrl-C or a death (exit 1). The config's ports stay reserved meanwhile (rig/cluster/ports.py)."""
    cfg = check_folders(load_config(args.config, args.overrides))  # first: a refusal imports no cluster machinery
    from rig.cluster import mooncake
    from rig.cluster.builds import launch_vllm_version
    from rig.cluster.ports import reserve
    from rig.cluster.preflight import preflight
    from rig.cluster.probes import bindable
    from rig.cluster.processes import Cluster
    from rig.connectors.mooncake import MASTER_ROLE
    from rig.plan.processes import build_plan
    from rig.run.runner import new_run_dir, resolve_model
    from rig.run.topology import default_instances, parse_instances
    from rig.transport import aio

    preflight(cfg)
    engines, why = (parse_instances(cfg, args.instances), "as given by --instances") if args.instances \
        else default_instances(cfg)
    if args.proxy is not None and not bindable(args.proxy, "127.0.0.1"):  # before any server starts
        raise ConfigError(f"--proxy {args.proxy}: the port is in use on 127.0.0.1; give a free port")
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
            print(f"warmed up in {warm_s:.1f} s (a direct request to each instance, one P/D round trip per decode, "
                  "then 3 timed ones: its per-request baseline)")
            _up_proxy(args, plan, names, cluster)  # --proxy: a daemon thread of this process
            print(f"endpoints: {run_dir / 'endpoints.json'}; Ctrl-C stops everything", flush=True)
            while not cluster.dead():
                time.sleep(1)
            print(f"a process died: {cluster.dead()}", file=sys.stderr)
            return 1


async def _warm_up_pairs(cfg: RigConfig, cluster: Cluster, engines: list[str]) -> None:
    """:func:`rig.workload.warmup.warm_up` from the first started prefill to every started decode,
    then that decode's per-request baseline (:func:`rig.workload.baseline.baseline_after_warmup`,
    seconds), printed: what a scenario's P/D request costs on this deployment. Raises nothing for a
    failed request (logged)."""
    import httpx

    from rig.transport.client import AiohttpTransport
    from rig.transport.endpoint import Endpoint
    from rig.workload.baseline import baseline_after_warmup
    from rig.workload.warmup import WarmupWatch, warm_up

    prefills = [n for n in engines if n in {p.name for p in cfg.prefill}]
    decodes = [n for n in engines if n in {d.name for d in cfg.decode}]
    client = AiohttpTransport(cfg.model.served_name, timeout_s=max(cfg.timeouts.request_s, 5.0))
    async with httpx.AsyncClient(timeout=10.0) as http:
        try:
            for d in decodes:
                p_ep, d_ep = Endpoint(prefills[0], cluster.url(prefills[0])), Endpoint(d, cluster.url(d))
                watch = WarmupWatch(cluster.cpu_s, cluster.exit_code, cfg.timeouts.warmup_s)
                await warm_up(client, http, p_ep, d_ep, lambda msg: print(msg, file=sys.stderr), watch)
                b = await baseline_after_warmup(client, p_ep, d_ep, watch)
                print(f"per-request baseline of {d}: {b.describe()}", file=sys.stderr)
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


def cmd_compose(args: argparse.Namespace) -> int:
    """Render docker-compose.yml from the config (rig/plan/compose.py) and the files it mounts.

    Only the instances of one P/D pair (``--instances``, default
    :func:`rig.run.topology.default_instances`) plus a Mooncake master if the config has one. The run
    directory (``--run-dir``, default ``<run_root>/compose-<config name>``) is mounted for logs
    and connector files and receives ``docker-compose.yml`` (``-o`` to put it elsewhere) and
    ``instances`` (the rendered names, for ``pdrig e2e --attach --instances``).
    """
    cfg = check_folders(load_config(args.config, args.overrides))  # first: a refusal imports no plan machinery
    from rig.plan import compose
    from rig.run.runner import resolve_model
    from rig.run.topology import default_instances, parse_instances

    engines, why = (parse_instances(cfg, args.instances), "as given by --instances") if args.instances \
        else default_instances(cfg)
    plan = compose.container_plan(cfg, engines)
    run_dir = output_dir(Path(args.run_dir or Path(cfg.run_root) / f"compose-{cfg.name}").resolve(),
                         "--run-dir" if args.run_dir else "run_root")
    if args.output and args.output != "-":
        output_file(args.output, "-o")
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
    write_output(out, text, "-o" if args.output else "--run-dir", args.config)
    print(f"wrote {out}: {', '.join(p.name for p in plan.processes)} ({why}); image {image} "
          f"(build it first: docker/README.md); logs and files under {run_dir}")
    return 0


def _check_k8s_names(namespace: str, image: str | None) -> None:
    """Raise ConfigError naming the flag when ``-n`` is not a Kubernetes namespace name (a DNS-1123
    label) or ``--image`` is not an image reference; checked before the config is read."""
    for flag, value, pattern, words in (("-n/--namespace", namespace, DNS_LABEL, f"a namespace: {LABEL_WORDS}"),
                                        ("--image", image, IMAGE_REF, "an image reference (letters, digits and "
                                                                      "._/:@+-, e.g. registry/pdrig:cpu)")):
        problem = None if value is None else k8s_name_problem(value, pattern, words)
        if problem:
            raise ConfigError(f"{flag} {cut(problem, 200)}")


def _check_rendered_names(docs: list[dict]) -> None:
    """Raise ConfigError naming the object when a rendered object's name is not a DNS-1123 label of
    at most 63 characters (Services, Jobs and pods' host names must be; ``pdrig-<run id>-<instance>``
    can outgrow it with a long instance name)."""
    for doc in docs:
        name = doc.get("metadata", {}).get("name", "")
        if not re.fullmatch(DNS_LABEL, name):
            raise ConfigError(f"k8s: the {doc.get('kind')} name {cut(name, 100)!r} would be longer than the 63 "
                              "characters Kubernetes allows (pdrig-<run id>-<instance>): shorten the instance names "
                              "or --run-id")


def cmd_k8s(args: argparse.Namespace) -> int:
    """Render the config's plan as Kubernetes manifests (rig/plan/k8s.py) to stdout or ``-o FILE``.
    Every name is checked against Kubernetes' rules first (namespace, image, run id, the rendered
    objects' names), so nothing is written that ``kubectl apply`` would refuse."""
    from datetime import datetime

    from rig.plan import k8s

    _check_k8s_names(args.namespace, args.image)
    if args.output != "-":
        output_file(args.output, "-o")
    cfg = load_config(args.config, args.overrides)
    run_id = args.run_id or datetime.now(UTC).strftime("r%m%d-%H%M%S")
    _check_rendered_names(k8s.render_k8s(cfg, run_id, args.namespace, args.image))
    text = k8s.k8s_yaml(cfg, run_id, args.namespace, args.image)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        write_output(args.output, text, "-o", args.config)
        print(f"wrote {args.output} (run id {run_id}, namespace {args.namespace}); "
              f"kubectl apply -f {args.output} && kubectl logs -f job/pdrig-{run_id}-suite", file=sys.stderr)
    return 0


def all_schemas() -> dict[str, dict]:
    """File name -> JSON Schema of every YAML the rig reads: profiles and suites
    (rig/config/schema.py) and the builds file (``rig.cluster.builds.BuildsFile``); and of the
    report.json every run writes (``rig.report.model.Report``) and the explore.json every
    exploration writes (``rig.report.explore_model.ExploreReport``)."""
    from rig.cluster.builds import BuildsFile
    from rig.config.schema import schemas
    from rig.report.explore_model import ExploreReport
    from rig.report.model import Report

    builds = BuildsFile.model_json_schema()
    spec = builds.get("$defs", {}).get("BuildSpec", {})
    # A build's name is its key in the file (BuildsFile fills it in), never written in the entry.
    spec["required"] = [f for f in spec.get("required", []) if f != "name"]
    draft = "https://json-schema.org/draft/2020-12/schema"
    return {**schemas(), "builds.schema.json": {"$schema": draft, "title": "pdrig builds", **builds},
            "report.schema.json": {"$schema": draft, **Report.model_json_schema()},
            "explore-report.schema.json": {"$schema": draft, **ExploreReport.model_json_schema()}}


def cmd_schema(args: argparse.Namespace) -> int:
    """``pdrig schema``: write ``profile.schema.json`` and ``suite.schema.json`` to ``--out``
    (rig/config/schema.py: made from the pydantic models). The shipped YAML files name these files
    in their ``# yaml-language-server: $schema=...`` line. Returns 0."""
    out = output_dir(args.out, "--out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # /proc, a read-only mount: folder_problem cannot see every refusal ahead
        raise ConfigError(f"--out {cut(str(args.out))}: cannot create it ({e.strerror or e}); give a writable folder") \
            from None
    for name, schema in all_schemas().items():
        write_output(out / name, json.dumps(schema, indent=2, sort_keys=True) + "\n", "--out")
        print(out / name)
    return 0


def add_plan(sub) -> None:
    """Register ``pdrig plan`` (the processes, nothing started)."""
    p = sub.add_parser("plan", help="print every process's argv/env/ports without starting anything")
    config_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)


def add_config(sub) -> None:
    """Register ``pdrig config`` (the effective config or its fields)."""
    p = sub.add_parser("config", help="print the effective config, or (--explain) its fields")
    config_args(p)
    p.add_argument("--explain", nargs="?", const="", metavar="PATH",
                   help="list fields (all, or those at dotted PATH, e.g. nixl or decode.cpus) with "
                        "type, default and description")
    p.set_defaults(func=cmd_config)


def add_build_model(sub) -> None:
    """Register ``pdrig build-model`` (the tiny model)."""
    p = sub.add_parser("build-model", help="build the tiny model (cached) and print its path")
    config_args(p)
    p.set_defaults(func=cmd_build_model)


def add_up(sub) -> None:
    """Register ``pdrig up`` (a topology kept up)."""
    p = sub.add_parser("up", help="start a topology and keep it up until Ctrl-C")
    config_args(p)
    p.add_argument("--instances", help="comma-separated instance names (default: the pair a manual wave "
                                       "needs; the command says which and why)")
    p.add_argument("--proxy", type=port, nargs="?", const=8000, default=None, metavar="PORT",
                   help="also serve `pdrig proxy` over the started instances on 127.0.0.1:PORT (default 8000)")
    p.add_argument("--proxy-policy", default="round-robin", choices=["round-robin", "least-outstanding"])
    p.set_defaults(func=cmd_up)


def add_schema(sub) -> None:
    """Register ``pdrig schema`` (JSON Schemas)."""
    p = sub.add_parser("schema", help="write the JSON Schema of profiles and suites (for editors and CI)")
    p.add_argument("--out", default="schema", help="directory for profile.schema.json and suite.schema.json "
                                                   "(default ./schema)")
    p.set_defaults(func=cmd_schema)


def add_compose(sub) -> None:
    """Register ``pdrig compose`` (docker-compose.yml)."""
    p = sub.add_parser("compose", help="render a docker-compose.yml from the config")
    config_args(p)
    p.add_argument("--image", help="container image (default by device)")
    p.add_argument("--instances", metavar="A,B", help="instances to render (default: the pair a manual "
                                                      "wave needs; the command says which and why)")
    p.add_argument("--run-dir", help="host run directory mounted for logs and connector files; also "
                                     "where docker-compose.yml goes (default <run_root>/compose-<config>)")
    p.add_argument("-o", "--output", help="compose file (default <run-dir>/docker-compose.yml), - for stdout")
    p.set_defaults(func=cmd_compose)


def add_k8s(sub) -> None:
    """Register ``pdrig k8s`` (Kubernetes manifests)."""
    p = sub.add_parser("k8s", help="render Kubernetes manifests (pods, services, the suite Job)")
    config_args(p)
    p.add_argument("--run-id", help="names/labels of this run (default: r<MMDD-HHMMSS> UTC)")
    p.add_argument("-n", "--namespace", default="default", help="namespace of every object")
    p.add_argument("--image", help="container image (default: kubernetes.image, else by device)")
    p.add_argument("-o", "--output", default="-", help="output file (default: - for stdout)")
    p.set_defaults(func=cmd_k8s)
