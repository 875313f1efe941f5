"""Every wait the rig makes (:class:`TimeoutsConfig`), in seconds."""

from __future__ import annotations

from pydantic import Field

from rig.config.base import StrictModel


class TimeoutsConfig(StrictModel):
    """Every wait the rig makes, in seconds."""

    startup_s: float = Field(
        1200, gt=0,
        description="hard ceiling per instance, from spawn to ready, however it progresses (1,200 s, as "
                    "vLLM waits for a server in tests/v1/kv_connector/nixl_integration/run_accuracy_test.sh)")
    startup_stall_s: float = Field(
        180, gt=0,
        description="a starting instance whose log, CPU use (its process group's) and start-up phase all "
                    "stood still this long is stuck: its start fails at once, naming the phase")
    warmup_s: float = Field(
        600, gt=0,
        description="per phase: how long a direct warm-up request that timed out is retried while its instance "
                    "is alive and its processes use CPU (a busy host, not a hung engine)")
    request_s: float = Field(60, gt=0, description="default deadline of one request (both hops)")
    stall_window_s: float = Field(8, gt=0, description="frozen metrics this long = a stall")
    kv_transfer_s: float = Field(
        30, gt=0,
        description="frozen metrics with a KV read in flight (kv_fetch in_progress) = a stall only "
                    "after this long: /metrics cannot show a transfer's own progress")
    stall_inconclusive_s: float = Field(
        30, ge=0,
        description="a stall whose evidence is inconclusive (the engine starved by a loaded host, or "
                    "compiling) is watched this much longer past the window before it is reported as "
                    "inconclusive (ERROR); capped by stall_inconclusive_wait")
    metrics_interval_s: float = Field(1.0, gt=0, description="sampling period while requests run")
    sample_gap_s: float = Field(
        0.05, ge=0,
        description="besides the period, an instance is sampled at the rig's request events (sent, first byte, "
                    "answered, cancelled) and scenario boundaries, at most once per this many seconds per "
                    "sampling loop: a request shorter than the period is still seen")
    drain_s: float = Field(30, gt=0, description="time to return to idle after a scenario")
    latency_floor_s: float = Field(
        5, ge=0,
        description="the latency check's floor: a hop that answered within this many seconds is never a "
                    "finding, however fast the measured per-request baseline (rig/judge/windows.py latency_bound)")
    shutdown_grace_s: float = Field(10, gt=0, description="SIGTERM -> SIGKILL delay")

    def stall_inconclusive_wait(self, request_s: float | None = None) -> float:
        """Seconds past the stall window an inconclusive stall is watched: ``stall_inconclusive_s``,
        at most half of what the request's deadline (``request_s``, default ``self.request_s``)
        leaves after the window, so the stall is still reported with its evidence before the
        deadline turns it into a bare timeout."""
        left = (self.request_s if request_s is None else request_s) - self.stall_window_s
        return max(0.0, min(self.stall_inconclusive_s, left / 2))
