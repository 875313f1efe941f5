"""Evidence the rig gathers must exist (issue #9, items 5-8): log sources, instance deaths, versions,
metric presence, port reservations and rig exceptions, on fake vLLM servers (tests/fake_vllm.py).

A check that could not look is "not checked", never ok: these tests assert that the observation
says what could not be gathered and why, not only that the happy path works.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import fake_config, kill_pids, scenario, wait_no_survivors, write_config

from rig.cluster import Cluster, ClusterError
from rig.config import load_config
from rig.logs import FileLog
from rig.plan import build_plan
from rig.runner import SuiteRunner, new_run_dir, resolve_model


@pytest.fixture()
def base(tmp_path) -> Path:
    """Per-test directory; every fake server of the test has it in its argv."""
    yield tmp_path
    left = wait_no_survivors(str(tmp_path), within_s=10)
    kill_pids(left)
    assert left == {}, f"fake servers survived the run: {left}"


def _cfg(tmp: Path, overrides: list[str] | None = None, **kw):
    tmp.mkdir(parents=True, exist_ok=True)
    return load_config(write_config(tmp, fake_config(tmp, **kw)), overrides or [])


def _run(cfg, attach: bool = False, log_sources=None):
    run_dir = new_run_dir(cfg)
    return SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True, attach=attach,
                       log_sources=log_sources).run(), run_dir


# ------------------------------------------------------------------ log sources (Cluster hook)


def test_log_source_defaults_to_the_plan_log_file_and_is_none_when_attached(tmp_path):
    cfg = _cfg(tmp_path)
    plan = build_plan(cfg, tmp_path / "run", "model", sys.executable)
    with Cluster(plan, 30, 3) as launched:
        src = launched.log_source("decode")
        assert isinstance(src, FileLog) and src.path == plan.by_name("decode").log_path
        with pytest.raises(KeyError):
            launched.log_source("no-such-instance")
    with Cluster(plan, 30, 3, attach=True) as attached:
        assert attached.log_source("decode") is None  # nobody said where the log is
    given = FileLog("decode", str(tmp_path / "elsewhere.log"))
    with Cluster(plan, 30, 3, attach=True, log_sources={"decode": given}) as attached:
        assert attached.log_source("decode") is given and attached.log_source("prefill") is None


def test_log_source_for_an_unknown_instance_is_refused(tmp_path):
    plan = build_plan(_cfg(tmp_path), tmp_path / "run", "model", sys.executable)
    with pytest.raises(ClusterError, match=r"instances the plan does not have: \['decod'\]"):
        Cluster(plan, 30, 3, log_sources={"decod": FileLog("decod", "x.log")})


def test_attach_without_log_sources_leaves_logs_unscanned_and_with_a_source_scans_it(base):
    """--attach: the rig did not launch the servers, so without a source their logs cannot be
    read ("not checked"); given a source, the fatal line the decode writes is found."""
    cfg = _cfg(base, decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "fatal-log"}}},
               scenarios=[scenario("one", "decode"), scenario("two", "decode")])
    outside = Cluster(build_plan(cfg, base / "outside", resolve_model(cfg), sys.executable), 30, 3)
    try:
        outside.start(["prefill", "decode"])
        sources = {n: FileLog(n, outside.plan.by_name(n).log_path) for n in ("prefill", "decode")}
        result, _ = _run(cfg, attach=True, log_sources=sources)
        one, two = result.observations
        assert one.unscanned_logs == {} and two.unscanned_logs == {}
        # The fake logs its fatal line once, after its first completion (this run's warm-up):
        # the phase's first scenario sees it, the second does not see it again.
        assert any("Cannot get 3 free blocks" in ln for ln in one.fatal_lines["decode"])
        assert two.fatal_lines == {"prefill": [], "decode": []}
        result, _ = _run(cfg, attach=True)
        for obs in result.observations:
            assert set(obs.unscanned_logs) == {"prefill", "decode"}
            assert obs.unscanned_logs["decode"].startswith("no log source given")
            assert obs.fatal_lines == {}  # nothing claimed about logs nobody read
    finally:
        outside.stop_all()


def test_a_log_that_disappears_is_unscanned_not_clean(base):
    """A launched instance whose log file vanished mid-run (rotated, deleted): the scenario
    after it says 'cannot read file ...', never 'no fatal line'."""
    cfg = _cfg(base, decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "fatal-log"}}},
               scenarios=[scenario("first", "decode"), scenario("second", "decode")])
    run_dir = new_run_dir(cfg)
    runner = SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True)
    decode_log = run_dir / "logs" / "decode.log"
    real_scan = runner._scan_logs

    def scan_then_delete(cluster, obs):
        real_scan(cluster, obs)
        if obs.scenario == "first":
            decode_log.unlink()

    runner._scan_logs = scan_then_delete
    result = runner.run()
    first, second = result.observations
    assert first.unscanned_logs == {}
    assert any("Cannot get 3 free blocks" in ln for ln in first.fatal_lines["decode"])
    assert second.unscanned_logs == {"decode": f"cannot read file {decode_log}"}
    assert "decode" not in second.fatal_lines and second.fatal_lines["prefill"] == []
    assert not os.path.exists(decode_log)
