"""The speed matrix: one suite with a scenario of every kind the runner can drive on fake servers,
judged at "GPU speed" (a request answered in a few ms, between two periodic samples) and at "slow CPU"
speed (a request spans several sampling periods; tests/helpers/speeds.py). A verdict must not depend on
how fast the host is: every scenario gets the same verdict at both speeds, every check the same state,
a check that is "not checked" at one speed only fails, and every check judged from ``/metrics``
samples says how many it judged from, at both speeds.

Where a check needs a state to exist, the scenario makes it exist by the rig's own means (the how-to:
docs/howto/faults.md, "States a check needs"): ``hold-fetch`` keeps D in its KV fetch by SIGSTOPping P
before the decode hop is sent (D's pull waits for P), ``busy-d`` streams longer answers with ignore_eos.
The store kinds need a Mooncake master, which the fake has no stand-in for: they are judged on the
in-process World (tests/workload/test_store.py), not here.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from rig.config import load_config
from rig.run.kinds import KINDS
from rig.run.runner import SuiteRunner, new_run_dir
from tests.helpers.fake_rig import LIVELOCK, fake_config, scenario, write_config
from tests.helpers.speeds import SPEEDS, at_speed
from tests.helpers.survivors import assert_no_survivors

DECODES = {
    "decode": {"num_gpu_blocks_override": 64},
    # P/D requests of >= 64 prompt tokens are never admitted on D (the fake's livelock).
    "decode-stall": {"env": {"FAKE_VLLM_FAULT": "stall", "FAKE_VLLM_FAULT_ARG": "64"}},
}

STORE_KINDS = {"store-roundtrip", "prefix-wave-store", "long-generation"}


def _fault(name: str, faults: list[dict], requests: int = 1) -> dict:
    return {"name": name, "kind": "fault", "decode": "decode", "prompt_tokens": 40, "max_tokens": 4,
            "expect": {"completion_tokens": 4, "total_tokens": 44},
            "fault": {"requests": requests, "faults": faults, "idle_margin_s": 1}}


SCENARIOS = [
    scenario("edge", "decode"),
    scenario("edge-stall", "decode-stall", prompt_tokens=100, max_tokens=2, known_issue=LIVELOCK),
    {"name": "pressure", "kind": "pressure-wave", "decode": "decode", "prompt_tokens": 40, "max_tokens": 4,
     "wave": {"requests": 8, "concurrency": 4, "parity_fraction": 0.25, "sample_interval_s": 0.2}},
    {"name": "prefix", "kind": "prefix-wave", "decode": "decode", "prompt_tokens": 40, "max_tokens": 4,
     "wave": {"groups": 2, "per_group": 3, "prefix_tokens": 32, "concurrency": 3, "parity_fraction": 0.25,
              "sample_interval_s": 0.2}},
    {"name": "retrieval", "kind": "retrieval", "decode": "decode", "prompt_tokens": 100, "max_tokens": 4,
     "expect": {"completion_tokens": 4}, "retrieval": {"requests": 2, "context_words": 10}},
    _fault("delay", [{"trigger": {"event": "prefill-answered"}, "target": "request", "action": "delay-decode",
                      "delay_s": 0.3}]),
    # The KV fetch held open: P stopped before the decode hop is sent, so D's pull waits for it; the
    # cancel fires once D shows the fetch in progress, at any speed.
    _fault("hold-fetch", [{"trigger": {"event": "prefill-answered"}, "target": "prefill", "action": "sigstop",
                           "stop_s": 1.0},
                          {"trigger": {"event": "kv-fetch-in-progress", "poll_ms": 20}, "target": "request",
                           "action": "cancel-decode"}]),
    # D seen busy: a burst of streamed answers long enough to be sampled (ignore_eos: the full max_tokens):
    # 100 tokens last 0.1 s at GPU speed, two timeouts.sample_gap_s and more, so D is scraped busy.
    # (parity: false: its references, one direct request each, would double the scenario's time; the
    # other kinds judge parity at both speeds)
    {"name": "busy-d", "kind": "sequence", "decode": "decode", "require": ["gauges-account"], "parity": False,
     "sequence": {"idle_margin_s": 1, "steps": [
         {"id": "x", "route": "pd", "prompt_tokens": 40, "max_tokens": 4},
         {"id": "burst", "route": "pd", "prompt_tokens": 40, "max_tokens": 100, "ignore_eos": True, "count": 8,
          "same_as": "x", "request": {"decode": {"stream": True}}, "start": {"after": "x", "event": "answered"}},
     ]}},
]


REPORTS: dict[str, dict] = {}  # speed -> report.json of its run (filled by ``runs``)


def _run_at(tmp, speed: str) -> tuple[dict, dict]:
    """The suite at ``speed`` under ``tmp``: (verdicts by scenario, report.json); servers checked gone."""
    cfg = at_speed(fake_config(tmp, decodes=DECODES, scenarios=SCENARIOS,
                               timeouts={"stall_window_s": 1.5, "kv_transfer_s": 3, "drain_s": 5}), speed)
    cfg["max_model_len"] = 2048  # the fake tokenizes the retrieval kind's text as bytes
    loaded = load_config(write_config(tmp, cfg), ["nixl.kv_lease_duration=2"])
    run_dir = new_run_dir(loaded)
    try:
        result = SuiteRunner(loaded, list(loaded.scenarios), run_dir, quiet=True).run()
    finally:
        assert_no_survivors(tmp, within_s=10)
    return {v.scenario: v for v in result.verdicts}, json.loads((run_dir / "report.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """``{speed: {scenario: ScenarioVerdict}}``: the suite run once per speed, the speeds side by side
    (each run has its own servers, ports and event loop); each run's report.json in :data:`REPORTS`."""
    dirs = {speed: tmp_path_factory.mktemp(f"speed-{speed}") for speed in SPEEDS}
    with ThreadPoolExecutor(len(SPEEDS)) as pool:
        futures = {speed: pool.submit(_run_at, dirs[speed], speed) for speed in SPEEDS}
        done = {speed: f.result() for speed, f in futures.items()}
    REPORTS.update({speed: report for speed, (_, report) in done.items()})
    return {speed: verdicts for speed, (verdicts, _) in done.items()}


NAMES = [s["name"] for s in SCENARIOS]


def test_every_kind_the_runner_drives_on_fakes_is_in_the_matrix():
    """A new kind joins the matrix (or says why not, as the store kinds do)."""
    kinds = {s.get("kind", "edge") for s in SCENARIOS}
    assert kinds == set(KINDS) - STORE_KINDS


@pytest.mark.parametrize("name", NAMES)
def test_same_verdict_at_every_speed(runs, name):
    got = {speed: (runs[speed][name].verdict, runs[speed][name].reason) for speed in SPEEDS}
    assert len({v for v, _ in got.values()}) == 1, got


@pytest.mark.parametrize("name", NAMES)
def test_same_check_states_at_every_speed(runs, name):
    """Every check has the same state at both speeds; one "not checked" at one speed only is the
    failure this matrix exists for (a verdict that rests on how fast the host is)."""
    states = {speed: {c.name: c for c in runs[speed][name].checks} for speed in SPEEDS}
    gpu, slow = states["gpu"], states["slow-cpu"]
    assert set(gpu) == set(slow), (sorted(gpu), sorted(slow))
    differ = {n: (f"gpu {gpu[n].state}: {gpu[n].detail}", f"slow-cpu {slow[n].state}: {slow[n].detail}")
              for n in gpu if gpu[n].state != slow[n].state}
    assert not differ, differ


def test_the_expected_verdicts(runs):
    """What each scenario is there for (at both speeds): so the matrix cannot pass by everything
    failing the same way."""
    for speed in SPEEDS:
        got = {n: v.verdict for n, v in runs[speed].items()}
        assert got == {"edge": "PASS", "edge-stall": "XFAIL", "pressure": "PASS", "prefix": "PASS",
                       "retrieval": "ERROR", "delay": "PASS", "hold-fetch": "PASS", "busy-d": "PASS"}, (speed, got)


SAMPLED = {"edge": {"idle-after"}, "pressure": {"no-stall", "idle-after"}, "prefix": {"no-stall", "idle-after"},
           "delay": {"idle-after"}, "hold-fetch": {"idle-after"},
           "busy-d": {"no-stall", "gauges-account", "idle-after"}}


@pytest.mark.parametrize("speed", list(SPEEDS))
def test_checks_of_sampled_state_say_how_many_samples(runs, speed):
    """Every check built on ``/metrics`` samples carries its count, and one that judged (ok or failed)
    judged from at least one sample, at GPU speed too."""
    for name, checks in SAMPLED.items():
        by = {c.name: c for c in runs[speed][name].checks}
        for check in checks:
            c = by[check]
            assert c.samples is not None and (c.ok is None or c.samples >= 1), (name, c)



@pytest.mark.parametrize("speed", list(SPEEDS))
def test_the_report_holds_every_sample_count(runs, speed):
    """report.json took the run (no model error), with each sampled check's count."""
    report = REPORTS[speed]
    assert not report["error"], report["error"]
    scenarios = {s["verdict"]["scenario"]: s for s in report["scenarios"]}
    for name, checks in SAMPLED.items():
        counts = {c["name"]: c["samples"] for c in scenarios[name]["verdict"]["checks"]}
        assert all(counts[c] is not None for c in checks), (name, counts)
