"""One engine for every kind: waves and store scenarios honour known issues,
kind-level evidence gaps are "not checked", kinds refuse fields they do not use, and a rig
exception inside a store batch is a rig error, not "cancelled"."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rig.config import ConfigError, ScenarioConfig, load_config
from rig.judge import wave_checks as wj
from rig.observe.observations import DrainResult, ScenarioObservation, TransferEvidence
from rig.transport.records import WaveRecord
from rig.workload import store_requests as sr
from rig.workload import wave_result as wv


def wave_sc(kind: str = "pressure-wave", **kw) -> ScenarioConfig:
    return ScenarioConfig.model_validate({"name": "w", "kind": kind, "prefill": "prefill", "decode": "decode",
                                          "prompt_tokens": 24, "max_tokens": 4,
                                          "wave": {"requests": 3, "parity_fraction": 0.5}, **kw})


def wave_of(statuses: list[str], kind: str = "pressure-wave") -> wv.WaveResult:
    res = wv.WaveResult(scenario="w", kind=kind, client="aiohttp", params={"parity_fraction": 0.5},
                        instances={"prefill": "prefill", "decode": "decode"}, max_model_len=128)
    for i, status in enumerate(statuses):
        res.records.append(WaveRecord(request_id=f"w-{i}", index=i, prompt_len=24, max_tokens=4, stream=False,
                                      outcome=status, tokens=4, usage_tokens=4, remote_request_id=f"cmpl-{i}",
                                      parity="equal" if status == "ok" else
                                      "diverged at 0: 1 != 2" if status == "parity_mismatch" else None))
    res.parity = {"compared": len(statuses), "equal": statuses.count("ok")}
    res.drains = [DrainResult("decode", True, 0.1, 0.0, {}), DrainResult("prefill", True, 0.1, 0.0, {})]
    return res


def wave_obs(answered: int, **kw) -> ScenarioObservation:
    obs = ScenarioObservation("w", "decode", "prefill", fatal_lines={"prefill": [], "decode": []},
                              kv_integrity_lines={"prefill": [], "decode": []},
                              evidence=TransferEvidence(nixl_bytes=1e5, nixl_transfers=answered,
                                                        external_prompt_tokens=24.0 * answered),
                              vllm_version="0.32.0", versions={"prefill": "0.32.0", "decode": "0.32.0"})
    for k, v in kw.items():
        setattr(obs, k, v)
    return obs


def test_a_wave_passes_on_full_evidence():
    v = wj.judge_wave(wave_sc(), wave_obs(3), wave_of(["ok"] * 3))
    assert v.verdict == "PASS", v.reason


def test_wave_kv_pulled_is_per_request():
    # Before: any external token > 0 passed. Two of three answered prompts recomputed on D now fail.
    v = wj.judge_wave(wave_sc(), wave_obs(1), wave_of(["ok"] * 3))
    kv = next(c for c in v.checks if c.name == "kv-pulled")
    assert kv.ok is False and "expected >= 72 for 3 answered prompts" in kv.detail
    assert kv.requests == ("w-0", "w-1", "w-2") and v.verdict == "FAIL"
    # D's own prefix cache counts as not recomputed
    cached = wave_obs(1, evidence=TransferEvidence(nixl_bytes=1e5, nixl_transfers=1, external_prompt_tokens=24,
                                                   cached_prompt_tokens=48))
    assert wj.judge_wave(wave_sc(), cached, wave_of(["ok"] * 3)).verdict == "PASS"
    gap = wave_obs(3, missing_metrics={"decode": ["vllm:prompt_tokens_by_source_total"]})
    v = wj.judge_wave(wave_sc(), gap, wave_of(["ok"] * 3))
    assert v.verdict == "ERROR" and v.reason.startswith("inconclusive: kv-pulled not checked: decode lacks")


def test_prefix_hits_not_checked_is_not_ok():
    res = wave_of(["ok"] * 3, kind="prefix-wave")
    res.expected_prefix_hits, res.prefix_fits = None, None
    v = wj.judge_wave(wave_sc("prefix-wave", wave={"groups": 1, "per_group": 3, "prefix_tokens": 8,
                                                   "parity_fraction": 0.5}), wave_obs(3), res)
    hits = next(c for c in v.checks if c.name == "prefix-hits")
    assert hits.ok is None and hits.detail.startswith("not checked: the expected hits are unknown")
    assert v.verdict == "ERROR" and "prefix-hits not checked" in v.reason


def test_waves_honour_a_known_issue_on_the_requests_that_show_it():
    ki = {"id": "wrong", "title": "t", "affects": ">=0.32", "symptom": {"kind": "wrong-output"}}
    sc = wave_sc(known_issue=ki)
    v = wj.judge_wave(sc, wave_obs(3), wave_of(["ok", "parity_mismatch", "ok"]))
    assert v.verdict == "XFAIL" and v.reason == "wrong: w-1 diverged from the reference", v.reason
    # an HTTP error next to it is collateral
    v = wj.judge_wave(sc, wave_obs(2), wave_of(["http_error", "parity_mismatch", "ok"]))
    assert v.verdict == "FAIL" and "no-errors" in v.reason
    assert wj.judge_wave(sc, wave_obs(3), wave_of(["ok"] * 3)).verdict == "XPASS"


def test_pdrig_wave_without_logs_shows_them_not_checked():
    bare = ScenarioObservation("w", "decode", "prefill", evidence=TransferEvidence(1e5, 3, 72.0),
                               vllm_version="0.32.0")
    v = wj.judge_wave(wave_sc(), bare, wave_of(["ok"] * 3))
    assert v.verdict == "ERROR"  # the runner's kinds require the log checks
    states = {c.name: c.ok for c in v.checks}
    assert states["no-fatal-log"] is None and states["kv-integrity"] is None
    # `pdrig wave` at bare URLs says it has no process nor log: not required, and the reason says so
    v = wj.judge_wave(wave_sc(), bare, wave_of(["ok"] * 3), unwatched=True)
    assert v.verdict == "PASS" and "alive, no-fatal-log, kv-integrity not checked, not required" in v.reason
    assert all(c.ok is None and "not required: the rig did not start these processes" in c.detail
               for c in v.checks if c.name in wj.UNWATCHED)


@pytest.mark.parametrize("kind, field, value", [
    ("pressure-wave", "tamper", "swap-prompt"),
    ("prefix-wave", "concurrent", 2),
    ("store-roundtrip", "hold_between_s", 3),
    ("retrieval", "tamper", "swap-prompt"),
])
def test_a_field_the_kind_does_not_use_is_a_load_error(tmp_path, kind, field, value):
    import yaml

    data = yaml.safe_load(Path("configs/cpu-tiny.yaml").read_text())
    data.pop("suite")
    sc = {"name": "x", "kind": kind, "prompt_tokens": 24, "max_tokens": 4, field: value}
    if kind == "retrieval":
        sc["retrieval"] = {}
    data["scenarios"] = [sc]
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=rf"scenarios\[0\]\(x\): {field}: not used by kind '{kind}'; remove it"):
        load_config(p)


def test_a_bare_symptom_name_is_refused_with_the_fix():
    with pytest.raises(Exception, match="'stall' is a bare symptom name; give its signature as a mapping"):
        ScenarioConfig(name="x", prompt_tokens=8, max_tokens=1,
                       known_issue={"id": "a", "title": "b", "affects": ">=0.32", "symptom": "stall"})
    with pytest.raises(Exception, match="fatal_log: not a valid regular expression"):
        ScenarioConfig(name="x", prompt_tokens=8, max_tokens=1,
                       known_issue={"id": "a", "title": "b", "affects": ">=0.32",
                                    "symptom": {"kind": "crash", "instance": "decode", "fatal_log": "("}})


def test_the_suites_carry_full_signatures_and_version_data():
    cfg = load_config("configs/cpu-tiny.yaml")
    e126 = next(s for s in cfg.scenarios if s.name == "edge-126")
    sig = e126.known_issue.symptom
    assert (sig.kind, sig.instance, sig.waiting_reason, sig.kv_fetch_stage, sig.kv_usage_max, sig.admission) == (
        "stall", "decode", "capacity", "waiting_to_start", 0.05, "fits-but-waits")
    e127 = next(s for s in cfg.scenarios if s.name == "edge-127-6blk")
    assert e127.expect.for_version("0.27.1").http_status == 400
    assert e127.expect.for_version("0.30.0").http_status == 400
    assert e127.expect.for_version("0.32.0").completion_tokens == 1
    lease = load_config("configs/cpu-tiny.yaml", ["suite=suites/lease.yaml", "nixl.kv_lease_duration=5"])
    expired = next(s for s in lease.scenarios if s.name == "lease-expired-read")
    assert expired.known_issue.symptom.kind == "stale-kv" and expired.known_issue.symptom.parity


def test_a_rig_exception_in_a_store_batch_is_raised_not_cancelled(monkeypatch, tmp_path):
    from rig.transport.records import PDRecord

    async def boom(ctx, rec, route):
        raise KeyError("the rig's own bug")

    async def no_watch(ctx, sc, recs, tasks, done, so=None):
        await done.wait()
        return ""

    monkeypatch.setattr(sr, "send", boom)
    monkeypatch.setattr(sr, "watch_decode", no_watch)

    class Ctx:
        def deadline(self, sc):
            return 5.0

    recs = [PDRecord("s-0", 8, 1), PDRecord("s-1", 8, 1)]
    with pytest.raises(KeyError, match="the rig's own bug"):
        asyncio.run(sr.run_batch(Ctx(), None, recs, ["pd", "pd"], 2))
