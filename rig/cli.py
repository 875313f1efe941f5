"""``pdrig``: the command line.

    pdrig e2e   [--config F] [--set k=v ...] [--scenario NAME ...]   run a suite, print the verdict
    pdrig plan  [--config F] [--set k=v ...] [--json]               print argv/env/ports, start nothing
    pdrig up    [--config F] [--instances a,b]                      start a topology until Ctrl-C
    pdrig build-model [--config F]                                  build (or find) the tiny model
    pdrig compose [--config F] [--image I] [-o FILE]                render docker-compose.yml
    pdrig wave prefix|pressure [--endpoints F | --prefill URL --decode URL] ...   a manual wave
    pdrig build NAME [--builds-dir D]                               create a vLLM build's env (configs/builds.yaml)
    pdrig matrix --builds a,b [--suite edge,lease] [--resume]       the suites on each build; matrix.md

Exit codes: 0 all expectations hold; 1 a scenario failed (FAIL/XPASS/ERROR); 2 bad config or
environment (refused before anything starts); 3 the run itself broke (a server did not start, a
port clash, the rig's own error; the report says which); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rig.cluster import Cluster, ClusterError, install_signal_handlers
from rig.config import ConfigError, RigConfig, load_config
from rig.plan import build_plan, busy_ports

DEFAULT_CONFIG = "configs/cpu-tiny.yaml"


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, help=f"rig config YAML (default {DEFAULT_CONFIG})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="override a config field, e.g. --set timeouts.stall_window_s=5 (repeatable)")


def preflight(cfg: RigConfig) -> None:
    """Refuse early, with one clear message, what cannot work on this machine.

    Raises ConfigError when a cuda profile runs where ``nvidia-smi`` finds no GPU, or when the
    launch command's executable is not found.
    """
    if cfg.device == "cuda":
        smi = shutil.which("nvidia-smi")
        ok = False
        if smi:
            try:
                ok = subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        if not ok:
            raise ConfigError(
                f"config {cfg.name!r} has device: cuda, but this machine has no usable NVIDIA GPU "
                "(nvidia-smi missing or failing). Run it on a GPU node after `make setup PROFILE=gpu`, "
                "or use the CPU default: make e2e CONFIG=configs/cpu-tiny.yaml")
    from rig import mooncake

    mooncake.preflight(cfg)  # store modes: names a missing libibverbs/libnl or mooncake_master
    problem = cpu_problem(cfg)
    if problem:
        raise ConfigError(problem)
    exe = cfg.launch.command[0]
    if exe != "{python}" and shutil.which(exe) is None:
        raise ConfigError(f"launch.command[0]: {exe!r} is not on PATH; run `make setup` "
                          "(PROFILE=gpu installs `vllm` on GPU nodes)")


def cpu_problem(cfg: RigConfig) -> str:
    """:func:`rig.cluster.unavailable_cpus` for the config's instances ("" when all fit)."""
    from rig.cluster import unavailable_cpus

    return unavailable_cpus((role, inst.name, inst.cpus or ()) for role, inst in cfg.instances())


def cmd_e2e(args: argparse.Namespace) -> int:
    """Run the config's suite (or ``--scenario`` ones); exit 0 only if all are PASS/XFAIL."""
    from rig.runner import SuiteRunner, new_run_dir, select_scenarios

    cfg = load_config(args.config, args.overrides)
    if not args.attach:
        preflight(cfg)
    scenarios = select_scenarios(cfg, args.scenario)
    if not scenarios:
        raise ConfigError(f"{args.config}: no scenarios to run (add a suite: or scenarios:)")
    run_dir = new_run_dir(cfg)
    print(f"[pdrig] run directory: {run_dir}", file=sys.stderr, flush=True)
    result = SuiteRunner(cfg, scenarios, run_dir, quiet=args.quiet, attach=args.attach).run()
    return {"passed": 0, "failed": 1}.get(result.status, 3)


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the plan (no process is started, no model built)."""
    cfg = load_config(args.config, args.overrides)
    model = {"tiny": f"{cfg.cache_dir}/models/tiny-qwen3-{cfg.model.tiny.cache_key()}"}.get(
        cfg.model.source, cfg.model.path or "")
    plan = build_plan(cfg, Path(cfg.run_root) / "<timestamp>-" f"{cfg.name}", model, sys.executable)
    if args.json:
        print(json.dumps(plan.to_json(), indent=1))
        return 0
    for p in plan.processes:
        where = f"  nice {p.nice}" * bool(p.nice) + f"  cpus {','.join(map(str, p.cpus))}" * bool(p.cpus)
        print(f"# {p.name} ({p.role}) http://{p.host}:{p.port}  log {p.log_path}{where}")
        print(p.shell_line())
        print()
    busy = busy_ports(plan)
    if busy:
        print("ports in use now: " + ", ".join(f"{n}:{port}" for n, port in busy), file=sys.stderr)
    problem = cpu_problem(cfg)
    if problem:
        print(problem, file=sys.stderr)
    return 0


def cmd_build_model(args: argparse.Namespace) -> int:
    """Build the tiny model if the config uses it and print its directory."""
    from rig.runner import resolve_model

    cfg = load_config(args.config, args.overrides)
    print(resolve_model(cfg))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    """Start instances (default: first prefill + first decode) and keep them up until Ctrl-C."""
    from rig.runner import new_run_dir, resolve_model

    cfg = load_config(args.config, args.overrides)
    preflight(cfg)
    run_dir = new_run_dir(cfg, f"{cfg.name}-up")
    plan = build_plan(cfg, run_dir, resolve_model(cfg), sys.executable)
    names = args.instances.split(",") if args.instances else \
        [p.name for p in plan.processes if p.role == "mooncake-master"] + [cfg.prefill[0].name, cfg.decode[0].name]
    with Cluster(plan, cfg.timeouts.startup_s, cfg.timeouts.shutdown_grace_s) as cluster:
        ready = cluster.start(names)
        (run_dir / "endpoints.json").write_text(json.dumps(
            {n: {"url": cluster.url(n), "role": plan.by_name(n).role} for n in names}, indent=1))
        for n in names:
            print(f"{n:16s} {plan.by_name(n).role:16s} {cluster.url(n)}  ready after {ready.get(n, 0):.0f} s")
        print(f"endpoints: {run_dir / 'endpoints.json'}; Ctrl-C stops everything")
        while not cluster.dead():
            time.sleep(1)
        print(f"a process died: {cluster.dead()}", file=sys.stderr)
        return 1


def cmd_compose(args: argparse.Namespace) -> int:
    """Render docker-compose.yml from the config (rig/compose.py) and the files it mounts.

    The containers see the plan built by ``compose.container_plan``; the host run directory
    (``--run-dir``) and a local model directory (the tiny model is built if needed) are mounted.
    """
    from rig import compose
    from rig.runner import resolve_model

    cfg = load_config(args.config, args.overrides)
    plan = compose.container_plan(cfg)
    run_dir_host = str(Path(args.run_dir).resolve())
    model_dir_host = resolve_model(cfg) if cfg.model.source != "hub" else None
    image = args.image or ("pdrig:gpu" if cfg.device == "cuda" else "pdrig:cpu")  # docker/README.md tags
    text = compose.compose_yaml(cfg, plan, image=image, run_dir_host=run_dir_host, model_dir_host=model_dir_host)
    for path, content in compose.container_files(cfg, plan, run_dir_host).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content)
    if args.output == "-":
        print(text)
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output} (image {image}; run directory {run_dir_host})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``pdrig`` (subcommands as in the module docstring)."""
    ap = argparse.ArgumentParser(prog="pdrig", description="End-to-end test rig for vLLM P/D serving")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("e2e", help="bring up the topology, run the suite, print the verdict")
    _config_args(p)
    p.add_argument("--scenario", action="append", help="run only this scenario (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--attach", action="store_true",
                   help="the instances already run at the config's host:ports (e.g. Docker Compose): "
                        "judge them, start and stop nothing")
    p.set_defaults(func=cmd_e2e)
    p = sub.add_parser("plan", help="print every process's argv/env/ports without starting anything")
    _config_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("build-model", help="build the tiny model (cached) and print its path")
    _config_args(p)
    p.set_defaults(func=cmd_build_model)
    p = sub.add_parser("up", help="start a topology and keep it up until Ctrl-C")
    _config_args(p)
    p.add_argument("--instances", help="comma-separated instance names (default: first P and D)")
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("compose", help="render a docker-compose.yml from the config")
    _config_args(p)
    p.add_argument("--image", help="container image (default by device)")
    p.add_argument("--run-dir", default="./runs", help="host directory mounted for logs")
    p.add_argument("-o", "--output", default="docker-compose.yml", help="output file, - for stdout")
    p.set_defaults(func=cmd_compose)
    from rig.wave_cli import add_wave_parser  # `pdrig wave prefix|pressure` (rig/wave_cli.py)

    add_wave_parser(sub)
    from rig.builds import add_build_parser  # `pdrig build NAME` (issue #11)
    from rig.matrix import add_matrix_parser  # `pdrig matrix --builds a,b` (issue #11)

    add_build_parser(sub)
    add_matrix_parser(sub)
    return ap


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


if __name__ == "__main__":
    sys.exit(main())
