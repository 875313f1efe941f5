"""Verdicts that say exactly what happened: the cases a new user met where the verdict said
something else (a matched value judged inconclusive, a wave cancelled on purpose failed for
having no answer, an instance stopped by its owner reported as a death; a wave against `pdrig up`
printing FAIL on checks that could not look: tests/app/test_wave_cli.py)."""

from __future__ import annotations

import asyncio
import os

from rig.judge import wave_checks as wj
from rig.judge.checks import Check
from rig.judge.verdict import Expectation, decide
from rig.observe.observations import ScenarioObservation
from rig.transport.records import WaveRecord
from rig.workload.wave_result import WaveResult
from tests.helpers.waves import (
    scenario,
    wave_and_drain,
)


def _prefix_wave(hits: float, expected: int, fits: bool) -> WaveResult:
    recs = [WaveRecord(request_id=f"r{i}", index=i, prompt_len=56, max_tokens=4, stream=False, outcome="ok",
                       tokens=4) for i in range(4)]
    return WaveResult("pw", "prefix-wave", "aiohttp", {"prompt_tokens": 56}, {"prefill": "prefill", "decode": "decode"},
                      records=recs, deltas={"prefill": {"prefix_hits": hits}}, expected_prefix_hits=expected,
                      prefix_fits=fits, prefix_note="working set 67 blocks > P's 63 usable blocks")


def test_prefix_hits_equal_to_the_expectation_is_ok_even_when_predicted_unsure():
    obs = ScenarioObservation("pw", "decode", "prefill")
    c = wj._prefix_hits(obs, _prefix_wave(1440, 1440, fits=False), [])
    assert c.ok is True
    assert "P hits 1440 tokens, expected 1440" in c.detail
    assert "matched although the prefixes could not all stay cached on P" in c.detail
    # a different value where the rig said it could not know stays "not checked", never a FAIL
    c = wj._prefix_hits(obs, _prefix_wave(1200, 1440, fits=False), [])
    assert c.ok is None and c.detail.startswith("not checked: the prefixes cannot all stay cached on P")
    # and where it could know, a different value fails
    assert wj._prefix_hits(obs, _prefix_wave(1200, 1440, fits=True), []).ok is False


def test_a_wave_all_cancelled_on_purpose_judges_what_is_left(healthy, tmp_path):
    p, d = healthy
    sc = scenario("pressure-wave", name="all-cancel", requests=12, concurrency=4, cancel_fraction=1.0, seed=9)
    res, _, v, _ = asyncio.run(wave_and_drain(sc, p, d, tmp_path))
    assert all(r.intentional for r in res.records)
    checks = {c.name: c for c in v.checks}
    assert v.verdict == "PASS", v.reason
    assert v.reason.startswith("all 12 requests cancelled on purpose: no answer to judge;")
    assert "idle-after" in v.reason and "no-fatal-log" in v.reason
    for name in ("token-counts", "kv-pulled", "parity"):
        assert checks[name].ok is None and "all 12 requests were cancelled on purpose" in checks[name].detail
    assert checks["idle-after"].ok and checks["alive"].ok and checks["no-fatal-log"].ok


def test_all_cancelled_is_no_false_green():
    def rec(i: int, outcome: str, planned: str | None) -> WaveRecord:
        return WaveRecord(request_id=f"r{i}", index=i, prompt_len=24, max_tokens=4, stream=False,
                          planned_cancel=planned, outcome=outcome, cancel_point=planned)

    sc = scenario("pressure-wave", name="w", requests=3, cancel_fraction=1.0)
    obs = ScenarioObservation("w", "decode", "prefill", fatal_lines={"prefill": [], "decode": []},
                              kv_integrity_lines={"prefill": [], "decode": []})
    # one request timed out: the answer checks are judged again, and the wave fails
    mixed = WaveResult("w", "pressure-wave", "aiohttp", {}, {"prefill": "prefill", "decode": "decode"},
                       records=[rec(0, "cancelled", "between"), rec(1, "timeout", None)])
    v = wj.judge_wave(sc, obs, mixed)
    assert v.verdict == "FAIL" and {c.name: c for c in v.checks}["token-counts"].ok is False
    # a cancel the rig did not plan (an abort) is not "on purpose"
    assert not wj.all_cancelled_on_purpose([rec(0, "cancelled", None)])
    # all cancelled on purpose, but no drain could be read: idle-after not checked -> ERROR, not PASS
    every = WaveResult("w", "pressure-wave", "aiohttp", {}, {"prefill": "prefill", "decode": "decode"},
                       records=[rec(0, "cancelled", "between"), rec(1, "cancelled", "during-decode")])
    v = wj.judge_wave(sc, obs, every)
    assert v.verdict == "ERROR" and "idle-after" in v.reason


def test_a_verdict_where_no_check_could_look_is_error():
    checks = [Check("token-counts", None, "not checked: x"), Check("alive", None, "not checked: y")]
    v = decide("s", checks, Expectation("pass", required=()))
    assert v.verdict == "ERROR" and v.reason.startswith("inconclusive: no check could look")


# ------------------------------------------------------------ an owner's stop is no death


def test_the_watch_tells_an_instance_its_owner_stopped_from_one_that_died(tmp_path):
    import subprocess

    from rig.cluster.logs import stop_marker
    from rig.observe.endpoint_watch import EndpointWatch, pid_alive
    from rig.transport.endpoint import Endpoint

    gone = []
    for _ in range(2):
        pr = subprocess.Popen(["true"])
        pr.wait()
        gone.append(pr.pid)
    assert not pid_alive(gone[0]) and pid_alive(os.getpid())
    (tmp_path / "prefill.log").write_text("old line\n")
    (tmp_path / "decode.log").write_text("old line\n")
    eps = [Endpoint("prefill", "http://127.0.0.1:9", str(tmp_path / "prefill.log"), gone[0]),
           Endpoint("decode", "http://127.0.0.1:9", str(tmp_path / "decode.log"), gone[1])]
    watch = EndpointWatch(eps)
    watch.start()
    # decode died, then `pdrig up` stopped what still ran: a stop line only in prefill's log
    # (Cluster.stop writes none into a dead process's log: test_stop_writes_no_stop_line_into_a_dead_log)
    with open(tmp_path / "decode.log", "a") as f:
        f.write("ERROR 12-01 [core.py:1] EngineCore encountered a fatal error.\n")
    with open(tmp_path / "prefill.log", "a") as f:
        f.write(stop_marker("prefill"))
    obs = ScenarioObservation("w", "decode", "prefill")
    asyncio.run(_observe(watch, obs))
    assert obs.stopped == {"prefill": obs.stopped["prefill"]} and obs.stopped["prefill"].startswith(
        "pdrig: stopping prefill (SIGTERM)")
    assert obs.dead == {"decode": -1} and "EngineCore encountered a fatal error" in obs.death_lines["decode"]
    c = next(c for c in wj.wave_checks(scenario("pressure-wave", requests=1), obs,
                                       WaveResult("w", "pressure-wave", "aiohttp", {}, {})) if c.name == "alive")
    assert c.ok is False and c.detail.startswith("decode died (exit -1): ")
    assert "prefill died" not in c.detail and "prefill stopped by its owner, not a death" in c.detail


async def _observe(watch, obs) -> None:
    import httpx

    async with httpx.AsyncClient() as http:
        await watch.observe(http, obs)


def test_alive_names_a_stop_by_the_owner_and_never_calls_it_a_death():
    from rig.judge.checks import alive_check

    line = "pdrig: stopping prefill (SIGTERM) at 2026-12-01T17:00:00+00:00"
    obs = ScenarioObservation("s", "decode", "prefill", dead={"decode": -1},
                              death_lines={"decode": "RuntimeError: boom"}, stopped={"prefill": line})
    c = alive_check(obs)
    assert c.ok is False and c.detail == (f"decode died (exit -1): RuntimeError: boom; prefill stopped by its "
                                          f"owner, not a death ({line})")
    alone = alive_check(ScenarioObservation("s", "decode", "prefill", stopped={"prefill": line}))
    assert alone.ok is None and alone.detail.startswith("not checked: prefill stopped by its owner")
