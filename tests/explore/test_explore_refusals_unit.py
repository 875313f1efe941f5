"""Refusals of the rig's own making, without servers: every drawn action (vLLM 0.32.0's request
fields, every route, motif, cancel and resource) passes rig.explore.refusals.problems, each rule
names what it refuses, the shrinker never runs a candidate the rig makes invalid (the seed dropped
beside a temperature), and a refusal is a finding only when the reference served the request."""

from __future__ import annotations

import pytest

from rig.config.sequence import Step
from rig.explore.generate import Generator, drawable_fields
from rig.explore.grammar import Action, Resource, Topology
from rig.explore.oracles import signature_of
from rig.explore.refusals import chat_tokens, clean_fields, problems
from rig.explore.shrink import shrink
from rig.judge.checks import Check
from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation
from rig.transport.records import Hop, PDRecord
from tests.helpers.explore_fields import SCHEMAS

FIELDS = drawable_fields(SCHEMAS, allow_logprobs=True)
TOPOS = [Topology(prefill="p", decode="d", block_size=32, max_model_len=128, usable_blocks=4, spec_tokens=1),
         Topology(prefill="p", decode="d", block_size=64, max_model_len=256, usable_blocks=None, chat_overhead=11),
         Topology(prefill="p", decode="d", block_size=32, max_model_len=64, usable_blocks=2, chat_overhead=40)]


def test_the_schema_offers_the_fields_that_made_false_findings():
    assert {"min_tokens", "return_token_ids", "n"} <= set(FIELDS["completions"])


@pytest.mark.parametrize("topo", TOPOS, ids=["tiny", "wide", "narrow"])
def test_no_drawn_action_carries_a_request_the_rig_makes_invalid(topo):
    gen = Generator(11, topo, FIELDS, field_share=1.0, cancel_share=0.5, resource_share=0.3)
    pool = [Resource(name="r0", origin={"name": "x00001", "prefill": "p", "decode": "d"}, route="pd",
                     prompt_tokens=min(64, topo.max_model_len - 9))]
    drawn = [gen.action(i, resources=pool) for i in range(600)] + [gen.nemesis(i) for i in range(40)]
    assert not [(a.index, problems(a, topo)) for a in drawn if problems(a, topo)]
    steps = [s for a in drawn for s in a.steps]
    assert any(s.endpoint == "chat" for s in steps)  # chat is still drawn, shorter
    assert all(chat_tokens(s.prompt_tokens, topo.chat_overhead) + s.max_tokens <= topo.max_model_len
               for s in steps if s.endpoint == "chat")
    assert any((s.request.all.get("min_tokens") or 0) > 0 for s in steps if s.request)
    # a step that starts after a cancelled one waits for its 'sent' only
    after_cut = [(a, s) for a in drawn for s in a.steps if s.start and
                 next(r for r in a.steps if r.id == s.start.after).cancel_after_ms]
    assert after_cut and all(s.start.event == "sent" for _, s in after_cut)


@pytest.mark.parametrize("step, says", [
    (Step(id="s0", route="pd", prompt_tokens=32, max_tokens=8, request={"all": {"min_tokens": 2}}),
     "prefill hop: min_tokens 2 > the hop's max_tokens 1"),
    (Step(id="s0", route="decode", prompt_tokens=32, max_tokens=2, request={"all": {"min_tokens": 4}}),
     "decode hop: min_tokens 4 > the hop's max_tokens 2"),
    (Step(id="s0", route="pd", prompt_tokens=32, max_tokens=8, request={"all": {"return_token_ids": False}}),
     "return_token_ids False: the rig must read it"),
    (Step(id="s0", route="pd", prompt_tokens=32, max_tokens=8, request={"prefill": {"temperature": 1.0, "n": 2}}),
     "prefill hop: temperature 1.0 without a seed"),
    (Step(id="s0", route="pd", prompt_tokens=32, max_tokens=8, request={"all": {"n": 2}}),
     "n 2 with greedy sampling"),
    (Step(id="s0", route="pd", prompt_tokens=64, max_tokens=8, request={"endpoint": "chat"}),
     "chat prompt of 64 IDs is up to 287 tokens with the template"),
    (Step(id="s0", route="pd", prompt_tokens=120, max_tokens=8, transform={"append_first_token": True}),
     "prompt 121 + max_tokens 8 > max_model_len 128"),
])
def test_each_rule_names_what_it_refuses(step, says):
    got = problems(Action(index=0, steps=[step]), TOPOS[0])
    assert any(says in p for p in got), got


def test_a_start_rule_a_cancel_may_prevent_is_refused():
    cut = Step(id="s0", route="pd", prompt_tokens=32, max_tokens=2, cancel_after_ms=(0, 0))
    later = Step(id="s1", route="pd", prompt_tokens=32, max_tokens=2,
                 start={"after": "s0", "event": "prefill-answered"})
    got = problems(Action(index=0, steps=[cut, later]), TOPOS[0])
    assert got == ["step s1: starts after s0 prefill-answered, which s0's cancel at 0 ms may prevent: only 'sent' "
                   "follows a cancelled step"]
    ok = later.model_copy(update={"start": later.start.model_copy(update={"event": "sent"})})
    assert problems(Action(index=0, steps=[cut, ok]), TOPOS[0]) == []


def test_clean_fields_keeps_what_is_valid_and_consumes_nothing():
    assert clean_fields({"min_tokens": 2, "return_token_ids": False, "n": 2, "top_k": 3}, "pd", 8) == \
        {"min_tokens": 1, "return_token_ids": True, "top_k": 3}
    assert clean_fields({"min_tokens": 2}, "decode", 8) == {"min_tokens": 2}
    assert clean_fields({"temperature": 1.0, "seed": 3, "n": 2}, "pd", 8) == {"temperature": 1.0, "seed": 3, "n": 2}
    assert clean_fields({"temperature": 1.0}, "pd", 8) == {}


def test_the_shrinker_never_drops_the_seed_and_keeps_the_temperature():
    sampled = Step(id="s0", route="pd", prompt_tokens=64, max_tokens=4,
                   request={"prefill": {"n": 2, "temperature": 1.0, "seed": 7}})
    action = Action(index=3, steps=[sampled])
    tried: list[Action] = []

    def test(cand: Action) -> bool:
        tried.append(cand)
        return True  # every candidate "still fails": the shrinker goes as far as it may

    result = shrink(action, test, TOPOS[0], budget=40)
    assert tried and all(problems(a, TOPOS[0]) == [] for a in tried)
    fields = result.action.steps[0].fields_for("prefill")
    assert not fields.get("temperature") or fields.get("seed") is not None


def _refused(reference_status: int | None) -> ScenarioObservation:
    r = PDRecord(request_id="x1-s0-0", prompt_len=32, max_tokens=8)
    r.outcome = "http_error"
    r.prefill = Hop(instance="prefill", status=400, error="min_tokens must be less than or equal to max_tokens")
    if reference_status is not None:
        r.reference = Hop(instance="prefill", status=reference_status, token_ids=[1] * 8 if reference_status == 200
                          else None)
    return ScenarioObservation(scenario="x1", decode="decode", prefill="prefill", records=[r])


@pytest.mark.parametrize("ref, sig", [(400, None), (None, None),
                                      (200, "FAIL - [refused-reference-serves:prefill:400]")])
def test_a_refusal_is_a_finding_only_when_the_reference_serves_it(ref, sig):
    checks = [Check("completed", False, "1 request refused", ("x1-s0-0",)),
              Check("parity", False, "no answer to compare", ("x1-s0-0",))]
    assert signature_of(ScenarioVerdict("x1", "FAIL", "pass", "", checks), _refused(ref), {}) == sig
