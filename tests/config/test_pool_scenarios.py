"""The sizing the pool scenarios rely on (configs/cpu-regressions.yaml, suites/regressions.yaml;
bug record R01 and R11's P side): a config edit that loses the condition the scenario is about fails
here, before a 2-minute live run quietly passes without exercising it."""

from __future__ import annotations

import json
from pathlib import Path

from rig.config import load_config
from rig.plan.processes import build_plan

ROOT = Path(__file__).resolve().parents[2]


def _blocks(tokens: int, bs: int) -> int:
    return -(-tokens // bs)


def _scenario(cfg, name: str):
    return next(s for s in cfg.scenarios if s.name == name)


def test_r01_two_prompts_fill_decodes_pool_exactly_with_a_lookahead_spec_method(tmp_path):
    cfg = load_config(ROOT / "configs" / "cpu-regressions.yaml")
    sc = _scenario(cfg, "r01-spec-two-loads-fill-pool")
    p, d = cfg.instance(sc.prefill), cfg.instance(sc.decode)
    assert sc.concurrent == 2
    usable = d.num_gpu_blocks_override - 1  # vLLM's null block
    # bug record R01: the two prompts' blocks sum to the usable pool, and each prompt ends on a block edge,
    # so the spec step (1 + k + lookahead tokens) needs a block beyond the prompt's.
    assert sc.concurrent * _blocks(sc.prompt_tokens, cfg.block_size) == usable
    assert sc.prompt_tokens % cfg.block_size == 0
    # The smallest pool D starts with under max_model_len (docs/explanation/vllm-cpu-facts.md), and both
    # requests fit max_model_len.
    assert usable * cfg.block_size >= cfg.max_model_len >= sc.prompt_tokens + sc.max_tokens
    # A method with lookahead (ngram has none), the same on P (a draft on D only is refused at
    # the NIXL handshake: r09-draft-on-d-only).
    assert d.speculative is not None and d.speculative.method == "draft_model"
    assert p.speculative == d.speculative and sc.expect.min_spec_drafts
    spec = json.loads(_arg(build_plan(cfg, tmp_path, "/m", "/py"), d.name, "--speculative-config"))
    assert spec == {"method": "draft_model", "model": "/m", "num_speculative_tokens": 2}


def _arg(plan, name: str, flag: str) -> str:
    argv = list(plan.by_name(name).argv)
    return argv[argv.index(flag) + 1]


def test_r11_prefill_pool_and_step_budget_make_the_prefill_preempt(tmp_path):
    cfg = load_config(ROOT / "configs" / "cpu-regressions.yaml")
    sc = _scenario(cfg, "r11-prefill-preempts")
    p = cfg.instance(sc.prefill)
    bs = cfg.block_size
    usable = p.num_gpu_blocks_override - 1
    budget = int(_arg(build_plan(cfg, tmp_path, "/m", "/py"), p.name, "--max-num-batched-tokens"))
    per_prompt = _blocks(sc.prompt_tokens, bs)
    # One prompt fits, two do not (bug record R11: P's pool ~1.2 prompts), and more than one is sent.
    assert per_prompt <= usable < 2 * per_prompt and sc.concurrent >= 2
    # Prompt A takes two steps (budget, then the rest); in its second step the leftover budget
    # admits B's first chunk, which must find a free block, and B's next chunk must not.
    assert budget < sc.prompt_tokens
    leftover = budget - (sc.prompt_tokens - budget)
    assert leftover > 0
    b_first = _blocks(leftover, bs)
    assert per_prompt + b_first <= usable < per_prompt + _blocks(leftover + budget, bs)
    assert sc.expect.min_preemptions and sc.expect.min_preemptions_on == "prefill"
    # 0.32.0 admits only prompts that fit whole (scheduler_reserve_full_isl): B's first chunk is
    # admitted alone only without it.
    assert "--no-scheduler-reserve-full-isl" in build_plan(cfg, tmp_path, "/m", "/py").by_name(p.name).argv
