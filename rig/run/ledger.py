"""A run's result as its scenarios go through the lifecycle: :class:`RunLedger`, written once for
a suite (rig/run/runner.py) and for ``pdrig wave``'s one-scenario run on attached servers
(rig/run/wave_run.py).

Whoever runs the scenarios, the same bookkeeping holds: the scenario in flight is known, so that
Ctrl-C or a rig failure inside it keeps its partial observation in the report as ERROR
(:meth:`RunLedger.keep_partial`); a rig exception is that scenario's ERROR with its traceback in
``rig-traceback.txt`` (:meth:`RunLedger.rig_exception`); every judged scenario lands in the
:class:`rig.report.build.RunResult` and the report is rewritten at once (:meth:`RunLedger.add`);
how the run stopped maps to its status in one place (:meth:`RunLedger.stopped`).
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

from rig.config import ScenarioConfig
from rig.errors import ClusterError, ConfigError
from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation
from rig.report.build import RunResult, print_summary, write_report
from rig.run.lifecycle import Deployment, ScenarioOutcome, ScenarioSteps, run_scenario


class RunLedger:
    """The run's :class:`RunResult` (``result``) and its run directory ``run_dir``; the scenario in
    flight while :meth:`run` runs it."""

    def __init__(self, result: RunResult, run_dir: Path) -> None:
        self.result, self.run_dir = result, run_dir
        # The scenario in flight: its config, the steps it was given (their observation as filled so
        # far, their judge) and when it began (time.monotonic() seconds).
        self._in_flight: tuple[ScenarioConfig, ScenarioSteps, float] | None = None

    @property
    def in_flight(self) -> str:
        """The name of the scenario in flight, '-' when none is."""
        return self._in_flight[0].name if self._in_flight else "-"

    async def run(self, sc: ScenarioConfig, deployment: Deployment, steps: ScenarioSteps) -> ScenarioOutcome:
        """:func:`rig.run.lifecycle.run_scenario` of ``sc`` on ``deployment``, in flight meanwhile;
        its outcome is then recorded (:meth:`add`) and returned. KeyboardInterrupt and cancellation
        propagate with the scenario still in flight (:meth:`keep_partial` keeps it)."""
        self._in_flight = (sc, steps, time.monotonic())
        out = await run_scenario(sc, deployment, steps)
        self._in_flight = None
        self.add(sc, out.observation, out.verdict, out.kind_result)
        return out

    def add(self, sc: ScenarioConfig, obs: ScenarioObservation, verdict: ScenarioVerdict,
            kind_result: object = None) -> None:
        """Record one judged scenario (also one judged without running) and rewrite the report."""
        self.result.add(sc.kind, obs, verdict, kind_result)
        write_report(self.result)

    def rig_exception(self, scenario: str, doing: str, e: Exception) -> str:
        """Append the current traceback to ``rig-traceback.txt`` (one section per exception) and
        return the ERROR reason naming it."""
        with open(self.run_dir / "rig-traceback.txt", "a") as f:
            f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} scenario {scenario}: {doing} ===\n"
                    f"{''.join(traceback.format_exception(e))}\n")
        return f"rig error while {doing}: {type(e).__name__}: {e} (traceback in rig-traceback.txt)"

    def keep_partial(self, why: str) -> None:
        """Put the scenario that was in flight into the result as an ERROR verdict with its
        partial observation (records answered so far, stall diagnosis, log lines); nothing when
        none was."""
        if self._in_flight is None:
            return
        sc, steps, started = self._in_flight
        self._in_flight = None
        obs = steps.observation
        answered = sum(r.outcome == "ok" for r in obs.records)
        obs.wall_s = time.monotonic() - started
        obs.error = obs.error or f"{why}: partial observation ({answered}/{len(obs.records)} requests answered)"
        try:  # the kind's own judge gives ERROR (obs.error is set) with the scenario's expectation
            verdict = steps.judge(obs, None)
        except Exception:  # a judge that needs what the interrupted run never produced
            verdict = ScenarioVerdict(sc.name, "ERROR", "pass", obs.error)
        self.result.add(sc.kind, obs, verdict)

    def stopped(self, e: BaseException, doing: str) -> BaseException | None:
        """Record that the run stopped on ``e`` while ``doing`` (e.g. "running the suite"):
        KeyboardInterrupt (Ctrl-C, SIGTERM through the CLI's handlers) -> ``interrupted``, the
        scenario in flight kept; ClusterError / ConfigError -> ``error`` with its message; any other
        exception -> ``error``, the rig's own bug: its traceback in rig-traceback.txt, the scenario
        in flight kept. Returns the KeyboardInterrupt to re-raise once the report is written, else
        None."""
        if isinstance(e, KeyboardInterrupt):
            self.result.status, self.result.error = "interrupted", f"interrupted ({str(e) or 'SIGINT'})"
            self.keep_partial("interrupted mid-scenario")
            return e
        if isinstance(e, ClusterError | ConfigError):
            self.result.status, self.result.error = "error", str(e)
            return None
        if not isinstance(e, Exception):  # SystemExit, GeneratorExit: not ours to record
            raise e
        self.result.status, self.result.error = "error", f"{type(e).__name__}: {e}"
        self.rig_exception(self.in_flight, doing, e)
        self.keep_partial(f"the rig failed mid-scenario: {type(e).__name__}: {e}")
        return None

    def finish(self, quiet: bool) -> None:
        """The run's status from its verdicts (unless it stopped: :meth:`stopped`), the report
        written, and its verdict table on the terminal unless ``quiet``."""
        self.result.finish_status()
        write_report(self.result)
        if not quiet:
            print_summary(self.result)
