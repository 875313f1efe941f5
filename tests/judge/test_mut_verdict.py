"""kv-pulled and the canary's catch as the user reads them (rig/judge/verdict.py): the prompt D
served is D's ``usage.prompt_tokens`` (a chat template adds tokens), else the prompt the rig sent;
NIXL's exact bytes count every prompt's blocks of a several-prompt request; the detail names P's
side channel where D connected; a canary's catch quotes D's error up to 120 characters.
Written against `make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

from rig.judge.verdict import _kv_pulled, canary_match, judge
from rig.observe.observations import TransferEvidence
from test_verdict import error_record, obs_of, ok_record, sc

BLOCK = 32_768  # bytes of one 32-token block (the tiny model at float32)


def ev(tokens: float, nbytes: float = 65536.0, transfers: float = 1) -> TransferEvidence:
    return TransferEvidence(nixl_bytes=nbytes, nixl_transfers=transfers, external_prompt_tokens=tokens)


# ------------------------------------------------------------------------- what D served

def test_the_prompt_d_served_is_its_usage_prompt_tokens_when_it_reports_them():
    rec = ok_record(n=126)
    rec.decode.usage = {**rec.decode.usage, "prompt_tokens": 131}  # a chat template's 5 tokens
    assert _kv_pulled(obs_of([rec], evidence=ev(131))).ok is True
    c = _kv_pulled(obs_of([rec], evidence=ev(126)))  # the 5 template tokens were not pulled
    assert c.ok is False and "external_kv_transfer + local_cache_hit = +131" in c.detail


def test_without_ds_usage_the_prompt_is_the_tokens_the_rig_sent():
    rec = ok_record(n=126)
    rec.decode.usage = None
    assert _kv_pulled(obs_of([rec], evidence=ev(126))).ok is True
    rec.decode.usage = {"completion_tokens": 2}  # usage without prompt_tokens
    c = _kv_pulled(obs_of([rec], evidence=ev(125)))
    assert c.ok is False and "= +126" in c.detail


def test_the_exact_bytes_of_a_single_prompt_use_ds_prompt_tokens():
    rec = ok_record(n=60)
    rec.decode.usage = {**rec.decode.usage, "prompt_tokens": 70}  # 3 blocks of 32, not 2
    c = _kv_pulled(obs_of([rec], evidence=ev(70, 3 * BLOCK), kv_bytes_per_block=BLOCK, block_size=32))
    assert c.ok is True and "nixl 98304 B (3 blocks x 32768 B)" in c.detail, c.detail


def test_the_exact_bytes_of_several_prompts_count_each_prompts_blocks():
    rec = ok_record(n=100)
    rec.prompt = [[1] * 40, [2] * 60]  # 2 + 2 blocks; their sum, 100 tokens, would be 4 blocks too
    rec.decode.usage = {"prompt_tokens": 100, "completion_tokens": 2, "total_tokens": 102}
    obs = obs_of([rec], evidence=ev(100, 4 * BLOCK, transfers=2), kv_bytes_per_block=BLOCK, block_size=32)
    c = _kv_pulled(obs)
    assert c.ok is True and "(4 blocks x 32768 B) in >= 2 transfers" in c.detail, c.detail
    rec.prompt = [[1] * 33, [2] * 33]  # 2 + 2 blocks, while 66 tokens together fill only 3
    rec.decode.usage = {"prompt_tokens": 66, "completion_tokens": 2, "total_tokens": 68}
    obs = obs_of([rec], evidence=ev(66, 4 * BLOCK, transfers=2), kv_bytes_per_block=BLOCK, block_size=32)
    c = _kv_pulled(obs)
    assert c.ok is True and "nixl 131072 B (4 blocks x 32768 B)" in c.detail, c.detail
    obs.evidence = ev(66, 3 * BLOCK, transfers=2)  # a block short
    assert _kv_pulled(obs).ok is False


def test_a_pulled_detail_reads_in_full():
    c = _kv_pulled(obs_of([ok_record()], evidence=ev(126)))
    assert c.detail == ("D: external_kv_transfer +126, local_cache_hit +0, local_compute +0, nixl 65536 B in 1 "
                        "transfers; expected pulled: external_kv_transfer + local_cache_hit = +126, local_compute +0, "
                        "nixl bytes > 0 in >= 1 transfers; per request (edge-126-0 ran alone)")


# ------------------------------------------------------------------------- P's side channel

def _with_side_channel(i: int, host: str | None, port: int | None = 5600):
    rec = ok_record(i)
    rec.prefill.kv_transfer_params = {**rec.prefill.kv_transfer_params, "remote_host": host, "remote_port": port}
    return rec


def test_the_detail_names_each_side_channel_p_advertised_once():
    recs = [_with_side_channel(0, "prefill", 5600), _with_side_channel(1, "prefill", 5600),
            _with_side_channel(2, "prefill-b", 5601)]
    c = _kv_pulled(obs_of(recs, evidence=ev(378, transfers=3)))
    assert c.ok is True
    assert c.detail.endswith("(not per request); P's side channel prefill:5600, prefill-b:5601"), c.detail


def test_no_side_channel_is_named_when_p_advertised_no_host():
    c = _kv_pulled(obs_of([_with_side_channel(0, None)], evidence=ev(126)))
    assert c.detail.endswith("per request (edge-126-0 ran alone)"), c.detail
    rec = ok_record()
    rec.prefill.kv_transfer_params = None
    assert _kv_pulled(obs_of([rec], evidence=ev(126))).detail.endswith("ran alone)")


# ------------------------------------------------------------------------- canary

def test_a_catch_by_ds_error_quotes_its_first_120_characters():
    rec = error_record(status=500, msg="x" * 200)
    m = canary_match(obs_of([rec], parity=[None]), [])
    assert m.seen == "decode HTTP 500: HTTP 500: " + "x" * 110  # D's error "HTTP 500: xxx...", cut at 120
    v = judge(sc(tamper="swap-prompt"), obs_of([rec], parity=[None]))
    assert (v.verdict, v.reason) == ("PASS", "tampering caught by decode HTTP 500: HTTP 500: " + "x" * 110)


# ------------------------------------------------------------------------- edge_checks

def _expect(**kw) -> dict:
    return {"completion_tokens": 2, "total_tokens": 128, **kw}


def test_a_declared_recompute_is_judged_in_the_recomputed_form():
    obs = obs_of([ok_record()], evidence=TransferEvidence(computed_prompt_tokens=126))
    v = judge(sc(expect=_expect(prompt_source="recomputed")), obs)
    kv = next(c for c in v.checks if c.name == "kv-pulled")
    assert kv.ok is True and "expected recomputed (declared): local_compute +126" in kv.detail
    assert v.verdict == "PASS", v.reason
    # the same evidence under the default (pulled) expectation is a failure
    assert judge(sc(), obs).verdict == "FAIL"


def test_preemptions_are_read_on_decode_unless_another_instance_is_named():
    v = judge(sc(expect=_expect(min_preemptions=1)), obs_of([ok_record()], evidence=None))
    pre = next(c for c in v.checks if c.name == "preempted")
    assert (pre.ok, pre.detail) == (None, "not checked: no decode metrics")
    assert v.verdict == "ERROR" and "preempted not checked: no decode metrics" in v.reason
