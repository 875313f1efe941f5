"""The rig's log markers: a stop marker before teardown, and log checks that stop reading there."""

from __future__ import annotations

import sys
from pathlib import Path

from rig.cluster.logs import (
    FATAL_PATTERNS,
    FileLog,
    first_fatal_line,
    matching_lines,
    start_marker,
    stop_marker,
    until_stop_marker,
)
from rig.cluster.processes import Cluster
from rig.config import load_config
from rig.plan.processes import build_plan
from rig.run.runner import resolve_model
from tests.helpers.fake_rig import fake_config, write_config
from tests.helpers.survivors import kill_pids, wait_no_survivors

TEARDOWN = "Traceback (most recent call last):\nEngineDeadError: EngineCore encountered an issue\n"


def test_until_stop_marker_drops_the_teardown_only():
    before = "INFO ready\nERROR Cannot get 3 free blocks from the pool\n"
    text = before + stop_marker("decode") + TEARDOWN
    assert until_stop_marker(text) == before
    assert matching_lines(text, FATAL_PATTERNS) == ["ERROR Cannot get 3 free blocks from the pool"]


def test_until_stop_marker_keeps_a_restart_into_the_same_log():
    # A server started again after a stop appends to the same log: its lines count again.
    restart = start_marker("decode", 42) + "Traceback (most recent call last):\n"
    text = "a\n" + stop_marker("decode") + TEARDOWN + restart
    assert until_stop_marker(text) == "a\n" + restart
    assert matching_lines(text, FATAL_PATTERNS) == ["Traceback (most recent call last):"]


def test_text_without_marker_is_unchanged():
    assert until_stop_marker(TEARDOWN) == TEARDOWN
    assert len(matching_lines(TEARDOWN, FATAL_PATTERNS)) == 2


def test_stop_writes_the_marker_before_the_servers_teardown_lines(tmp_path: Path):
    # The fake logs an EngineDeadError traceback when it gets SIGTERM, as vLLM's decode does.
    data = fake_config(tmp_path)
    data["launch"]["env"]["FAKE_VLLM_FAULT"] = "teardown-traceback"
    cfg = load_config(write_config(tmp_path, data))
    plan = build_plan(cfg, tmp_path / "run", resolve_model(cfg), sys.executable)
    try:
        with Cluster(plan, startup_timeout_s=30, grace_s=3) as cluster:
            cluster.start(["prefill", "decode"])
            cluster.stop(["decode"])
    finally:
        kill_pids(wait_no_survivors(str(tmp_path), within_s=10))
    log = Path(plan.by_name("decode").log_path).read_text()
    lines = log.splitlines()
    started = next(i for i, ln in enumerate(lines) if ln.startswith("pdrig: starting decode (pid "))
    marker = next(i for i, ln in enumerate(lines) if ln.startswith("pdrig: stopping decode (SIGTERM) at 20"))
    traceback_at = next(i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln)
    assert started < marker < traceback_at, log
    assert "EngineDeadError" in log
    # Reading the log (as rig.observe.evidence.LogScanner does) ignores the teardown the rig caused.
    src = FileLog("decode", plan.by_name("decode").log_path)
    assert matching_lines(src.since(0) or "", FATAL_PATTERNS) == []


def test_a_fatal_line_followed_by_a_traceback_names_the_exception_that_ended_it():
    # vLLM 0.27.1's API server with prompt_logprobs on the decode hop (bug record R23), as logged 2026-12-01
    p = "(APIServer pid=10082) ERROR 12-01 17:59:21 [async_llm.py:724] "
    text = "\n".join([
        p + "AsyncLLM output_handler failed.",
        p + "Traceback (most recent call last):",
        p + '  File "vllm/v1/engine/async_llm.py", line 695, in output_handler',
        p + "    processed_outputs = output_processor.process_outputs(",
        p + "OverflowError: number too small to fit in target type",
        p + "next line"])
    line = first_fatal_line(text, ("output_handler failed",))
    assert line == (p + "AsyncLLM output_handler failed. -> " + p
                    + "OverflowError: number too small to fit in target type").strip()
    # a fatal line without a traceback after it stays as it is
    assert first_fatal_line(p + "AsyncLLM output_handler failed.\n" + p + "other", ("output_handler failed",)) \
        == (p + "AsyncLLM output_handler failed.").strip()
