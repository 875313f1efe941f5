"""Triage by mechanism, without servers (rig.explore.mechanism, rig.explore.known): a death is its
exception and first fatal frame, a stall its scheduler state, a divergence its hop, position and KV
source; the known issues of the shipped suites match on that (the livelock behind a D prefix hit or
after an appended token, the two-prompts issue whatever the other fields, the decode assert), say
why, and anything else is new."""

from __future__ import annotations

from pathlib import Path

import pytest

from rig.config import ConfigError, RigConfig
from rig.explore.grammar import Topology
from rig.explore.known import load_known, match_known
from rig.explore.mechanism import death_site, mechanism_of
from rig.judge.checks import Check
from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation, TransferEvidence
from rig.observe.parity import ParityResult
from rig.transport.records import Hop, PDRecord, StallFacts
from tests.helpers.fake_rig import fake_config

ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
TOPO = Topology(prefill="prefill", decode="decode", block_size=32, max_model_len=128, usable_blocks=4, spec_tokens=1)
ROLES = {"prefill": "prefill", "decode": "decode"}
SUITES = [str(ROOT / "configs" / "suites" / f) for f in ("edge.yaml", "regressions.yaml", "faults.yaml")]


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    cfg = RigConfig.model_validate(fake_config(tmp_path_factory.mktemp("known")))
    return load_known(cfg, SUITES)


def test_a_death_is_its_exception_and_first_fatal_frame():
    assert death_site((DATA / "vllm-0.30.0-decode-ngram-crash.log").read_text()) == \
        ("TypeError", "vllm/model_executor/warmup/jit_warmup_triton_helper.py:_kernel_arg_names")
    assert death_site((DATA / "vllm-0.32.0-decode-recompute-p-killed.log").read_text()) == \
        ("nixlRemoteDisconnectError", "nixl_cu12/_api.py:check_xfer_state")


def stalled(prompt: int, decode_prompt: int | None = None, running: float = 0, reason: str = "capacity",
            cached: float = 0) -> tuple[ScenarioVerdict, ScenarioObservation]:
    r = PDRecord(request_id="x1-s1-0", prompt_len=prompt, max_tokens=1, prompt=list(range(prompt)))
    r.outcome = "stalled"
    if decode_prompt is not None:
        r.decode_prompt = list(range(decode_prompt))
    r.stall = StallFacts(instance="decode", waiting=1, running=running, kv_usage=0.0,
                         waiting_reasons={reason: 1}, kv_fetch_stages={"waiting_to_start": 1}, duration_s=4)
    obs = ScenarioObservation(scenario="x1", decode="decode", prefill="prefill", records=[r],
                              evidence=TransferEvidence(cached_prompt_tokens=cached))
    return ScenarioVerdict("x1", "FAIL", "pass", "stalled", [Check("no-stall", False, "stalled", ("x1-s1-0",))]), obs


@pytest.mark.parametrize("shape", ["plain 97", "after a D prefix hit", "after the router appended P's token"])
def test_the_livelock_is_the_livelock_whatever_led_to_it(shape, known):
    v, obs = {"plain 97": stalled(97), "after a D prefix hit": stalled(96, cached=32),
              "after the router appended P's token": stalled(96, decode_prompt=97)}[shape]
    m = mechanism_of(v, obs, TOPO, ROLES, "FAIL - [stalled]")
    assert m.key == "stall:decode:waiting=capacity:fetch=waiting_to_start:running=0:fits-but-waits"
    hit = match_known(m, known, "0.32.0")
    assert hit is not None and hit.id == "spec-admission-livelock" and hit.in_range
    assert "waiting_reason capacity" in hit.why and "admission fits-but-waits" in hit.why
    assert match_known(m, known, "0.27.1").label() == "spec-admission-livelock (outside affects)"


def test_another_stall_is_another_mechanism_and_new(known):
    v, obs = stalled(40, running=1, reason="deferred")
    m = mechanism_of(v, obs, TOPO, ROLES, "FAIL - [stalled]")
    assert m.key == "stall:decode:waiting=deferred:fetch=waiting_to_start:running=1:fits"
    assert match_known(m, known, "0.32.0") is None


def diverged(prompts: int, choice: int | None, appended: bool = False) -> tuple[ScenarioVerdict, ScenarioObservation]:
    prompt = [list(range(96))] * prompts if prompts > 1 else list(range(96))
    r = PDRecord(request_id="x1-0", prompt_len=96, max_tokens=2, prompt=prompt)
    r.prefill, r.decode = Hop(instance="prefill", status=200), Hop(instance="decode", status=200, token_ids=[1, 2])
    if appended:
        r.decode_prompt = list(range(97))
    obs = ScenarioObservation(scenario="x1", decode="decode", prefill="prefill", records=[r],
                              parity=[ParityResult("diverged", position=0, pd_token=1, ref_token=5, choice=choice)],
                              evidence=TransferEvidence(external_prompt_tokens=96))
    return ScenarioVerdict("x1", "FAIL", "pass", "diverged", [Check("parity", False, "diverged", ("x1-0",))]), obs


def test_two_prompts_diverging_on_a_later_choice_is_the_known_issue_whatever_the_fields(known):
    v, obs = diverged(2, choice=1)
    m = mechanism_of(v, obs, TOPO, ROLES, "FAIL parity []")
    assert m.key == "divergence:decode:pos=0:choice=1:kv=pulled"
    hit = match_known(m, known, "0.32.0")
    assert hit is not None and hit.id == "completions-prompts-share-first-params"
    assert "choice 1 of a 2-prompt request" in hit.why


def test_a_divergence_of_one_prompt_is_new_unless_appended(known):
    v, obs = diverged(1, choice=None)
    assert match_known(mechanism_of(v, obs, TOPO, ROLES, "FAIL parity []"), known, "0.32.0") is None
    v, obs = diverged(1, choice=None, appended=True)
    m = mechanism_of(v, obs, TOPO, ROLES, "FAIL parity []")
    assert m.key.endswith(":appended")
    assert match_known(m, known, "0.32.0").id == "router-appended-first-token"


def test_the_decode_assert_is_a_death_matched_by_its_fatal_line(known):
    line = ("(EngineCore pid=1) ERROR 12-01 10:00:00 [core.py:1512] EngineCore encountered a fatal error. -> "
            "AssertionError: assert num_decode_blocks <= len(prefill_group)")
    obs = ScenarioObservation(scenario="x1", decode="decode", prefill="prefill", dead={"decode": 1},
                              death_lines={"decode": line})
    v = ScenarioVerdict("x1", "FAIL", "pass", "died", [Check("alive", False, "decode died")])
    m = mechanism_of(v, obs, TOPO, ROLES, "FAIL - [died:decode]")
    assert m.kind == "death" and m.key.startswith("death:decode:AssertionError@")
    hit = match_known(m, known, "0.32.0")
    assert hit is not None and hit.id == "router-appended-first-token" and "fatal line matching" in hit.why


def test_the_cpu_generator_death_on_prefill_is_matched_to_its_known_issue(known):
    # What the explorer recorded (2026-12-04): P's EngineCore died rewinding a seeded request's
    # generator after a chunked prefill.
    line = ("RuntimeError: CPU Generator does not use offset (first fatal line: (EngineCore pid=1) ERROR "
            "12-04 21:06:34 [core.py:1512] EngineCore encountered a fatal error.)")
    log = ("Traceback (most recent call last):\n"
           '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 3502, in _bookkeeping_sync\n'
           "    gen.set_offset(gen.get_offset() - 4)\nRuntimeError: CPU Generator does not use offset\n")
    obs = ScenarioObservation(scenario="x2", decode="decode", prefill="prefill", dead={"prefill": 0},
                              death_lines={"prefill": line})
    v = ScenarioVerdict("x2", "FAIL", "pass", "died", [Check("alive", False, "prefill died")])
    m = mechanism_of(v, obs, TOPO, ROLES, "FAIL - [died:prefill]", logs={"prefill": log})
    assert m.key == "death:prefill:RuntimeError@vllm/v1/worker/gpu_model_runner.py:_bookkeeping_sync", m.key
    hit = match_known(m, known, "0.32.0")
    assert hit is not None and hit.id == "cpu-seeded-chunked-prefill-death" and hit.in_range
    on_decode = ScenarioObservation(scenario="x3", decode="decode", prefill="prefill", dead={"decode": 0},
                                    death_lines={"decode": line})
    m2 = mechanism_of(v, on_decode, TOPO, ROLES, "FAIL - [died:decode]", logs={"decode": log})
    other = match_known(m2, known, "0.32.0")  # the role is part of the known issue: not this one on D
    assert other is None or other.id != "cpu-seeded-chunked-prefill-death"


def test_known_suites_are_read_with_the_one_loader(tmp_path):
    cfg = RigConfig.model_validate(fake_config(tmp_path))
    dup = tmp_path / "dup.yaml"
    dup.write_text("- name: a\n  name: b\n")
    with pytest.raises(ConfigError, match="appears twice"):
        load_known(cfg, [str(dup)])
    with pytest.raises(ConfigError, match="--known"):
        load_known(cfg, [str(tmp_path / "missing.yaml")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: a\n  known_issue: {id: x, title: t, affects: '>=1', symptom: {kind: nope}}\n")
    with pytest.raises(ConfigError, match="known_issue does not validate"):
        load_known(cfg, [str(bad)])


def test_an_error_that_could_not_look_is_not_judged_and_a_failure_or_a_death_is():
    """ERROR with nothing failed (a required check not checked) is no finding; a failed check, or a
    dead instance, under an ERROR verdict still is."""
    from rig.explore.oracles import could_not_judge
    from rig.explore.report import new_report
    from rig.explore.settings import ExploreSettings
    from rig.report.explore_model import NotJudgedReport
    from rig.report.explore_render import render_md
    obs = ScenarioObservation(scenario="x1", decode="decode", prefill="prefill")
    gap = ScenarioVerdict("x1", "ERROR", "pass", "inconclusive: no-stall not checked: D was never sampled",
                          [Check("no-stall", None, "not checked: D was never sampled"), Check("parity", True, "equal")])
    assert could_not_judge(gap, obs)
    failed = ScenarioVerdict("x1", "ERROR", "pass", "inconclusive", [*gap.checks, Check("parity", False, "diverged")])
    assert not could_not_judge(failed, obs)
    dead = ScenarioObservation(scenario="x1", decode="decode", prefill="prefill", dead={"decode": -9})
    assert not could_not_judge(gap, dead)
    assert not could_not_judge(ScenarioVerdict("x1", "FAIL", "pass", "diverged", failed.checks), obs)
    r = new_report("c", ExploreSettings(seed=1), Path("r"))
    r.not_judged = [NotJudgedReport(action=27, reason=gap.reason)]
    md = render_md(r)
    assert "## Not judged" in md and "| 27 | inconclusive: no-stall not checked" in md and "none found" in md


def n_on_decode(choice: int | None, p_children: int = 1) -> tuple[ScenarioVerdict, ScenarioObservation]:
    """A one-prompt request with n: 3 on the decode hop (F01's shape): a divergence on ``choice``,
    or (None) a stale read alone: P's invalid-blocks line, every choice equal."""
    r = PDRecord(request_id="x1-0", prompt_len=64, max_tokens=2, prompt=list(range(64)))
    r.prefill = Hop(instance="prefill", status=200, token_ids=[1] * p_children,
                    choices=[[1]] * p_children if p_children > 1 else None)
    r.decode = Hop(instance="decode", status=200, token_ids=[1, 2] * 3, choices=[[1, 2]] * 3)
    parity = ParityResult("diverged", position=0, pd_token=1, ref_token=5, choice=choice) if choice is not None \
        else ParityResult("equal")
    obs = ScenarioObservation(scenario="x1", decode="decode", prefill="prefill", records=[r], parity=[parity],
                              evidence=TransferEvidence(external_prompt_tokens=160))
    failed = [Check("parity", False, "diverged", ("x1-0",))] if choice is not None else []
    failed.append(Check("kv-integrity", False, "1 answered request(s) read KV blocks prefill had released",
                        ("x1-0",)))
    return ScenarioVerdict("x1", "FAIL", "pass", "stale", failed), obs


def test_n_on_the_decode_hop_is_its_own_mechanism_and_matches_its_known_issue(known):
    v, obs = n_on_decode(choice=2)
    m = mechanism_of(v, obs, TOPO, ROLES, "FAIL parity kv-integrity []")
    assert m.key == "divergence:decode:pos=0:choice=2:kv=pulled:decode-n=3"
    hit = match_known(m, known, "0.32.0")
    assert hit is not None and hit.id == "nixl-decode-children-read-freed-blocks" and hit.in_range
    assert "choice 2 of a request with n=3 on the decode hop only" in hit.why
    v, obs = n_on_decode(choice=None)
    m = mechanism_of(v, obs, TOPO, ROLES, "FAIL kv-integrity []")
    assert m.key == "stale-read:kv-integrity:decode-n"
    assert match_known(m, known, "0.32.0").id == "nixl-decode-children-read-freed-blocks"


def test_choice_0_or_n_on_the_prefill_hop_is_not_the_decode_children_issue(known):
    v, obs = n_on_decode(choice=0)
    hit = match_known(mechanism_of(v, obs, TOPO, ROLES, "FAIL parity []"), known, "0.32.0")
    assert hit is None or hit.id != "nixl-decode-children-read-freed-blocks"
    v, obs = n_on_decode(choice=2, p_children=3)
    hit = match_known(mechanism_of(v, obs, TOPO, ROLES, "FAIL parity []"), known, "0.32.0")
    assert hit is None or hit.id != "nixl-decode-children-read-freed-blocks"


def test_a_stale_read_with_no_hold_and_no_n_is_new(known):
    v, obs = n_on_decode(choice=None)
    obs.records[0].decode.choices = None
    m = mechanism_of(v, obs, TOPO, ROLES, "FAIL kv-integrity []")
    assert m.key == "stale-read:kv-integrity" and match_known(m, known, "0.32.0") is None


def slow_decode(decode_s: float, ttft_s: float | None = None,
                held_s: float = 0.0) -> tuple[ScenarioVerdict, ScenarioObservation]:
    """One answered 12-token P/D request whose decode hop took ``decode_s`` (a 0.01 s baseline:
    the 5 s floor is the bound), judged by the latency check as the edge kind judges it."""
    from rig.judge.latency import latency_check

    r = PDRecord(request_id="x1-0", prompt_len=12, max_tokens=2, prompt=list(range(12)), outcome="ok")
    r.prefill = Hop(instance="prefill", status=200, latency_s=0.02, token_ids=[7])
    r.decode = Hop(instance="decode", status=200, latency_s=decode_s, ttft_s=ttft_s, token_ids=[1, 2],
                   usage={"prompt_tokens": 12, "completion_tokens": 2})
    obs = ScenarioObservation(scenario="x1", decode="decode", prefill="prefill", records=[r],
                              baseline_request_s=0.01)
    c = latency_check(obs, held_s)
    return ScenarioVerdict("x1", "FAIL" if c.ok is False else "PASS", "pass", c.detail, [c]), obs


def test_a_hop_past_the_latency_bound_is_the_slow_mechanism_of_its_hop_and_part(known):
    v, obs = slow_decode(12.0)
    m = mechanism_of(v, obs, TOPO, ROLES, "FAIL latency []")
    assert (m.kind, m.key) == ("slow", "slow:decode:total")
    assert m.evidence["wait_s"] == 12.0 and m.evidence["bound_s"] == 5.0 and m.evidence["request"] == "x1-0"
    assert m.evidence["bound"].startswith("timeouts.latency_floor_s, at least; 20 x the measured request 0.01 s")
    assert match_known(m, known, "0.32.0") is None  # no shipped known issue is a slow hop: new
    v, obs = slow_decode(12.1, ttft_s=12.0)  # streamed: it waited before its first token
    assert mechanism_of(v, obs, TOPO, ROLES, "FAIL latency []").key == "slow:decode:first-token"
    # the seconds are not in the key: a slower run of the same wait is the same finding
    assert mechanism_of(*slow_decode(25.0), TOPO, ROLES, "FAIL latency []").key == "slow:decode:total"


def test_a_latency_failure_judged_again_without_its_hold_is_not_made_slow():
    v, obs = slow_decode(12.0)
    # the action held its decode hop: judged with the hold, the hop is left out and no slow key comes
    m = mechanism_of(v, obs, TOPO, ROLES, "FAIL latency []", held_s=2.0)
    assert m.kind == "checks" and m.key == "checks:FAIL latency []"
