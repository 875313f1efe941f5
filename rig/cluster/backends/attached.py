"""Endpoints someone else started (``--attach``: a Compose stack, Kubernetes, ``pdrig up``): the rig
probes them and never starts, signals or stops anything.

An attached instance is waited for only once it answers. The rig did not start it, so an endpoint
that does not answer at all is not "starting": it is not there (a wrong URL, a deployment that is
down). After ``connect_s`` seconds (``attach.connect_s``, 10 s by default) without
any HTTP answer the start fails, naming the URL and what was tried, instead of waiting the
start-up ceiling (``timeouts.startup_s``, 1,200 s on the CPU profiles); ``None`` waits for the
first answer up to that ceiling too (a deployment that starts with the run: the Kubernetes Job).
One that answers but is not ready yet (``/health`` 503, the model not listed, the side channel
closed) is waited for up to that ceiling. Alive means "``/health`` answers 200".
"""

from __future__ import annotations

import time

import httpx

from rig.cluster.backends.base import Probe, Running, probe_ready, waiting_watch
from rig.cluster.logs import LogSource
from rig.cluster.startup import StartupWatch
from rig.config.deployment import ATTACH_CONNECT_S
from rig.errors import ClusterError
from rig.plan.spec import ProcessSpec


class Attached:
    """The :class:`~rig.cluster.backends.base.Backend` of endpoints the rig did not start;
    ``connect_s``: how long one may stay unanswered (None: up to the start-up ceiling)."""

    launches = False

    def __init__(self, connect_s: float | None = ATTACH_CONNECT_S):
        self.connect_s = connect_s
        self._answered: set[str] = set()  # names whose endpoint answered since their spawn

    def refusal(self, specs: list[ProcessSpec]) -> str:
        """Never: the deployment holds its own CPUs and ports."""
        return ""

    def spawn(self, spec: ProcessSpec, startup_cpus: tuple[int, ...] | None = None) -> Running:
        """Nothing to start: the wait for it begins now."""
        self._answered.discard(spec.name)
        return Running(spec=spec, popen=None, started_at=time.monotonic())

    def watch(self, run: Running) -> StartupWatch:
        """Nothing of ours to read: the wait itself (:func:`~rig.cluster.backends.base.waiting_watch`)."""
        return waiting_watch(run)

    def ready(self, run: Running, http: httpx.Client) -> Probe:
        """The readiness rule; raises ClusterError when the endpoint has not answered at all for
        ``connect_s`` seconds since the wait began (naming its URL and the last error)."""
        probe = probe_ready(http, run.spec)
        name = run.spec.name
        if probe.answered:
            self._answered.add(name)
        elif self.connect_s is not None and name not in self._answered \
                and (waited := time.monotonic() - run.started_at) > self.connect_s:
            raise ClusterError(
                f"{name} at {run.spec.base_url} (attached: the rig did not start it) does not answer: "
                f"{probe.missing}, tried every 0.5 s for {waited:.0f} s. Is the deployment up at that address "
                "(--endpoint NAME=URL)? The rig waits for an attached instance only once it answers: start it "
                "first, then attach (or wait for its first answer too: --set attach.connect_s=null)", name)
        return probe

    def settle(self, run: Running) -> None:
        """Nothing: its CPUs are its owner's."""

    def exit_code(self, run: Running) -> int | None:
        """None: the rig cannot know an exit code of a process it did not start."""
        return None

    def poll(self, run: Running) -> int | None:
        """None while ``/health`` answers 200, else -1 ("gone")."""
        spec = run.spec
        try:
            return None if httpx.get(spec.base_url + spec.health_path, timeout=5).status_code == 200 else -1
        except httpx.HTTPError:
            return -1

    def signal(self, run: Running, sig: int) -> int:
        """Refused: the rig does not own those processes (ClusterError)."""
        raise ClusterError(f"cannot signal {run.spec.name}: attach mode (the rig did not start it)")

    def hold(self, run: Running) -> bool:
        """Refused as :meth:`signal` is (ClusterError)."""
        raise ClusterError(f"cannot signal {run.spec.name}: attach mode (the rig did not start it)")

    def restart_in_place(self, spec: ProcessSpec) -> bool:
        """Never: a restart is a fresh wait for the endpoint."""
        return False

    def stop(self, runs: list[Running]) -> None:
        """Nothing: its owner stops it."""

    def close(self) -> None:
        """Nothing borrowed."""

    def pid(self, run: Running) -> int | None:
        """None: no process of it is known on this host."""
        return None

    def cpu_s(self, run: Running) -> float | None:
        """None."""
        return None

    def how(self, name: str, run: Running | None) -> str:
        """'-': nothing the rig may act on."""
        return "-"

    def tail(self, run: Running) -> str:
        """'': the rig has no log of its own for it."""
        return ""

    def log_source(self, spec: ProcessSpec) -> LogSource | None:
        """None: the log checks are "not checked" unless a source is given (``attach.logs``)."""
        return None
