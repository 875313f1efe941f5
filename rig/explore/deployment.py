"""The exploration's live deployment: one per topology, kept up across actions, replays and shrinks.

:class:`Deployment` owns the cluster, its port reservation and the config it runs (the config as
is, or a topology drawn from vLLM's knobs, rig.explore.topologies). A drawn topology other than
the one running is a new deployment (the old one stopped, its ports released); a pair that is not
up is started before its first action (the time goes to ``startup_s``, not to the actions'
throughput); an instance that died is restarted by the runner before the next run. It also
reads what the rig needs from the live servers: the chat template's overhead
(rig.explore.probe) and the log text of a run (the first traceback of a dead instance names its
code site, rig.explore.mechanism).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import yaml

from rig.cluster.builds import launch_vllm_version
from rig.cluster.mooncake import master_binary
from rig.cluster.ports import PortReservation
from rig.cluster.ports import reserve as reserve_ports
from rig.cluster.processes import Cluster
from rig.config import RigConfig
from rig.connectors.mooncake import MASTER_ROLE
from rig.explore.grammar import Topology
from rig.explore.probe import chat_overhead
from rig.explore.topologies import Variant, variant_of_sets
from rig.observe.metrics import MetricSnapshot, parse_metrics
from rig.plan.processes import build_plan
from rig.run.runner import resolve_model


class Deployment:
    """The live deployment of ``base_cfg`` (or of one of ``variants``) under ``run_dir``;
    ``log`` prints progress lines. Raises ClusterError (from :meth:`use`) when an instance cannot
    start, ConfigError when the ports are taken."""

    def __init__(self, base_cfg: RigConfig, run_dir: Path, variants: dict[str, Variant], quiet: bool,
                 log: Callable[[str], None]):
        self.base_cfg, self.cfg, self.run_dir, self.variants = base_cfg, base_cfg, run_dir, variants
        self.quiet, self.log = quiet, log
        self.cluster: Cluster | None = None
        self.ports: PortReservation | None = None
        self.live: str | None = None  # the variant the cluster runs ("" = the config as is), None: none yet
        self.startup_s = 0.0
        self.startups = 0

    def cfg_json(self) -> dict[str, Any]:
        """The running config as a mapping without its suite (each run adds its own scenarios)."""
        out = self.cfg.model_dump(mode="json")
        out.pop("suite", None)
        return out

    def prepare(self) -> None:
        """Reserve the ports of the config as is and make its cluster (no server started): a
        second run on this host is refused here, before anything else."""
        if self.live is None:
            self._start()
            self.live = ""

    def use(self, topo: Topology) -> Cluster:
        """The cluster running ``topo``'s config with its pair up (see the module docstring)."""
        if topo.variant != self.live:
            if topo.variant and topo.variant not in self.variants:  # a replayed history's topology
                self.variants[topo.variant] = variant_of_sets(self.base_cfg, topo.variant, topo.decode, topo.sets)
            self.stop()
            self.cfg = self.variants[topo.variant].cfg if topo.variant else self.base_cfg
            self.log(f"topology {topo.variant or 'of the config'}: {' '.join(topo.sets) or 'no --set'}")
            self._start()
            self.live = topo.variant
        assert self.cluster is not None
        if not {topo.prefill, topo.decode} <= set(self.cluster.procs):
            self._deploy(topo)
        return self.cluster

    def _start(self) -> None:
        """Reserve the ports, write plan.json and config.yaml, make the cluster (nothing started)."""
        self.cfg, self.ports = reserve_ports(self.cfg, str(self.run_dir.resolve()))
        plan = build_plan(self.cfg, self.run_dir, resolve_model(self.cfg), sys.executable, master_binary(self.cfg),
                          launch_vllm_version(self.cfg.launch.command))
        (self.run_dir / "plan.json").write_text(json.dumps(asdict(plan), indent=1))
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(self.cfg_json(), sort_keys=False))
        self.cluster = Cluster(plan, self.cfg.timeouts.startup_s, self.cfg.timeouts.shutdown_grace_s,
                               startup_stall_s=self.cfg.timeouts.startup_stall_s,
                               display="off" if self.quiet else "auto")

    def _deploy(self, topo: Topology) -> None:
        """Start ``topo``'s pair (and a Mooncake master), stopping the instances it does not use."""
        assert self.cluster is not None
        t = time.monotonic()
        extra = [p.name for p in self.cluster.plan.processes if p.role == MASTER_ROLE]
        self.cluster.stop([n for n in self.cluster.procs if n not in {topo.prefill, topo.decode, *extra}])
        self.log(f"starting {topo.prefill} and {topo.decode}")
        self.cluster.start([*extra, topo.prefill, topo.decode])
        self.startup_s += time.monotonic() - t
        self.startups += 1

    def chat_overhead(self, topo: Topology) -> int:
        """Tokens P's chat template adds (rig.explore.probe.chat_overhead on the live prefill)."""
        assert self.cluster is not None
        return chat_overhead(self.cluster.url(topo.prefill), self.cfg.model.served_name)

    def marks(self, names: list[str]) -> dict[str, int | None]:
        """The current end of each instance's log (read with :meth:`since`)."""
        out: dict[str, int | None] = {}
        for n in names:
            src = self.cluster.log_source(n) if self.cluster is not None else None
            out[n] = src.mark() if src is not None else None
        return out

    def since(self, marks: dict[str, int | None], names: list[str]) -> dict[str, str]:
        """The log text each of ``names`` wrote after ``marks`` ('' when unreadable)."""
        out = {}
        for n in names:
            src = self.cluster.log_source(n) if self.cluster is not None else None
            mark = marks.get(n)
            out[n] = (src.since(mark) or "") if src is not None and mark is not None else ""
        return out

    def scrape(self, names: list[str], timeout_s: float = 5.0) -> dict[str, MetricSnapshot | None]:
        """One ``/metrics`` scrape of each of ``names`` (None for an instance that is not up or
        does not answer): the explorer's reading before it hands an action to the runner
        (rig.explore.lives)."""
        out: dict[str, MetricSnapshot | None] = {}
        for n in names:
            out[n] = None
            if self.cluster is None or n not in self.cluster.procs:
                continue
            try:
                r = httpx.get(f"{self.cluster.url(n)}/metrics", timeout=timeout_s)
                r.raise_for_status()
                out[n] = parse_metrics(r.text, n)
            except (httpx.HTTPError, ValueError):
                pass
        return out

    def stop(self) -> None:
        """Stop every server and release the ports."""
        if self.cluster is not None:
            self.cluster.stop_all()
        if self.ports is not None:
            self.ports.release()
            self.ports = None
