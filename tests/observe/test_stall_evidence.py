"""Every stall carries its evidence (rig/observe/stall.py): EngineCore/worker CPU seconds over the
frozen span, the host's load average, compilers running under the instance; a stall the host may
explain (engine starved by a loaded host, or compiling) is inconclusive -> ERROR, never FAIL nor
a known issue's XFAIL; an engine stepping with nothing changing, or blocked on an idle host, is a
real stall -> FAIL.

Recorded-sequence tests use tests/observe/test_stall.py's 0.32.0 livelock template; the end-to-end tests
run fake vLLM servers (tests/fake_vllm.py) whose EngineCore stand-in steps, stays idle or runs a
``cc1plus`` child (FAKE_VLLM_ENGINE_CORE), with the host's load average patched.
"""

from __future__ import annotations

import pytest

from rig.cluster import proctree
from rig.cluster.proctree import ProcSample
from rig.config import load_config
from rig.observe.stall import StallDetector, evidence_of
from rig.run.runner import SuiteRunner, new_run_dir
from tests.helpers.fake_rig import LIVELOCK, fake_config, scenario, write_config
from tests.helpers.stall_metrics import snap

LOADED = (9.0, 8.0, 7.0)  # on any host with fewer than 9 CPUs
IDLE = (0.0, 0.0, 0.0)


@pytest.mark.parametrize("start, now, load, finding", [
    (ProcSample(10.0), ProcSample(11.0), LOADED, "stepping"),  # 1 CPU-s in 8 s: iterating, load or not
    (ProcSample(10.0), ProcSample(10.0), LOADED, "starved"),
    (ProcSample(10.0), ProcSample(10.04), LOADED, "starved"),  # a few iterations at most
    # live, 2026-12-01, host load 148 on 2 CPUs: D's EngineCore got 0.18 CPU-s in 34.5 s frozen:
    # a rate below an idle engine's, yet many scheduler iterations, so vLLM had its chance
    (ProcSample(10.0), ProcSample(10.18), (148.0, 111.5, 73.2), "stepping"),
    (ProcSample(10.0), ProcSample(10.01), IDLE, "hung"),  # no CPU although the host had plenty
    (ProcSample(10.0), ProcSample(10.0, compilers=("cc1plus (pid 7)",), compiler_cpu_s=3.0), IDLE, "compiling"),
    (ProcSample(10.0), ProcSample(12.0, compilers=("g++ (pid 8)",)), IDLE, "compiling"),
    (None, ProcSample(10.0), IDLE, "unknown"),  # no CPU reading at the span's start
    (ProcSample(10.0), ProcSample(10.0), None, "unknown"),  # no load average: starved or hung?
])
def test_findings(start, now, load, finding):
    ev = evidence_of(start, now, 8.0, load, 2)
    assert ev.finding == finding
    assert ev.inconclusive == (finding in ("starved", "compiling"))


def test_evidence_text_names_cpu_load_and_compilers():
    ev = evidence_of(ProcSample(10.0, 5.0), ProcSample(10.0, 9.5, ("cc1plus (pid 7)",), 3.25), 8.0, LOADED, 2)
    assert ev.text() == ("inconclusive: engine compiling (EngineCore 0.00 CPU-s, workers 4.50 CPU-s, "
                         "host load 9.0/8.0/7.0 on 2 CPUs, compiling: cc1plus (pid 7) (3.2 CPU-s), over 8.0 s frozen)")


def feed(det: StallDetector, n: int, cpu_per_s: float, dt: float = 1.0, **proc):
    """Feed ``n`` frozen livelock samples ``dt`` apart, EngineCore burning ``cpu_per_s``; returns
    (index, Stall) of the first that fired, else (None, None)."""
    for i in range(n):
        st = det.feed(snap(100.0 + i * dt), ProcSample(50.0 + cpu_per_s * i * dt, **proc))
        if st is not None:
            return i, st
    return None, None


def test_a_starved_engine_is_watched_past_the_window_then_reported_inconclusive(monkeypatch):
    monkeypatch.setattr(proctree, "host_load", lambda: LOADED)
    i, st = feed(StallDetector(8.0, max_gap_s=2, inconclusive_s=6.0), 30, cpu_per_s=0.0)
    assert i == 14  # the window (8 s) plus the bound (6 s), not at the window
    assert st.facts.evidence.finding == "starved" and st.facts.evidence.inconclusive
    assert "inconclusive: engine starved by the host (EngineCore 0.00 CPU-s" in st.diagnosis
    assert "host load 9.0/8.0/7.0" in st.diagnosis


def test_without_a_bound_an_inconclusive_stall_is_reported_at_the_window(monkeypatch):
    monkeypatch.setattr(proctree, "host_load", lambda: LOADED)
    i, st = feed(StallDetector(8.0, max_gap_s=2), 30, cpu_per_s=0.0)
    assert i == 8 and st.facts.evidence.finding == "starved"


def test_a_stepping_engine_is_a_real_stall_at_the_window_even_on_a_loaded_host(monkeypatch):
    monkeypatch.setattr(proctree, "host_load", lambda: LOADED)
    i, st = feed(StallDetector(8.0, max_gap_s=2, inconclusive_s=6.0), 30, cpu_per_s=0.1)
    assert i == 8 and st.facts.evidence.finding == "stepping" and not st.facts.evidence.inconclusive
    assert "engine stepping with nothing changing (EngineCore 0.80 CPU-s" in st.diagnosis


def test_an_engine_that_gets_its_cpu_during_the_wait_is_a_real_stall(monkeypatch):
    """Starved at the window, then scheduled and stepping with nothing changing: decided then."""
    monkeypatch.setattr(proctree, "host_load", lambda: LOADED)
    det = StallDetector(8.0, max_gap_s=2, inconclusive_s=20.0)
    fired = None
    for i in range(30):
        cpu = 50.0 if i <= 9 else 50.0 + 0.5 * (i - 9)  # no CPU until t=109, then 0.5 CPU-s per s
        fired = det.feed(snap(100.0 + i), ProcSample(cpu))
        if fired:
            break
    assert fired is not None and fired.facts.evidence.finding == "stepping"
    assert 9 < fired.duration_s < 28


def test_a_compiler_child_keeps_the_early_rule_from_deciding(monkeypatch):
    monkeypatch.setattr(proctree, "host_load", lambda: IDLE)
    decided = []
    det = StallDetector(8.0, max_gap_s=2, inconclusive_s=4.0,
                        early=lambda facts, s, n, cpu: decided.append(s) or "early")
    i, st = feed(det, 30, cpu_per_s=0.5, compilers=("cc1plus (pid 9)",))
    assert decided == [] and i == 12 and st.facts.evidence.finding == "compiling"


# ------------------------------------------------------------------ fake servers


def _run(base, monkeypatch, load, decodes, scenarios):  # noqa: F811 - base is the fixture's value
    monkeypatch.setattr(proctree, "host_load", lambda: load)
    data = fake_config(base, decodes=decodes, scenarios=scenarios,
                       timeouts={"stall_window_s": 2, "stall_inconclusive_s": 2, "metrics_interval_s": 0.1})
    cfg = load_config(write_config(base, data))
    result = SuiteRunner(cfg, list(cfg.scenarios), new_run_dir(cfg), quiet=True).run()
    return {v.scenario: v for v in result.verdicts}, {o.scenario: o for o in result.observations}


def _stall(mode: str) -> dict:
    return {"env": {"FAKE_VLLM_FAULT": "stall", "FAKE_VLLM_FAULT_ARG": "100", "FAKE_VLLM_ENGINE_CORE": mode}}


def test_fake_stalls_on_a_loaded_host_starved_and_compiling_are_error_stepping_is_fail(base, monkeypatch):  # noqa: F811
    v, obs = _run(base, monkeypatch, LOADED,
                  {"d-step": _stall("1"), "d-idle": _stall("idle"), "d-cc": _stall("compile")},
                  [scenario("stepping", "d-step", prompt_tokens=126, max_tokens=2),
                   scenario("starved", "d-idle", prompt_tokens=126, max_tokens=2),
                   scenario("starved-known", "d-idle", prompt_tokens=126, max_tokens=2,
                            known_issue={**LIVELOCK, "symptom": {**LIVELOCK["symptom"], "instance": "decode"}}),
                   scenario("compiling", "d-cc", prompt_tokens=126, max_tokens=2)])
    assert v["stepping"].verdict == "FAIL", v["stepping"].reason
    assert "engine stepping with nothing changing" in v["stepping"].reason
    (rec,) = obs["stepping"].records
    assert rec.outcome == "stalled" and rec.stall.evidence.finding == "stepping"
    assert rec.stall.evidence.engine_cpu_s > 0 and rec.stall.evidence.load_avg == LOADED

    for name in ("starved", "starved-known"):  # a known issue's stall symptom is no excuse either
        assert v[name].verdict == "ERROR", v[name].reason
        assert v[name].reason.startswith("inconclusive: completed not checked")
        assert "inconclusive: engine starved by the host" in v[name].reason
    (rec,) = obs["starved"].records
    assert rec.stall.evidence.finding == "starved" and rec.stall.duration_s >= 4  # window + the bound

    assert v["compiling"].verdict == "ERROR", v["compiling"].reason
    assert "inconclusive: engine compiling" in v["compiling"].reason and "cc1plus (pid " in v["compiling"].reason


def test_fake_engine_idle_on_an_idle_host_is_a_real_stall(base, monkeypatch):  # noqa: F811 - fixture
    v, obs = _run(base, monkeypatch, IDLE, {"d-idle": _stall("idle")},
                  [scenario("hung", "d-idle", prompt_tokens=126, max_tokens=2)])
    assert v["hung"].verdict == "FAIL", v["hung"].reason
    assert "engine not stepping on an idle host" in v["hung"].reason
    (rec,) = obs["hung"].records
    assert rec.stall.evidence.finding == "hung" and rec.stall.duration_s < 4  # decided at the window


def test_a_wave_episode_keeps_the_inconclusive_mark_and_no_stall_is_not_checked(monkeypatch):
    from rig.judge.wave_checks import _stall_check
    from rig.observe.stall import StallWatcher
    from rig.workload.wave_result import WaveResult

    monkeypatch.setattr(proctree, "host_load", lambda: LOADED)
    watcher = StallWatcher(8.0, max_gap_s=2, probe=lambda name: ProcSample(5.0))  # an engine that never runs
    for i in range(10):
        watcher.feed(snap(100.0 + i))
    (ep,) = watcher.episodes
    assert ep.inconclusive and "inconclusive: engine starved by the host" in ep.diagnosis

    wave = WaveResult(scenario="w", kind="pressure-wave", client="fast", params={}, instances={"decode": "decode"})
    wave.stalls = [{"instance": "decode", "start_s": 1.0, "duration_s": 9.0, "diagnosis": ep.diagnosis,
                    "explained": "", "inconclusive": True}]
    c = _stall_check(wave)
    assert c.ok is None and c.detail.startswith("not checked: every unexplained freeze was inconclusive")
    wave.stalls.append({**wave.stalls[0], "inconclusive": False})  # one real freeze decides
    assert _stall_check(wave).ok is False
