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
    floor = SHORTFALL_MIN_GAPS * sample_gap_s
    derived = SHORTFALL_REQUESTS * baseline_s
    seconds = round(min(cap_s, max(floor, derived)), 3)
    measured = f"{SHORTFALL_REQUESTS} x the measured request {baseline_s:.3g} s"
    if seconds >= round(cap_s, 3):
        return Bound(seconds, f"timeouts.stall_window_s, at most; {measured}")
    if derived < floor:
        return Bound(seconds, f"{SHORTFALL_MIN_GAPS} x timeouts.sample_gap_s, at least; {measured}")
    return Bound(seconds, measured)
