"""What a ``kind: sequence`` scenario recorded (the executor is :mod:`rig.workload.sequence`): each
request's step, route and event times, the stall, P's reaping of abandoned leases, D's gauges
against the requests outstanding at D, the router's refusals next to D's own, and the drains.
Read by the sequence checks (rig/judge/sequence_checks.py) and its summary.md section; written to
``sequence-<scenario>.json``. Apart from the executor as rig/workload/wave_result.py is from the
waves: the judge and the report read the result, never run a sequence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from rig.config.blocks import BlockFacts
from rig.config.sequence import SequenceConfig, Step
from rig.observe import metrics as m
from rig.observe.observations import DrainResult

# The routes that send the rig's own decode hop with P's kv_transfer_params (rig.config.sequence).
D_HOP_ROUTES = ("pd", "pd-retry", "pd-swallow-cancel")

ABANDONED = "abandoned by the scenario: the decode hop is never sent (P holds the blocks until its lease)"
CANCELLED = "cancelled by the scenario (cancel_after_ms)"
SWALLOWED = ("the client closed (cancel_after_ms) and the router did not forward the abort: the hops ran to "
             "completion")


@dataclass
class SequenceEntry:
    """One request of a sequence: its step and route, and the milliseconds from the scenario's
    start at which it reached each event (``sent``, ``prefill-answered``, ``decode-sent``,
    ``answered``; ``cut`` when the rig closed it, ``retry-sent`` when route pd-retry sent its
    decode hop again, ``client-closed`` when route pd-swallow-cancel's client closed while the
    hops ran on) and ``ended``; None = never. ``first_attempt``: route pd-retry, how the first
    decode attempt ended."""

    request_id: str
    step: str
    route: str
    events_ms: dict[str, float] = field(default_factory=dict)
    ended_ms: float | None = None
    outcome: str = "pending"
    diagnosis: str = ""
    first_attempt: str = ""

    @property
    def sent_ms(self) -> float | None:
        """Milliseconds from the scenario's start to sending the request's first hop."""
        return self.events_ms.get("sent")


@dataclass
class LeaseReap:
    """P's reaping of abandoned leases (bug record R06): ``expired_before`` P's
    ``nixl_num_kv_expired_reqs_total`` at the start; ``want`` the abandoned requests;
    ``last_abandoned_ms`` when the last of them was answered by P; ``reaped_ms`` when the counter
    had risen by ``want`` (None = not seen), ``rose`` by how much at the end, ``outstanding_then``
    the steps with requests outstanding at ``reaped_ms``; ``samples`` how many scrapes answered."""

    expired_before: float | None = None
    want: int = 0
    last_abandoned_ms: float | None = None
    reaped_ms: float | None = None
    rose: float = 0.0
    outstanding_then: list[str] = field(default_factory=list)
    samples: int = 0


@dataclass
class GaugeGap:
    """Whether D's gauges counted the requests the rig had outstanding at D (a decode hop, or a
    straight-to-D request, sent and not ended). ``visible`` per sample = ``num_requests_running`` +
    the larger of ``num_requests_waiting`` and the sum of ``num_requests_kv_fetch_by_stage`` (a
    request in WAITING_FOR_REMOTE_KVS that a build counts in neither is invisible: vLLM PR #56640).
    ``samples``: scrapes taken with a request outstanding at D for the whole scrape (the executor
    samples D at its hops' events too, rig.observe.events, so a short request is seen); ``longest_s`` the longest run of
    consecutive such scrapes in which ``visible`` stayed below the outstanding count, seconds from
    its first to its last scrape; ``outstanding`` / ``visible`` / ``at_ms`` at that run's last scrape."""

    samples: int = 0
    longest_s: float = 0.0
    outstanding: int = 0
    visible: float = 0.0
    at_ms: float | None = None
    _since: float | None = None
    _began: list[str] = field(default_factory=list)  # outstanding at D when the current scrape began

    def begin(self, outstanding: set[str]) -> None:
        """A scrape of D begins with the requests ``outstanding`` at D (ids)."""
        self._began = sorted(outstanding)

    def held(self, outstanding: set[str]) -> int:
        """How many requests were outstanding at D for the whole scrape: when it began (:meth:`begin`)
        and still now (``outstanding``). One that ended meanwhile may be gone from the gauges already,
        one sent meanwhile may not be in them yet."""
        return len(outstanding.intersection(self._began))

    def feed(self, snap: m.MetricSnapshot, outstanding: int, now_s: float, now_ms: float) -> None:
        """Account one scrape of D taken at monotonic ``now_s`` with ``outstanding`` requests at D."""
        if outstanding == 0:
            self._since = None
            return
        self.samples += 1
        fetch = sum(snap.by_label(m.KV_FETCH_BY_STAGE, "stage").values())
        visible = snap.value(m.RUNNING) + max(snap.value(m.WAITING), fetch)
        if visible >= outstanding:
            self._since = None
            return
        self._since = now_s if self._since is None else self._since
        if now_s - self._since >= self.longest_s:
            self.longest_s = round(now_s - self._since, 3)
            self.outstanding, self.visible, self.at_ms = outstanding, visible, now_ms


@dataclass
class RefusalProbe:
    """A router request that ended without an answer, and D's own answer to the same body sent
    straight to it: ``client_status`` / ``client_error`` what the router's client got,
    ``d_status`` / ``d_error`` what D answered directly (None status: no answer)."""

    request_id: str
    client_status: int | None
    client_error: str
    d_status: int | None
    d_error: str


@dataclass
class SequenceResult:
    """The kind's result: the requests' entries, the stall (its diagnosis and the steps it froze),
    the lease-reap observation, the drains with their bound and the lease (seconds)."""

    entries: list[SequenceEntry] = field(default_factory=list)
    stall: str = ""
    stall_unwatched: str = ""  # why the stall watcher could not look (StallWatcher.unwatched), '' when it did
    stall_samples: int = 0  # snapshots of D the stall watcher judged (StallWatcher.fed)
    stalled_steps: list[str] = field(default_factory=list)
    reap: LeaseReap | None = None
    drains: list[DrainResult] = field(default_factory=list)
    idle_bound_s: float = 0.0
    lease_s: float = 0.0  # nixl.kv_lease_duration of the run (the lease-reaped bound)
    gauges: GaugeGap = field(default_factory=GaugeGap)
    gauge_window_s: float = 0.0  # timeouts.stall_window_s: the longest gauges-account's bound may be
    sample_gap_s: float = 0.0  # timeouts.sample_gap_s: the shortest (rig.judge.windows.shortfall_bound)
    router_url: str = ""  # where route router steps went ('' = no router step)
    refusals: list[RefusalProbe] = field(default_factory=list)
    # The decode's block arithmetic (rig.run.kinds.block_facts): a stall signature's admission
    # (rig.judge.signatures.admission_of) needs it; None leaves the admission "unknown".
    blocks: BlockFacts | None = None



def at_d(entries: Iterable[SequenceEntry]) -> set[str]:
    """Ids of the requests outstanding at D: a decode hop sent (``pd``) or a straight-to-D request sent,
    not ended. A router step's requests are not counted: when its router sends the decode hop is not seen."""
    return {e.request_id for e in entries if e.ended_ms is None and (
        (e.route in D_HOP_ROUTES and "decode-sent" in e.events_ms) or (e.route == "decode" and "sent" in e.events_ms))}


def step_of(spec: SequenceConfig, request_id: str, scenario: str) -> Step | None:
    """The step request ``request_id`` (``<scenario>-<step id>-<k>``) belongs to, or None."""
    for s in spec.steps:
        if request_id.startswith(f"{scenario}-{s.id}-") and request_id[len(scenario) + len(s.id) + 2:].isdigit():
            return s
    return None
