"""Swarm testing (rig.explore.swarm) on fake vLLM servers (tests/fake_vllm.py): with a segment every
2 actions, the exploration still finds the ``seeded-skew`` plant (D draws a sampled request with
seed + 1: wrong output only with a sampled seed), and finds it in a segment swarm drew (not the
topology's first, full one) that kept sampling; the segments that removed sampling saw no such
failure. The history records each action's segment, and ``--replay`` of it reports the same
actions in the same segments.

Seed 3 is chosen for the draw (its subsets are pure functions of the seed, rig.explore.swarm):
sampling is removed in segments 2 and 4, and the plant is first reached in segment 3.
"""

from __future__ import annotations

import json

from rig.explore.grammar import Action
from rig.explore.swarm import Subset
from tests.helpers.explore_plants import explore_fake, the_finding

PLANT = {"decode": {"env": {"FAKE_VLLM_FAULT": "seeded-skew"}}}
SETTINGS = {"seed": 3, "actions": 10, "sample_share": 0.5, "swarm_every": 2, "replays": 1, "shrink_runs": 2}


def test_swarm_finds_the_sampled_seed_plant_in_a_drawn_segment_and_replays_its_segments(base):
    for d in ("explore", "replay"):
        (base / d).mkdir()
    report, run_dir = explore_fake(base / "explore", SETTINGS, decodes=PLANT)
    f = the_finding(report)
    key = f.mechanism.key
    assert key.startswith("divergence:decode:pos=0") and f.stability == "stable"
    assert report.swarm is not None
    segments = report.swarm.segments
    assert [(g.segment, g.first, g.last) for g in segments] == [(k, 2 * k, 2 * k + 1) for k in range(5)]
    assert segments[0].full and not segments[0].off
    found_in = next(g for g in segments if g.first <= f.first_action <= g.last)
    assert not found_in.full and "sample" in found_in.on and key in found_in.failures, found_in
    sample = next(r for r in report.swarm.features if r.feature == "sample")
    assert sample.actions_off >= 2 and sample.findings_off == [] and key in sample.findings_on, sample
    # a segment that removed sampling drew no sampled step: the plant could not show there
    lines = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    explored = [x for x in lines if x["phase"] == "explore"]
    assert [Subset.from_json(x["swarm"]).segment for x in explored] == [x["index"] // 2 for x in explored]
    off = [Action.model_validate(x["action"]) for x in explored if "sample" not in x["swarm"]["on"]]
    assert off and not any((s.fields_for("decode").get("temperature") or 0) > 0 for a in off for s in a.steps)
    assert "## Swarm segments" in (run_dir / "explore.md").read_text()

    replayed, replay_dir = explore_fake(base / "replay", {"seed": 3, "replay": str(run_dir / "history.jsonl"),
                                                          "replays": 0, "shrink_runs": 0}, decodes=PLANT)
    again = [json.loads(x) for x in (replay_dir / "history.jsonl").read_text().splitlines()]
    assert [x["action"] for x in again if x["phase"] == "explore"] == [x["action"] for x in explored]
    assert replayed.swarm is not None
    assert [(g.segment, g.on, g.off, g.first, g.last) for g in replayed.swarm.segments] == \
        [(g.segment, g.on, g.off, g.first, g.last) for g in segments]
    assert key in {r.mechanism.key for r in replayed.findings}
