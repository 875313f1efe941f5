"""pdrig explore's cancels and nemesis phases, without servers: drawn from the seed (the same seed
gives the same cancels and phases), validated by the same pydantic models as a hand-written
scenario (the emitted YAML is a valid ``kind: sequence`` with ``cancel_after_ms`` or ``kind: fault``
with recovery on), refused when malformed with one error naming the fix, and shrunk (the shrinker
drops the nemesis, fewer requests under it, the cancel)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from rig.config import RigConfig
from rig.config.faults import Fault
from rig.config.sequence import Step
from rig.explore.emit import scenario_of, suite_yaml
from rig.explore.generate import Generator
from rig.explore.grammar import NEMESIS_WEIGHTS, RETRY_POINTS_MS, Action, Nemesis, Topology
from rig.explore.history import History, read_history
from rig.explore.shrink import action_variants, shrink, step_variants
from tests.helpers.fake_rig import fake_config

TOPO = Topology(prefill="prefill", decode="decode", block_size=32, max_model_len=128, usable_blocks=4, lease_s=5)


def _validate(tmp_path, sc: dict) -> RigConfig:
    return RigConfig.model_validate({**fake_config(tmp_path), "scenarios": yaml.safe_load(suite_yaml([sc], "h"))})


def test_cancels_are_drawn_from_the_seed_and_emitted_as_cancel_after_ms(tmp_path):
    gen = Generator(4, TOPO, cancel_share=0.5, motifs=[])
    drawn = [gen.action(i) for i in range(60)]
    again = [Generator(4, TOPO, cancel_share=0.5, motifs=[]).action(i) for i in range(60)]
    assert [a.model_dump() for a in drawn] == [a.model_dump() for a in again]
    cut = [a for a in drawn if any(s.cancel_after_ms for s in a.steps)]
    assert len(cut) >= 10
    # a cut is a P/D request's: the plain route's, or a client's cancel a router swallows
    assert all(s.route in ("pd", "pd-swallow-cancel") for a in cut for s in a.steps if s.cancel_after_ms)
    a = cut[0]
    cfg = _validate(tmp_path, scenario_of(a, TOPO, "x00001"))
    sc = cfg.scenarios[0]
    assert sc.kind == "sequence" and sc.sequence is not None
    assert [s.cancel_after_ms for s in sc.sequence.steps] == [s.cancel_after_ms for s in a.steps]
    assert "cancelled at" in a.describe()
    assert not any(s.cancel_after_ms for i in range(60) for s in Generator(4, TOPO, cancel_share=0).action(i).steps)


def test_nemesis_phases_are_seeded_and_run_as_fault_scenarios_with_recovery(tmp_path):
    gen = Generator(9, TOPO)
    phases = [gen.nemesis(i) for i in range(40)]
    assert [p.model_dump() for p in phases] == [Generator(9, TOPO).nemesis(i).model_dump() for i in range(40)]
    assert {p.nemesis.name for p in phases if p.nemesis} == set(NEMESIS_WEIGHTS)
    for p in phases:
        assert p.nemesis is not None
        cfg = _validate(tmp_path, scenario_of(p, TOPO, f"n{p.index:05d}"))
        sc = cfg.scenarios[0]
        assert sc.kind == "fault" and sc.fault is not None and sc.fault.recovery
        assert sc.fault.requests == p.nemesis.requests and sc.fault.idle_margin_s == p.nemesis.heal_s
        assert sc.fault.faults == p.nemesis.faults
        assert p.requests() == p.nemesis.requests + 1  # the recovery request
    delay = next(p for p in phases if p.nemesis and p.nemesis.name == "delay-past-lease")
    assert delay.nemesis.faults[0].delay_s == 8.0  # 1.6 x the 5 s lease
    assert [Generator(9, TOPO).nemesis(i, ["sigstop-prefill"]).nemesis.name for i in range(5)] == \
        ["sigstop-prefill"] * 5
    with pytest.raises(ValueError, match="nemesis: unknown"):
        Generator(9, TOPO).nemesis(0, ["unplug"])


def test_a_malformed_nemesis_is_refused_naming_the_fix():
    stop = Fault.model_validate({"trigger": {"event": "after-requests", "k": 2}, "target": "prefill",
                                 "action": "sigstop", "stop_s": 1})
    with pytest.raises(ValidationError, match="trigger.k 2 must be below requests 2"):
        Nemesis(name="sigstop-prefill", faults=[stop], requests=2)
    nem = Nemesis(name="sigstop-prefill", faults=[stop], requests=3)
    with pytest.raises(ValidationError, match="a nemesis runs as a fault scenario"):
        Action(index=0, nemesis=nem, steps=[Step(id="s0", route="decode", prompt_tokens=8, max_tokens=2)])
    with pytest.raises(ValidationError, match="a nemesis runs as a fault scenario"):
        Action(index=0, nemesis=nem, steps=[Step(id="s0", prompt_tokens=8, max_tokens=2, cancel_after_ms=(5, 5))])


def test_the_shrinker_drops_the_nemesis_or_the_requests_under_it():
    stop = {"trigger": {"event": "after-requests", "k": 2}, "target": "prefill", "action": "sigstop", "stop_s": 1}
    a = Action(index=3, nemesis=Nemesis(name="sigstop-prefill", faults=[Fault.model_validate(stop)], requests=3),
               steps=[Step(id="s0", prompt_tokens=65, max_tokens=4)])
    vs = action_variants(a)
    assert vs[0].nemesis is None and vs[0].steps == a.steps
    assert [v.nemesis.requests for v in vs[1:]] == [1, 2]
    assert vs[1].nemesis.faults[0].trigger.event == "prefill-answered"  # k moved onto request 0's exchange
    # a bug that needs the fault: the nemesis is kept, its requests go down to one
    r = shrink(a, lambda c: c.nemesis is not None, TOPO, budget=30)
    assert r.action.nemesis is not None and r.action.nemesis.requests == 1 and r.action.requests() == 2
    # a bug the fault does not matter to: the nemesis is dropped
    assert shrink(a, lambda c: True, TOPO, budget=30).action.nemesis is None


def test_the_shrinker_keeps_a_cancel_only_when_it_matters():
    s = Step(id="s0", prompt_tokens=65, max_tokens=8, count=3, cancel_after_ms=(20, 500))
    assert {v.cancel_after_ms for v in step_variants(s, TOPO)} >= {None, (20, 20), (500, 500)}
    a = Action(index=0, steps=[s])
    r = shrink(a, lambda c: any(x.cancel_after_ms and x.cancel_after_ms[0] <= 20 for x in c.steps), TOPO, 40)
    assert r.action.requests() == 1 and r.action.steps[0].cancel_after_ms == (20, 20)


def test_nemesis_phases_are_read_back_for_replay(tmp_path):
    h = History(tmp_path / "history.jsonl")
    a = Generator(2, TOPO).nemesis(5)
    h.append({"phase": "nemesis", "index": 5, "topology": TOPO.__dict__, "action": a.model_dump(mode="json")})
    h.append({"phase": "replay", "action": {}})
    h.close()
    got = read_history(tmp_path / "history.jsonl")
    assert len(got) == 1 and Action.model_validate(got[0]["action"]) == a


def test_topologies_are_drawn_from_the_seed_validated_and_named_by_their_sets(tmp_path):
    from rig.config import ConfigError
    from rig.explore.explorer import topology_of
    from rig.explore.topologies import build_variant, draw_variants, variant_of_sets
    base = RigConfig.model_validate(fake_config(tmp_path, decodes={"decode": {"num_gpu_blocks_override": 5}}))
    vs = draw_variants(base, 3, 8)
    assert [v.sets for v in vs] == [v.sets for v in draw_variants(base, 3, 8)]
    assert len({v.sets for v in vs}) >= 6
    for v in vs:  # each variant is what its --sets make of the config, and the grammar reads its knobs
        again = variant_of_sets(base, v.name, "decode", v.sets)
        assert again.cfg == v.cfg
        topo = topology_of(base, "decode", v)
        assert topo.variant == v.name and topo.sets == v.sets
        if "pool" in v.knobs:
            assert v.cfg.instance("decode").num_gpu_blocks_override == v.knobs["pool"]
            assert topo.usable_blocks == v.knobs["pool"] - 1
        if "block_size" in v.knobs:
            assert topo.block_size == v.knobs["block_size"]
        if v.knobs.get("spec") in (1, 2):
            assert topo.spec_tokens == v.knobs["spec"]
        if "max_num_seqs" in v.knobs:
            assert str(v.knobs["max_num_seqs"]) in v.cfg.instance("decode").extra_args
    with pytest.raises(ConfigError, match=r"drawn topology t9 .*decode pool 4 blocks .* raise num_gpu_blocks_override"):
        build_variant(base, "t9", "decode", {"pool": 4})
    with pytest.raises(ConfigError, match="max_num_batched_tokens 1 < max_num_seqs 2"):
        build_variant(base, "t9", "decode", {"max_num_seqs": 2, "max_num_batched_tokens": 1})
    with pytest.raises(ConfigError, match="unknown"):
        draw_variants(base, 3, 1, knobs=("gpu_count",))


def test_prompt_resources_are_reused_across_actions_and_emitted_with_a_primer(tmp_path):
    from rig.explore.emit import resource_scenarios
    from rig.explore.grammar import Resource
    from rig.workload.prompts import resolve
    origin = {"name": "x00002", "kind": "sequence", "prefill": "prefill", "decode": "decode", "seed": 77,
              "sequence": {"steps": [{"id": "s0", "route": "decode", "prompt_tokens": 97, "max_tokens": 2}]}}
    pool = [Resource(name="r0", origin=origin, step="s0", route="decode", prompt_tokens=97)]
    gen = Generator(5, TOPO)
    drawn = [gen.action(i, resources=pool) for i in range(80)]
    assert [a.model_dump() for a in drawn] == [Generator(5, TOPO).action(i, resources=pool).model_dump()
                                               for i in range(80)]
    reuse = [a for a in drawn if a.resources]
    assert len(reuse) >= 5 and {a.steps[0].route for a in reuse} >= {"pd", "decode"}
    assert {bool(a.steps[0].same_as) for a in reuse} == {True, False}  # the whole prompt, and its head
    for a in reuse:
        # exploring: the earlier action's scenario validates beside the action, and the prompt is that one
        sc = scenario_of(a, TOPO, "x00009", origin=True)
        cfg = RigConfig.model_validate({**fake_config(tmp_path), "scenarios": [*resource_scenarios(a, "x00009", True),
                                                                               sc]})
        step = cfg.scenarios[-1].sequence.steps[0]
        src = cfg.scenarios[0]
        assert resolve(cfg.scenarios, cfg.scenarios[-1], step, 0) == \
            resolve(cfg.scenarios, src, src.sequence.steps[0], 0)[:step.prompt_tokens]
        # emitted: a primer of the same route and length first, then the action naming it
        text = suite_yaml([*resource_scenarios(a, "explore-1-1"), scenario_of(a, TOPO, "explore-1-1")], "h")
        cfg = RigConfig.model_validate({**fake_config(tmp_path), "scenarios": yaml.safe_load(text)})
        primer, act = cfg.scenarios
        assert primer.name == "explore-1-1-r0" and primer.sequence.steps[0].route == "decode"
        assert (act.sequence.steps[0].same_as or act.sequence.steps[0].head_of) == "explore-1-1-r0/s0"
        assert a.requests() == 2
    # the shrinker may drop the resource: fresh prompts of the same lengths
    v = action_variants(reuse[0])[0]
    assert not v.resources and not (v.steps[0].same_as or v.steps[0].head_of)
    with pytest.raises(ValidationError, match="@r1 names no resource"):
        Action(index=0, steps=[Step(id="s0", prompt_tokens=8, max_tokens=1, same_as="@r1")])


def test_a_request_cut_on_purpose_is_the_action_not_a_symptom():
    from rig.explore.oracles import signature_of
    from rig.judge.checks import Check
    from rig.judge.verdict import ScenarioVerdict
    from rig.observe.observations import ScenarioObservation
    from rig.transport.records import PDRecord
    from rig.workload.sequence import CANCELLED

    def obs(*outcomes: str) -> ScenarioObservation:
        recs = []
        for i, o in enumerate(outcomes):
            r = PDRecord(request_id=f"x1-s0-{i}", prompt_len=33, max_tokens=2)
            r.outcome = "cancelled" if o == "cut" else o
            r.diagnosis = f"{CANCELLED}: decode hop closed 50 ms after it was sent" if o == "cut" else ""
            recs.append(r)
        return ScenarioObservation(scenario="x1", decode="decode", prefill="prefill", records=recs)

    nothing = [Check("kv-pulled", False, "no answered request to show where its prompt came from"),
               Check("parity", False, "no answer to compare", ("x1-s0-0",))]
    assert signature_of(ScenarioVerdict("x1", "FAIL", "pass", "", nothing), obs("cut"), {}) is None
    # the hang the cut left is a symptom; the checks that only restate the cut are not
    hang = [*nothing, Check("idle-after", False, "decode not idle after 4 s (1 running)")]
    assert signature_of(ScenarioVerdict("x1", "FAIL", "pass", "", hang), obs("cut", "ok"), {}) == "FAIL idle-after []"
    # a request that was not cut and has no answer is still one
    stalled = [Check("parity", False, "no answer", ("x1-s0-1",))]
    assert signature_of(ScenarioVerdict("x1", "FAIL", "pass", "", stalled), obs("cut", "stalled"), {}) == \
        "FAIL - [stalled]"


def test_cancels_and_resources_draw_from_streams_of_their_own():
    # the rest of action i is what it was without them: a seed's documented actions keep their shapes
    # (but a step after a cancelled one starts on its 'sent': the later events may never come)
    def shape(a: Action) -> list[dict]:
        return [{k: ({**v, "event": "?"} if k == "start" and v else v) for k, v in s.model_dump().items()
                 if k != "cancel_after_ms"} for s in a.steps]

    # without the hop orderings: a drawn cut decides which of them a pd step may become (their own
    # stream: test_hop_orderings_draw_from_a_stream_of_their_own)
    plain = ["pd", "decode", "prefill", "pd-abandon"]
    none, all_cut = Generator(1, TOPO, cancel_share=0, routes=plain), Generator(1, TOPO, cancel_share=1, routes=plain)
    pairs = [(none.action(i), all_cut.action(i)) for i in range(60)]
    assert all(shape(a) == shape(b) for a, b in pairs)
    assert any(s.cancel_after_ms for _, b in pairs for s in b.steps)
    assert not any(s.cancel_after_ms for a, _ in pairs for s in a.steps)


def test_hop_orderings_draw_from_a_stream_of_their_own():
    # a pd step may become pd-retry / pd-swallow-cancel; everything else of every action, and every
    # other step, is what it is without them (the seeds' documented actions keep their shapes), but
    # for the event a later step starts on: a swallowed cancel's, and a retry's answer, may never come
    def shape(a: Action) -> list[dict]:
        return [{k: ({**v, "event": "?"} if k == "start" and v else v) for k, v in s.model_dump().items()
                 if k not in ("route", "retry_after_ms", "cancel_after_ms")}
                | {"pd-family": s.route in ("pd", "pd-retry", "pd-swallow-cancel")} for s in a.steps]

    plain = Generator(3, TOPO, routes=["pd", "decode", "prefill", "pd-abandon"])
    every = Generator(3, TOPO)
    pairs = [(plain.action(i), every.action(i)) for i in range(80)]
    assert all(shape(a) == shape(b) for a, b in pairs)
    steps = [s for _, b in pairs for s in b.steps]
    retry = [s for s in steps if s.route == "pd-retry"]
    swallow = [s for s in steps if s.route == "pd-swallow-cancel"]
    assert retry and swallow and any(s.route == "pd" for s in steps)
    assert all(s.retry_after_ms in RETRY_POINTS_MS and s.cancel_after_ms is None for s in retry)
    assert all(s.cancel_after_ms is not None for s in swallow)
    # the steps left plain are the same steps, with the same cuts
    for a, b in pairs:
        for x, y in zip(a.steps, b.steps, strict=True):
            if y.route == x.route:
                assert x.model_copy(update={"start": None}) == y.model_copy(update={"start": None})
    # a client's cancel is a cut: --cancel-share 0 draws no swallowed cancel either
    assert not any(s.route == "pd-swallow-cancel" for i in range(80)
                   for s in Generator(3, TOPO, cancel_share=0).action(i).steps)


@pytest.mark.parametrize("flags, says", [
    (["--nemesis", "sigstop-prefil"], "did you mean 'sigstop-prefill'"),
    (["--knobs", "pool,gpus", "--draw-topologies", "2"], "--knobs pool,gpus: unknown 'gpus'"),
    (["--cancel-share", "1.5"], "--cancel-share 1.5: give a share between 0 and 1"),
    (["--draw-topologies", "1", "--knobs", "pool", "--set", "max_model_len=512"], "raise num_gpu_blocks_override"),
    (["--nemesis-every", "-1"], "--nemesis-every -1: give 0 (off) or a positive number"),
    (["--replays", "-1"], "--replays -1: give 0 (off) or a positive number"),
    (["--minutes", "-2"], "--minutes -2: give 0 (off) or a positive number"),
    (["--actions", "0"], "--actions 0: give at least 1 action"),
    (["--nemesis", "sigstop-prefill"], "add --nemesis-every N"),
    (["--knobs", "pool"], "add --draw-topologies N"),
    (["--replay", "nowhere.jsonl"], "--replay nowhere.jsonl: no such file"),
    # a bad flag is refused before --build may create a build's env (gigabytes, minutes)
    (["--build", "no-such-build", "--nemesis-every", "-1"], "--nemesis-every -1"),
])
def test_bad_explore_flags_are_refused_before_a_run_directory(tmp_path, capsys, flags, says):
    from rig.cli import main
    from tests.helpers.fake_rig import write_config
    cfg = write_config(tmp_path, fake_config(tmp_path, decodes={"decode": {"num_gpu_blocks_override": 5}}))
    assert main(["explore", "--config", str(cfg), *flags]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_nemesis_and_cancel_goals_read_what_the_phase_did():
    from rig.explore.coverage import Coverage
    from rig.observe.observations import ScenarioObservation
    from rig.transport.records import PDRecord
    from rig.workload.sequence import CANCELLED
    ok = PDRecord(request_id="n-0", prompt_len=33, max_tokens=2)
    cut = PDRecord(request_id="x-s0-0", prompt_len=33, max_tokens=2)
    ok.outcome, cut.outcome = "ok", "cancelled"
    cut.diagnosis = f"{CANCELLED}: decode hop closed 50 ms after it was sent"
    cov = Coverage()
    phase = Generator(2, TOPO).nemesis(4)
    healed = ScenarioObservation(scenario="n", decode="decode", prefill="prefill", records=[ok])
    assert "nemesis-healed" in cov.update(phase, healed, TOPO)
    died = ScenarioObservation(scenario="n", decode="decode", prefill="prefill", records=[ok], dead={"decode": 1})
    assert "nemesis-healed" not in cov.update(phase, died, TOPO)
    a = Action(index=1, steps=[Step(id="s0", prompt_tokens=33, max_tokens=2, cancel_after_ms=(50, 50))])
    got = cov.update(a, ScenarioObservation(scenario="x", decode="decode", prefill="prefill", records=[cut]), TOPO)
    assert {"cancelled", "cancel-on-decode"} <= set(got)


def test_a_replay_file_that_is_no_history_is_refused_before_a_run_directory(tmp_path, capsys):
    from rig.cli import main
    from tests.helpers.fake_rig import write_config
    cfg = write_config(tmp_path, fake_config(tmp_path))
    not_history = tmp_path / "config-as-history.jsonl"
    not_history.write_text("model: tiny\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"phase": "start"}\n')
    assert main(["explore", "--config", str(cfg), "--replay", str(not_history)]) == 2
    assert "not a JSON line" in capsys.readouterr().err
    assert main(["explore", "--config", str(cfg), "--replay", str(empty)]) == 2
    assert "no action in it" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_cancel_share_zero_turns_cuts_off_even_where_a_goal_asks_for_one():
    hints = {"cancelled": {"route": "pd", "cancel": True}, "cancel-on-decode": {"route": "pd", "cancel": True}}
    gen = Generator(1, TOPO, cancel_share=0)
    acts = [gen.action(i, ["cancelled", "cancel-on-decode"], hints) for i in range(40)]
    assert not any(s.cancel_after_ms for a in acts for s in a.steps)
    on = Generator(1, TOPO)
    assert any(s.cancel_after_ms for i in range(40) for s in on.action(i, ["cancelled"], hints).steps)
