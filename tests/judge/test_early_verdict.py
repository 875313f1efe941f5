"""The early stall verdict: decided by reasoning (block arithmetic + D's
EngineCore CPU time while frozen), never for a control, and the window stays the fallback.

Recorded-sequence tests use the 0.32.0 livelock template of tests/observe/test_stall.py; the end-to-end
tests run fake vLLM servers (tests/fake_vllm.py) whose EngineCore stand-in spins while requests
wait, as vLLM's busy loop does.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from rig.cluster.processes import Cluster
from rig.cluster.proctree import ENGINE_CORE_TITLE
from rig.config import load_config
from rig.judge.early_verdict import AdmissionReasoning
from rig.judge.signatures import BlockFacts
from rig.observe.metrics import parse_metrics
from rig.observe.stall import StallDetector
from rig.plan.processes import build_plan
from rig.run.runner import SuiteRunner, new_run_dir
from tests.helpers.fake_rig import LIVELOCK, fake_config, scenario, write_config
from tests.helpers.stall_metrics import DATA, snap
from tests.helpers.verdict_records import stall_facts

# The CPU default's decode: 4 usable blocks of 32 tokens, ngram k=1, max_model_len 128.
FIVE_BLOCKS = BlockFacts(block_size=32, usable_blocks=4, num_speculative_tokens=1, max_model_len=128)


def run(det: StallDetector, n: int, dt: float = 0.25, cpu_per_s: float | None = 0.8, **values):
    """Feed ``n`` frozen samples ``dt`` apart with the engine burning ``cpu_per_s`` CPU-s per
    second (None: unknown); returns the first Stall and the sample index it fired on."""
    for i in range(n):
        t = 100.0 + i * dt
        st = det.feed(snap(t, **values), None if cpu_per_s is None else 50.0 + cpu_per_s * i * dt)
        if st is not None:
            return st, i
    return None, None


def detector(prompt_lens=(126,), blocks=FIVE_BLOCKS, window=8.0) -> StallDetector:
    return StallDetector(window, transfer_window_s=30.0, early=AdmissionReasoning(blocks, prompt_lens))


def test_livelock_is_decided_by_reasoning_before_the_window():
    st, i = run(detector(), 40)
    assert st is not None and i == 4  # 1.0 s frozen over 5 samples (>= 4), engine 0.8 CPU-s
    assert st.duration_s == pytest.approx(1.0)
    assert st.decided_by.startswith("block arithmetic (n=126 k=1 block_size=32: needs 4 blocks, 4 of 4 "
                                    "usable free) and D's EngineCore busy for 0.80 CPU-s")
    assert "decided early: block arithmetic" in st.diagnosis
    assert st.diagnosis.startswith("admission livelock on decode: waiting=1 (capacity) running=0")
    assert st.facts.kv_fetch_stages == {"waiting_to_start": 1.0}


def test_without_engine_cpu_evidence_only_the_window_decides():
    st, i = run(detector(), 40, cpu_per_s=None)
    assert st is not None and st.decided_by == "window" and st.duration_s == pytest.approx(8.0)


def test_a_starved_engine_is_not_decided_early():
    # The state is frozen but D's EngineCore got no CPU: the scheduler may not have looked yet.
    st, _ = run(detector(), 40, cpu_per_s=0.002)  # 0.02 CPU-s in 10 s
    assert st is not None and st.decided_by == "window"


def test_a_request_that_never_fits_is_left_to_the_window():
    # 4 usable blocks, k=1: a 126-token prompt on a 3-block decode can never fit.
    three = BlockFacts(block_size=32, usable_blocks=3, num_speculative_tokens=1, max_model_len=128)
    st, _ = run(detector(blocks=three), 40)
    assert st is not None and st.decided_by == "window"


def test_a_waiting_request_behind_used_blocks_is_not_a_fits_but_waits():
    # The pair control: the first 96-token request holds 3 of 4 blocks, the second waits.
    st, _ = run(detector(prompt_lens=(96,)), 20, kv=0.75)
    assert st is None


def test_a_read_in_flight_is_never_decided_early():
    st, _ = run(detector(), 40, wts=0, inprog=1)
    assert st is None  # the 30 s transfer window is not reached in 10 s


def test_a_control_admitted_after_a_pause_never_fires():
    # edge-126-6blk: frozen 0.75 s (engine busy), then admitted: fetch in progress, KV used.
    six = BlockFacts(block_size=32, usable_blocks=5, num_speculative_tokens=1, max_model_len=128)
    det = detector(blocks=six)
    fired = [det.feed(snap(100 + i * 0.25), 50 + i * 0.2) for i in range(4)]
    fired += [det.feed(snap(101 + i * 0.25, wts=0, inprog=1, capacity=0, kv=0.8), 51 + i * 0.2)
              for i in range(8)]
    assert fired == [None] * 12


def test_the_recorded_livelock_text_is_decided_by_its_own_cache_config():
    text = (DATA / "vllm-0.32.0-decode-stalled-edge-126.prom").read_text()
    det = detector(blocks=BlockFacts(block_size=32, usable_blocks=None, num_speculative_tokens=1,
                                     max_model_len=128))
    st = None
    for i in range(6):
        st = det.feed(parse_metrics(text, "decode", t=10 + i * 0.3), 3.0 + i * 0.3) or st
    assert st is not None and "needs 4 blocks, 4 of 4 usable free" in st.decided_by  # from cache_config_info


@pytest.mark.parametrize("kw", [dict(min_frozen_s=0), dict(min_samples=1), dict(min_engine_cpu_s=0)])
def test_rule_settings_are_checked(kw):
    with pytest.raises(ValueError, match="AdmissionReasoning"):
        AdmissionReasoning(FIVE_BLOCKS, (126,), **kw)


# ------------------------------------------------------------------ live fakes


def _cfg(tmp: Path, **kw):
    return load_config(write_config(tmp, fake_config(tmp, **kw)))


def engine_core(pid: int) -> psutil.Process:
    """The fake's EngineCore stand-in under API server ``pid`` (titled as vLLM's, comm cut at 15)."""
    (core,) = [c for c in psutil.Process(pid).children(recursive=True) if c.name() == ENGINE_CORE_TITLE[:15]]
    return core


def test_engine_cpu_reads_the_enginecore_child_and_grows_only_while_requests_wait(base):  # noqa: F811 - fixture
    cfg = _cfg(base, decodes={"decode": {"env": {"FAKE_VLLM_ENGINE_CORE": "1"}}})
    plan = build_plan(cfg, base / "run", "model", sys.executable)
    with Cluster(plan, 30, 3) as cluster:
        cluster.start(["prefill", "decode"])
        assert cluster.engine_cpu_s("prefill") is None  # no EngineCore child: unknown, not 0
        idle0 = cluster.engine_cpu_s("decode")
        assert idle0 is not None
        # no waiting request: it sleeps. Its loop looked 30 times whether a request waits (each
        # look ends in a 10 ms sleep, a voluntary context switch) and never stepped.
        core = engine_core(cluster.procs["decode"].popen.pid)
        looks0 = core.num_ctx_switches().voluntary
        deadline = time.monotonic() + 30
        while core.num_ctx_switches().voluntary - looks0 < 30:
            assert time.monotonic() < deadline, "the EngineCore stand-in never looked for work"
            time.sleep(0.05)
        assert cluster.engine_cpu_s("decode") - idle0 < 0.1
        assert cluster.engine_cpu_s("no-such-instance") is None
    with Cluster(plan, 30, 3, attach=True) as attached:
        assert attached.engine_cpu_s("decode") is None  # not launched by the rig


def test_fake_livelock_with_an_engine_core_is_xfail_decided_early_and_controls_pass(base):  # noqa: F811 - fixture
    stall = {"FAKE_VLLM_FAULT": "stall", "FAKE_VLLM_ENGINE_CORE": "1"}
    cfg = _cfg(base, decodes={"decode-stall": {"env": stall}, "decode": {"env": {"FAKE_VLLM_ENGINE_CORE": "1"}}},
               timeouts={"stall_window_s": 6, "metrics_interval_s": 0.1},
               scenarios=[scenario("stall", "decode-stall", prompt_tokens=126, max_tokens=2,
                                   known_issue={**LIVELOCK, "symptom": {**LIVELOCK["symptom"],
                                                                        "admission": "fits-but-waits"}}),
                          scenario("control", "decode", prompt_tokens=126, max_tokens=2),
                          scenario("control-pair", "decode", prompt_tokens=96, max_tokens=2, concurrent=2)])
    result = SuiteRunner(cfg, list(cfg.scenarios), new_run_dir(cfg), quiet=True).run()
    v = {x.scenario: x for x in result.verdicts}
    assert v["stall"].verdict == "XFAIL", v["stall"].reason
    assert "decided early: block arithmetic (n=126 k=0 block_size=32: needs 4 blocks, 15 of 15 usable free)" \
        in v["stall"].reason
    (rec,) = result.observations[0].records
    assert rec.outcome == "stalled" and rec.stall.duration_s < 6  # decided before the 6 s window
    assert v["control"].verdict == "PASS" and v["control-pair"].verdict == "PASS"
    assert all(r.outcome == "ok" for o in result.observations[1:] for r in o.records)


# -------------------------------------------------------------------------------------------------
# The early stall rule at its thresholds (rig/judge/early_verdict.py): it decides only with every
# threshold met (frozen seconds, samples, EngineCore CPU seconds, KV usage, a fetch waiting to start
# and none in progress, every outstanding prompt fits-but-waits), never one short of any. Written
# against `make mutation` survivors (docs/howto/mutation.md).

BLOCKS = BlockFacts(block_size=32, usable_blocks=4, num_speculative_tokens=1, max_model_len=128)
RULE = AdmissionReasoning(BLOCKS, (126,), min_frozen_s=1.0, min_samples=4, min_engine_cpu_s=0.05, kv_usage_max=0.05)
FACTS = replace(stall_facts(), kv_usage=0.0, running=0.0, kv_fetch_stages={"waiting_to_start": 1.0},
                waiting_reasons={"capacity": 1.0}, num_gpu_blocks=0, block_size=0)


def test_decides_at_exactly_every_threshold():
    text = RULE(FACTS, 1.0, 4, 0.05)
    assert text == ("block arithmetic (n=126 k=1 block_size=32: needs 4 blocks, 4 of 4 usable free) and D's "
                    "EngineCore busy for 0.05 CPU-s (scheduler iterations) while the state stayed frozen 1.0 s "
                    "over 4 samples")


@pytest.mark.parametrize("frozen,samples,cpu", [(0.99, 4, 0.05), (1.0, 3, 0.05), (1.0, 4, 0.049), (1.0, 4, None)])
def test_one_short_of_a_threshold_never_decides(frozen, samples, cpu):
    assert RULE(FACTS, frozen, samples, cpu) is None


@pytest.mark.parametrize("change", [
    {"running": 1.0},
    {"kv_usage": 0.051},
    {"kv_fetch_stages": {"waiting_to_start": 0.0}},
    {"kv_fetch_stages": {}},  # no fetch stage reported at all
    {"kv_fetch_stages": {"waiting_to_start": 1.0, "in_progress": 1.0}},
    {"waiting_reasons": {}},  # not waiting for capacity: not fits-but-waits
])
def test_a_state_that_is_not_the_livelock_never_decides(change):
    assert RULE(replace(FACTS, **change), 2.0, 8, 1.0) is None


def test_kv_usage_at_its_bound_still_decides_when_the_blocks_fit():
    rule = replace(RULE, blocks=replace(BLOCKS, usable_blocks=40))
    assert rule(replace(FACTS, kv_usage=0.05), 2.0, 8, 1.0) is not None


def test_every_outstanding_prompt_must_fit_but_wait():
    text = replace(RULE, prompt_lens=(126, 30))(FACTS, 2.0, 8, 1.0)
    assert text is not None and text.startswith("block arithmetic (n=30 k=1 block_size=32: needs 1 blocks, 4 of 4 "
                                                "usable free; n=126 k=1")
    assert replace(RULE, prompt_lens=(126, 127))(FACTS, 2.0, 8, 1.0) is not None  # 127+2 clamps to 128
    never = replace(RULE, blocks=replace(BLOCKS, usable_blocks=3))
    assert never(FACTS, 2.0, 8, 1.0) is None
    assert replace(RULE, prompt_lens=())(FACTS, 2.0, 8, 1.0) is None


@pytest.mark.parametrize("kw", [{"min_frozen_s": 0}, {"min_samples": 1}, {"min_engine_cpu_s": 0}])
def test_settings_at_their_bounds_are_refused(kw):
    with pytest.raises(ValueError, match="^AdmissionReasoning: min_frozen_s and min_engine_cpu_s must be > 0"):
        AdmissionReasoning(BLOCKS, (126,), **kw)
    ok = {"min_frozen_s": 0.01, "min_samples": 2, "min_engine_cpu_s": 0.01}
    AdmissionReasoning(BLOCKS, (126,), **{k: ok[k] for k in kw})
