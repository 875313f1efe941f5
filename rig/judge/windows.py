"""Judging windows: the bounds in seconds that decide a verdict, each derived from the deployment's
measured per-request baseline or absolute with its reason, so one suite is as fair on the 2-core CPU
box (a P/D request in ~0.1-1 s) as on an H200 (a request in milliseconds).

The baseline is ``ScenarioObservation.baseline_request_s`` (seconds per P/D request on this deployment:
the median of a few P/D round trips to the scenario's decode right after its warm-up,
rig.workload.baseline; None when a round trip failed or nothing measured it, e.g. ``pdrig wave``
against ``pdrig up``: every derived bound then takes its absolute cap). A bound that follows it
scales with the deployment's speed; an absolute one is a timer of vLLM's, or patience that ends as
soon as the awaited state is seen (then a fast deployment is judged exactly as early as it gets
there). Every bound, with what it reads and why: docs/reference/checks.md ("Judging windows").
"""

from __future__ import annotations

from dataclasses import dataclass

from rig.workload.baseline import MAX_TOKENS, PROMPT_TOKENS

# gauges-account: D's gauges may trail the requests outstanding at D for at most this many request
# times. A request is outside every gauge only between D's HTTP server and its engine (it is being
# received and turned into an EngineCoreRequest) and while its answer goes back: each a part of one
# request's time, so a shortfall that lasts several request times is a request D holds and counts in
# no gauge (vLLM PR #56640: a full prefix-cache hit parked in WAITING_FOR_REMOTE_KVS).
SHORTFALL_REQUESTS = 4
# ... and never less than this many gaps between two event samples (timeouts.sample_gap_s): two
# consecutive scrapes of D are at least one gap apart, so a shortfall shorter than that is one scrape.
SHORTFALL_MIN_GAPS = 4


@dataclass(frozen=True)
class Bound:
    """One judging window: ``seconds`` and the words for where it comes from (``source``: "4 x the
    measured request 0.12 s", "timeouts.stall_window_s: no baseline measured")."""

    seconds: float
    source: str

    def text(self) -> str:
        """'0.48 s (4 x the measured request 0.12 s)'."""
        return f"{self.seconds:g} s ({self.source})"


def shortfall_bound(baseline_s: float | None, sample_gap_s: float, cap_s: float) -> Bound:
    """The longest a D gauge may show fewer requests than the rig has outstanding at D before
    ``gauges-account`` fails: :data:`SHORTFALL_REQUESTS` x ``baseline_s`` (the measured per-request
    time, seconds), at least :data:`SHORTFALL_MIN_GAPS` x ``sample_gap_s``, at most ``cap_s``
    (``timeouts.stall_window_s``: past it a stall is declared anyway). Without a baseline (the
    warm-up measured none: a failed round trip, an attached run without one): ``cap_s``, as before
    the rig measured one. Raises ValueError for a negative input."""
    if min(cap_s, sample_gap_s) < 0 or (baseline_s is not None and baseline_s < 0):
        raise ValueError(f"shortfall_bound: seconds must be >= 0 (baseline {baseline_s}, gap {sample_gap_s}, "
                         f"cap {cap_s})")
    if baseline_s is None:
        return Bound(cap_s, "timeouts.stall_window_s: no per-request baseline measured")
    return _clamped(SHORTFALL_REQUESTS * baseline_s, f"{SHORTFALL_REQUESTS} x the measured request {baseline_s:.3g} s",
                    (SHORTFALL_MIN_GAPS * sample_gap_s, f"{SHORTFALL_MIN_GAPS} x timeouts.sample_gap_s"),
                    (cap_s, "timeouts.stall_window_s"))


def _clamped(derived: float, measured: str, floor: tuple[float, str], cap: tuple[float, str]) -> Bound:
    """``derived`` seconds (``measured``: how, in words) between ``floor`` and ``cap`` (seconds,
    the name of where each comes from), rounded to the millisecond; the cap wins over a floor above
    it, and the source names whichever end decided."""
    seconds = round(min(cap[0], max(floor[0], derived)), 3)
    if seconds >= round(cap[0], 3):
        return Bound(seconds, f"{cap[1]}, at most; {measured}")
    if derived < floor[0]:
        return Bound(seconds, f"{floor[1]}, at least; {measured}")
    return Bound(seconds, measured)


# latency: a hop may take this many times the measured request (scaled by its work, below) before it
# is a finding. 20, not 2 or 4: one request's time varies with what else D batches with it, the
# host's scheduler and the 1-minute load (the baseline is a median of three short round trips, taken
# once per phase), and the explorer's requirement is a hop that waits a timeout's worth or tens of
# times its baseline, not a slow percentile. On the 2-core CPU box (a request in ~0.1-1 s) 20 x is
# 2-20 s; on a GPU (milliseconds) the floor decides, and a hop stuck behind a timer still fails.
LATENCY_REQUESTS = 20


def round_trips(prompt_tokens: int, completion_tokens: int) -> float:
    """One request as baseline round trips (rig.workload.baseline: a
    :data:`~rig.workload.baseline.PROMPT_TOKENS`-token prompt, :data:`~rig.workload.baseline.MAX_TOKENS`
    generated), at least 1: the larger of ``prompt_tokens`` (over every prompt it carried) over the
    baseline's and ``completion_tokens`` (over every choice and prompt) over the baseline's. An
    upper bound on purpose: the baseline's time includes its fixed costs (two HTTP hops, the NIXL
    read, scheduling), so per token it overstates what a longer prompt (computed in a few engine
    steps) or a longer answer (one step per token) costs, and the bound errs on the generous side."""
    return max(1.0, prompt_tokens / PROMPT_TOKENS, completion_tokens / MAX_TOKENS)


def latency_bound(baseline_s: float | None, work: float, floor_s: float, cap_s: float,
                  cap_name: str = "timeouts.kv_transfer_s") -> Bound | None:
    """The longest a hop may take (to its first token, or in total) before ``latency`` fails:
    :data:`LATENCY_REQUESTS` x ``baseline_s`` (seconds per baseline round trip) x ``work``
    (the work the hop may have waited for, in baseline round trips: its own request's, plus the
    requests of the scenario it may have queued behind; :func:`round_trips`), at least
    ``floor_s`` (``timeouts.latency_floor_s``: a few seconds are never a finding on any deployment)
    and at most ``cap_s`` (``cap_name``, ``timeouts.kv_transfer_s`` by default: a hop that waits as
    long as the rig gives a KV read standing still is always a finding). None without a baseline:
    the check is then not checked (never ok), as a guess from another deployment would say nothing
    of this one. Raises ValueError for a negative input."""
    if min(floor_s, cap_s, work) < 0 or (baseline_s is not None and baseline_s < 0):
        raise ValueError(f"latency_bound: seconds must be >= 0 (baseline {baseline_s}, round trips {work}, "
                         f"floor {floor_s}, cap {cap_s})")
    if baseline_s is None:
        return None
    return _clamped(LATENCY_REQUESTS * baseline_s * work,
                    f"{LATENCY_REQUESTS} x the measured request {baseline_s:.3g} s x {work:.3g} round trips of work",
                    (floor_s, "timeouts.latency_floor_s"), (cap_s, cap_name))


def load_slowdown(baseline_load: float | None, load: float | None, cpus: int | None) -> float:
    """How much slower the host could make a request now than when the baseline was measured,
    from the 1-minute load averages (``baseline_load`` then, ``load`` around the scenario) and the
    host's CPU count: (load / cpus) / (baseline_load / cpus), each at least 1 (a host with a CPU to
    spare per runnable task does not slow anyone down), so at least 1. 1 when anything is unknown
    (an attached deployment on another host: the bound decides alone, as the stall evidence's
    ``unknown``)."""
    if baseline_load is None or load is None or not cpus:
        return 1.0
    return max(1.0, max(1.0, load / cpus) / max(1.0, baseline_load / cpus))
