"""The explorer's dimensions of a real deployment's state space, each shown by a planted bug on
fake vLLM servers (tests/fake_vllm.py) that only that dimension reaches: the exploration is not told
where the bug is, finds it, triages it by mechanism (a divergence on D's hop at position 0 over
pulled KV) and shrinks it to the dimension's own ingredient.

- ``p-cap-stale`` (P-side knobs, rig.explore.topologies): P started with a ``--max-num-seqs`` cap
  exports stale KV. Of the two topologies seed 0 draws, t0 caps only D, t1 caps P: only t1 fails.
- ``seeded-skew`` (seeded sampling, rig.explore.sampling): D draws a sampled request with seed + 1.
  The minimal request keeps its temperature and its seed (dropping either makes it greedy).
- ``overcap-diverge`` (background load, rig.explore.background): D capped at 2 running requests
  answers wrong tokens to a pulled request that waited behind the cap; background bursts exceed it
  (each pull holds its slot 0.2 s, so a burst's requests overlap on a loaded host too).
"""

from __future__ import annotations

from rig.explore.background import over_caps
from rig.explore.grammar import Action, Topology
from rig.report.explore_model import FindingReport
from tests.helpers.explore_plants import explore_fake, the_finding


def _minimal(f: FindingReport) -> Action:
    return Action.model_validate(f.minimal)


def test_a_bug_only_with_a_p_side_cap_is_found_on_the_topology_that_caps_p(base):
    report, _ = explore_fake(base, {"seed": 0, "actions": 4, "draw_topologies": 2},
                             prefill_env={"FAKE_VLLM_FAULT": "p-cap-stale"})
    knobs = {t.name: t.knobs for t in report.topologies}
    # the draw is what makes the test mean something: one topology caps D only, the other caps P
    assert "max_num_seqs" in knobs["t0"] and not any(k.startswith("p_max") for k in knobs["t0"]), knobs
    assert "p_max_num_seqs" in knobs["t1"], knobs
    f = the_finding(report)
    assert f.topology.variant == "t1" and f.topology.caps["prefill.max_num_seqs"] == knobs["t1"][
        "p_max_num_seqs"]
    assert f.mechanism.key.startswith("divergence:decode:pos=0") and f.known_issue == "new"
    assert f.minimal_requests == 1 and f.stability == "stable"
    assert f.emitted_verdict == "FAIL"


def test_a_bug_only_with_a_sampled_seed_is_found_and_keeps_its_seed(base):
    report, _ = explore_fake(base, {"seed": 2, "actions": 4, "sample_share": 0.3},
                             decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "seeded-skew"}}})
    f = the_finding(report)
    assert f.mechanism.key.startswith("divergence:decode:pos=0") and f.known_issue == "new"
    (step,) = _minimal(f).steps
    d = step.fields_for("decode")
    assert d.get("temperature") and d.get("seed") is not None, step
    assert step.fields_for("reference") == {**step.fields_for("reference"), "seed": d["seed"]}
    assert f.minimal_requests == 1 and f.emitted_verdict == "FAIL"


def test_a_bug_only_under_load_past_a_cap_is_found_with_a_burst_over_the_cap(base):
    report, run_dir = explore_fake(base, {"seed": 6, "actions": 4, "background_share": 0.3},
                                   decodes={"decode": {"env": {"FAKE_VLLM_FAULT": "overcap-diverge",
                                                               # a pull holds its slot 0.2 s: a burst overlaps
                                                               "FAKE_VLLM_PULL_S": "0.2"},
                                                       "extra_args": ["--max-num-seqs", "2"]}})
    f = the_finding(report)
    assert f.mechanism.key.startswith("divergence:decode:pos=0") and f.known_issue == "new"
    topo = Topology(**{**f.topology.model_dump(), "sets": tuple(f.topology.sets)})
    assert topo.caps == {"decode.max_num_seqs": 2}
    first = Action.model_validate(f.action)
    assert any(s.id.startswith("bg") for s in first.steps), first.describe()
    # shrunk to what needs the cap: requests at D beyond it, one of them pulled
    minimal = _minimal(f)
    assert any(s.route == "pd" and over_caps(topo, s) for s in minimal.steps), minimal.describe()
    assert f.minimal_requests < first.requests() and f.emitted_verdict == "FAIL"
