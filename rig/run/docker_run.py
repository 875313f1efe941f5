"""``pdrig e2e --docker``: the suite with every instance in its own container, on one Compose network.

One process owns the whole life of the deployment, so nothing outlives it:

1. the run's ports are reserved (``ports.free`` moves them) and held until the containers are gone:
   the published ports are locked like a launched server's;
2. the plan of the instances the selected scenarios use (plus a Mooncake master) is rendered as
   ``<run dir>/compose/docker-compose.yml`` (rig/plan/compose.py; project ``pdrig-<run>``, one per
   run) and brought up with ``docker compose up -d`` (no ``--wait``: the rig waits for each
   service's healthcheck itself and pauses an instance as soon as it is ready, as it SIGSTOPs a
   launched one, so the others start on free CPUs);
3. the suite runs in attach mode with container control (:class:`rig.cluster.containers.ComposeContainers`):
   phases, holds and fault actions become ``docker pause`` / ``unpause`` / ``kill`` / ``restart``,
   logs are read with ``docker compose logs``;
4. whatever happened (a verdict, an error, Ctrl-C, a container that died, an image that is
   missing): every service's whole log is saved to ``<run dir>/logs/<service>.log``, the
   containers' final states to ``<run dir>/compose/ps.json``, then ``docker compose down
   --volumes --remove-orphans`` removes containers, network and volumes, and only then the ports
   are released. A ``down`` that fails is retried once and reported on stderr.

The engine and the image are the caller's (scripts/docker-engine.sh, scripts/docker-image.sh,
``make e2e-docker``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from rig.cluster.containers import ComposeContainers, ContainerError
from rig.cluster.logs import ComposeLog, LogSource
from rig.cluster.ports import reserve as reserve_ports
from rig.config import RigConfig, ScenarioConfig
from rig.connectors.mooncake import MASTER_ROLE
from rig.plan import compose
from rig.report.build import write_report
from rig.run.phases import phases_of
from rig.run.runner import RunResult, SuiteRunner, resolve_model


def project_name(run_dir: Path) -> str:
    """The Compose project of a run: ``pdrig-`` + the run directory's name, lowercased, with
    anything but ``[a-z0-9_-]`` replaced by ``-`` (Compose's rule for project names)."""
    return "pdrig-" + re.sub(r"[^a-z0-9_-]", "-", run_dir.name.lower())


def instances_of(cfg: RigConfig, scenarios: list[ScenarioConfig]) -> list[str]:
    """The engines the scenarios' phases use, in phase order, each once."""
    return list(dict.fromkeys(n for ph in phases_of(cfg, scenarios) for n in (ph.prefill, ph.decode)))


def _say(msg: str) -> None:
    print(f"[pdrig docker] {msg}", file=sys.stderr, flush=True)


def save_evidence(containers: ComposeContainers, services: list[str], run_dir: Path) -> None:
    """Each service's whole log to ``run_dir/logs/<service>.log`` and ``docker compose ps -a``
    (JSON) to ``run_dir/compose/ps.json``; a docker failure is written in place of the file's
    content (the run goes on to teardown)."""
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for name in services:
        try:
            text = containers.compose("logs", "--no-color", "--timestamps", "--no-log-prefix", name)
        except ContainerError as e:
            text = f"(log not read: {e})\n"
        (logs / f"{name}.log").write_text(text)
    try:
        ps = containers.compose("ps", "-a", "--format", "json")
    except ContainerError as e:
        ps = f"(not read: {e})\n"
    (run_dir / "compose" / "ps.json").write_text(ps)


def tear_down(containers: ComposeContainers, grace_s: float) -> bool:
    """``docker compose down --volumes --remove-orphans`` (containers, network, volumes); True
    when it succeeded (tried twice)."""
    for attempt in (1, 2):
        try:
            containers.compose("down", "--volumes", "--remove-orphans", "--timeout", str(max(1, int(grace_s))),
                               timeout_s=120 + grace_s)
            return True
        except ContainerError as e:
            _say(f"compose down failed (attempt {attempt}): {e}")
    return False


def run_in_containers(cfg: RigConfig, scenarios: list[ScenarioConfig], run_dir: Path, image: str,
                      quiet: bool = False, docker: str = "docker") -> RunResult:
    """Run ``scenarios`` of ``cfg`` with each instance in its own container (module docstring).

    ``image`` holds vLLM and the rig (``pdrig:cpu``). Returns the run's result (its report is in
    ``run_dir``). Raises PortConflict before anything starts when the ports are taken;
    KeyboardInterrupt propagates after teardown and the report.
    """
    run_dir = run_dir.resolve()
    cfg, ports = reserve_ports(cfg, str(run_dir))
    try:
        names = instances_of(cfg, scenarios)
        plan = compose.container_plan(cfg, names)
        services = [p.name for p in plan.processes]
        model_dir_host = resolve_model(cfg) if cfg.model.source != "hub" else None
        project = project_name(run_dir)
        cdir = run_dir / "compose"
        cdir.mkdir(parents=True, exist_ok=True)
        text = compose.compose_yaml(cfg, plan, image=image, run_dir_host=str(run_dir),
                                    model_dir_host=model_dir_host, project=project, cpuset=False)
        for path, content in compose.container_files(cfg, plan, str(run_dir)).items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content)
        compose_file = cdir / "docker-compose.yml"
        compose_file.write_text(text)
        containers = ComposeContainers(str(compose_file), project, docker=docker)
        sources: dict[str, LogSource] = {n: ComposeLog(n, str(compose_file), n, docker=docker)
                                         for n in services if plan.by_name(n).role != MASTER_ROLE}
        runner = SuiteRunner(cfg, scenarios, run_dir, quiet=quiet, attach=True, log_sources=sources,
                             containers=containers)
        try:
            _say(f"project {project}: {', '.join(services)} from {image} ({compose_file})")
            try:
                containers.compose("up", "-d", "--no-color", timeout_s=300)
            except ContainerError as e:
                _say(f"compose up failed: {e}")
                runner.result.status, runner.result.error = "error", f"docker compose up failed: {e}"
                runner.result.finish_status()
                write_report(runner.result)
                return runner.result
            return runner.run()
        finally:
            save_evidence(containers, services, run_dir)
            if not tear_down(containers, cfg.timeouts.shutdown_grace_s):
                _say(f"containers of project {project} may remain: docker compose -p {project} down -v")
    finally:
        ports.release()
