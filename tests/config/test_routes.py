"""Router transforms and routes as data (rig/config/routes.py, rig/config/sequence.py) and the pure
transform (rig.transport.hops.derive_decode): each bad input is one error naming the field and the
fix; `pdrig config --explain` lists the new fields with their defaults (golden lines); the
appended-token signature excuses only its own symptoms (rig/judge/signatures.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rig.config import ScenarioConfig
from rig.config.help import explain
from rig.config.routes import RouterConfig, Transform
from rig.config.topology import RigConfig
from rig.judge.signatures import match
from rig.observe.observations import ScenarioObservation
from rig.observe.parity import ParityResult
from rig.transport.hops import derive_decode
from rig.transport.records import Hop, PDRecord

P_ANSWER = Hop(instance="prefill", status=200, token_ids=[517], kv_transfer_params={"remote_block_ids": [[1, 2]]})


def seq(*steps: dict, **extra) -> ScenarioConfig:
    return ScenarioConfig.model_validate({"name": "s", "kind": "sequence",
                                          "sequence": {"steps": list(steps), **extra}})


def error_of(*steps: dict, **extra) -> str:
    with pytest.raises(ValidationError) as e:
        seq(*steps, **extra)
    return str(e.value)


# -- the pure transform ----------------------------------------------------------------------

def test_no_transform_is_the_rigs_own_decode_hop():
    [one] = derive_decode(None, [5, 6, 7], P_ANSWER, 8, {"n": 1}, {"seed": 3})
    assert (one.prompt, one.max_tokens, one.fields, one.strip, one.reference_fields) == \
        ([5, 6, 7], 8, {"n": 1}, (), {"seed": 3})


def test_append_first_token_appends_ps_first_generated_token():
    [one] = derive_decode(Transform(append_first_token=True), [5, 6, 7], P_ANSWER, 8)
    assert one.prompt == [5, 6, 7, 517] and one.max_tokens == 8


def test_append_needs_ps_token_ids_and_one_token_id_prompt():
    with pytest.raises(ValueError, match="has no token_ids"):
        derive_decode(Transform(append_first_token=True), [5], Hop(instance="prefill", status=200), 8)
    with pytest.raises(ValueError, match="one token-ID prompt"):
        derive_decode(Transform(append_first_token=True), "text", P_ANSWER, 8)


def test_set_and_strip_reach_d_and_set_reaches_the_reference():
    t = Transform(set={"max_tokens": 3, "seed": 9}, strip=["kv_transfer_params"], decode_hops=2)
    reqs = derive_decode(t, [5, 6], P_ANSWER, 8, {"seed": 1, "n": 1}, {"n": 1})
    assert len(reqs) == 2 and reqs[0] == reqs[1]
    assert reqs[0].max_tokens == 3 and reqs[0].fields == {"seed": 9, "n": 1}
    assert reqs[0].strip == ("kv_transfer_params",) and reqs[0].reference_fields == {"n": 1, "seed": 9}


# -- validation ------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, words", [
    ({"set": {"prompt": [1]}}, "transform.set: prompt cannot be set (use append_first_token"),
    ({"set": {"kv_transfer_params": {}}}, "strip them to model a router that drops them"),
    ({"strip": ["model"]}, "transform.strip: model cannot be stripped"),
    ({"strip": ["seed"], "set": {"seed": 1}}, "seed is both stripped and set"),
    ({"decode_hops": 0}, "decode_hops"),
])
def test_bad_transforms_are_named(bad, words):
    with pytest.raises(ValidationError, match=words.replace("(", r"\(")):
        Transform.model_validate(bad)


def test_router_url_must_be_a_base_url():
    assert RouterConfig(url="http://127.0.0.1:8000/").url == "http://127.0.0.1:8000"
    with pytest.raises(ValidationError, match="give a base URL like http://127.0.0.1:8000"):
        RouterConfig(url="127.0.0.1:8000")


def test_transform_only_on_a_pd_step():
    msg = error_of({"id": "a", "route": "decode", "prompt_tokens": 8, "max_tokens": 2,
                    "transform": {"append_first_token": True}})
    assert "transform needs route pd" in msg


def test_append_needs_the_completions_endpoint_and_one_prompt():
    msg = error_of({"id": "a", "route": "pd", "prompt_tokens": 8, "max_tokens": 2,
                    "transform": {"append_first_token": True}, "request": {"prompts": 2}})
    assert "append_first_token needs one token-ID prompt on the completions endpoint" in msg


def test_prefix_of_names_an_earlier_shorter_step():
    warm = {"id": "w", "route": "decode", "prompt_tokens": 32, "max_tokens": 2}
    assert "no earlier step 'x'" in error_of(warm, {"id": "a", "route": "pd", "prompt_tokens": 64, "max_tokens": 2,
                                                    "prefix_of": "x"})
    assert "must be shorter than this step's (32); lengthen prompt_tokens" in error_of(
        warm, {"id": "a", "route": "pd", "prompt_tokens": 32, "max_tokens": 2, "prefix_of": "w"})


def test_repeat_of_wants_the_length_of_ds_prompt_and_a_start_after_it():
    app = {"id": "a", "route": "pd", "prompt_tokens": 64, "max_tokens": 2, "transform": {"append_first_token": True}}
    msg = error_of(app, {"id": "r", "route": "decode", "prompt_tokens": 64, "max_tokens": 2, "repeat_of": "a",
                         "start": {"after": "a", "event": "answered"}})
    assert "the prompt D got in step 'a' has 65 tokens; set prompt_tokens: 65" in msg
    msg = error_of(app, {"id": "r", "route": "decode", "prompt_tokens": 65, "max_tokens": 2, "repeat_of": "a"})
    assert "must start after step 'a'" in msg and "start: {after: a, event: answered}" in msg
    ok = seq(app, {"id": "r", "route": "decode", "prompt_tokens": 65, "max_tokens": 2, "repeat_of": "a",
                   "start": {"after": "a", "event": "answered"}})
    assert ok.sequence is not None and ok.sequence.steps[1].repeat_of == "a"


def test_router_block_needs_a_router_step():
    step = {"id": "a", "route": "pd", "prompt_tokens": 8, "max_tokens": 2}
    assert "no step has route router" in error_of(step, router={"url": "http://127.0.0.1:9"})
    sc = seq({**step, "route": "router"})
    assert sc.sequence is not None and sc.sequence.routes_through_router and sc.sequence.router_url is None


def test_appended_token_counts_toward_max_model_len():
    data = {"name": "t", "device": "cpu", "model": {"source": "tiny", "served_name": "tiny"}, "max_model_len": 128,
            "prefill": [{"name": "prefill", "port": 8100}], "decode": [{"name": "decode", "port": 8200}],
            "scenarios": [{"name": "s", "kind": "sequence", "sequence": {"steps": [
                {"id": "a", "route": "pd", "prompt_tokens": 120, "max_tokens": 8,
                 "transform": {"append_first_token": True}}]}}]}
    with pytest.raises(ValidationError, match=r"prompt_tokens 120 \+ P's appended token \+ max_tokens 8 = 129"):
        RigConfig.model_validate(data)


# -- golden: the explain text of the new fields --------------------------------------------------

def test_explain_lists_the_router_fields():
    lines = explain(RigConfig, "scenarios.sequence.steps.transform")
    assert lines[0] == "scenarios.sequence.steps.transform: Transform | None = None"
    text = "\n".join(lines)
    assert "scenarios.sequence.steps.transform.append_first_token: bool = False" in text
    assert "scenarios.sequence.steps.transform.decode_hops: int = 1" in text
    assert "scenarios.sequence.steps.transform.strip: list[str] = []" in text
    router = "\n".join(explain(RigConfig, "scenarios.sequence.router"))
    assert "scenarios.sequence.router.url: str | None = None\n    None = pdrig proxy started by the rig" in router
    step = "\n".join(explain(RigConfig, "scenarios.sequence.steps"))
    for field in ("prefix_of: str | None = None", "repeat_of: str | None = None", "expect_status: int | None = None"):
        assert f"scenarios.sequence.steps.<item>.{field}" in step


# -- the appended-token signature --------------------------------------------------------------

def _obs(dead: bool, fatal: str = "") -> ScenarioObservation:
    obs = ScenarioObservation(scenario="s", decode="decode", prefill="prefill")
    app = PDRecord(request_id="s-a-0", prompt_len=64, max_tokens=8, outcome="ok", decode_prompt=[1] * 65,
                   decode=Hop(instance="decode", status=200, token_ids=[1] * 8))
    plain = PDRecord(request_id="s-r-0", prompt_len=65, max_tokens=8, outcome="ok",
                     decode=Hop(instance="decode", status=200, token_ids=[1] * 8))
    lost = PDRecord(request_id="s-b-0", prompt_len=65, max_tokens=8, outcome="connection_error",
                    decode=Hop(instance="decode", error="connection error: Server disconnected"))
    obs.records = [app, plain, lost]
    diverged = ParityResult("diverged", 0, 1, 2)
    obs.parity = [diverged, diverged, None]
    if dead:
        obs.dead = {"decode": 1}
        obs.death_lines = {"decode": fatal}
    return obs


def test_appended_token_excuses_only_the_appended_divergence():
    from rig.config import AppendedTokenSignature
    from rig.judge.signatures import facts_of_records
    sig = AppendedTokenSignature(kind="appended-token")
    obs = _obs(dead=False)
    m = match(sig, obs, facts_of_records(obs))
    assert m.matched and m.requests == {"s-a-0"} and m.explains == {"parity"}
    assert "s-r-0 diverged without an appended token" in m.seen  # the direct request is not excused
    dead = _obs(dead=True, fatal="EngineCore encountered a fatal error. -> AssertionError: "
                                 "assert num_decode_blocks <= len(prefill_group)")
    m = match(sig, dead, facts_of_records(dead))
    assert m.requests == {"s-a-0", "s-b-0"} and m.instances == {"decode"}
    assert {"alive", "no-fatal-log"} <= m.run_checks and "num_decode_blocks" in m.shown
    other = _obs(dead=True, fatal="EngineCore encountered a fatal error. -> RuntimeError: something else")
    m = match(sig, other, facts_of_records(other))
    assert m.instances == frozenset() and m.requests == {"s-a-0"}  # another death is not this symptom


def test_an_edge_router_refuses_what_needs_the_rigs_own_hops():
    with pytest.raises(ValidationError, match="the router drives both hops, so the rig cannot apply tamper"):
        ScenarioConfig.model_validate({"name": "e", "prompt_tokens": 8, "max_tokens": 2, "router": {},
                                       "tamper": "swap-prompt"})
    sc = ScenarioConfig.model_validate({"name": "e", "prompt_tokens": 8, "max_tokens": 2,
                                        "router": {"url": "http://127.0.0.1:9000"}})
    assert sc.via_router and sc.router_url == "http://127.0.0.1:9000"
    with pytest.raises(ValidationError, match="router: not used by kind 'fault'"):
        ScenarioConfig.model_validate({"name": "f", "kind": "fault", "prompt_tokens": 8, "max_tokens": 2,
                                       "router": {}, "fault": {"faults": []}})


def test_cache_corrupted_also_excuses_the_repeat_of_the_appended_prompt():
    from rig.config import AppendedTokenSignature
    from rig.judge.signatures import facts_of_records
    obs = _obs(dead=False)
    obs.records[1].prompt = list(obs.records[0].decode_prompt or [])  # s-r-0 repeats the prompt D got
    plain = match(AppendedTokenSignature(kind="appended-token"), obs, facts_of_records(obs))
    assert plain.requests == {"s-a-0"}
    m = match(AppendedTokenSignature(kind="appended-token", cache_corrupted=True), obs, facts_of_records(obs))
    assert m.requests == {"s-a-0", "s-r-0"} and "repeat-equal" in m.explains and "prefix cache" in m.shown
