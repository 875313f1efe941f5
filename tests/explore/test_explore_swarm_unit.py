"""Swarm testing in pdrig explore (rig.explore.swarm), without servers: a segment's subset follows
the seed, keeps each feature about half the time and always an answered route; a narrowed generator
never draws a removed feature (goal-biased draws included) and never one the flags turned off; a
full subset draws what the generator draws without swarm; the subset round-trips through
history.jsonl; the report's tables count actions and findings per segment and feature."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rig.cli import build_parser
from rig.cli.run import SWARM_EVERY, _explore_phases
from rig.errors import ConfigError
from rig.explore.background import is_background
from rig.explore.coverage import GOALS
from rig.explore.generate import Generator, drawable_fields
from rig.explore.grammar import MOTIF_WEIGHTS, NEMESIS_WEIGHTS, Action, Resource, Topology
from rig.explore.history import History, action_of, read_history
from rig.explore.report import new_report
from rig.explore.sampling import is_sampled
from rig.explore.settings import ExploreSettings
from rig.explore.swarm import (
    CATALOGUE,
    Subset,
    SwarmLog,
    available_features,
    draw_subset,
    field_group,
    narrow,
)
from rig.report.explore_model import SwarmReport
from rig.report.explore_render import render_md
from tests.helpers.explore_fields import SCHEMAS

FIELDS = drawable_fields(SCHEMAS, allow_logprobs=True)
# no speculative decoding: seeded sampling is drawn (a spec decode turns it off, rig.explore.generate)
TOPO = Topology("prefill", "decode", 32, 128, usable_blocks=4, spec_tokens=0, lease_s=5,
                caps={"decode.max_num_seqs": 2})
HINTS = {g.name: g.hint for g in GOALS}
POOL = [Resource(name="r0", origin={"name": "x00001", "prefill": "prefill", "decode": "decode"}, route="pd",
                 prompt_tokens=64)]


def _generator(**kw: Any) -> Generator:
    return Generator(5, TOPO, FIELDS, **{"cancel_share": 0.4, "resource_share": 0.2, "sample_share": 0.3,
                                         "background_share": 0.3, **kw})


def _drawn(gen: Generator, indices: range) -> list[tuple[Action, str | None]]:
    """Actions ``indices`` of ``gen`` with every goal unreached (half of them goal-biased), each with
    the motif it was shaped as (None: drawn part by part or a prompt resource)."""
    motifs: list[str] = []
    plain = gen._motif
    gen._motif = lambda rng, index, motif, why: motifs.append(motif) or plain(rng, index, motif, why)  # type: ignore
    out = []
    for i in indices:
        before = len(motifs)
        a = gen.action(i, list(HINTS), HINTS, POOL)
        out.append((a, motifs[-1] if len(motifs) > before else None))
    return out


def features_of(action: Action, motif: str | None) -> set[str]:
    """The swarm features ``action`` (shaped as ``motif``) uses, as rig.explore.swarm names them."""
    used = {f"route:{s.route}" for s in action.steps}
    if motif:
        used.add(f"motif:{motif}")
    if action.resources:
        used.add("resource")
    if any(is_background(s) for s in action.steps):
        used.add("background")
    if any(s.cancel_after_ms for s in action.steps):
        used.add("cancel")
    if motif is None and any(is_sampled(s) for s in action.steps):  # n-prefill's temperature is the motif's
        used.add("sample")
    drawn = {k for s in action.steps if s.request for k in s.request.all} - {"temperature", "seed"}
    return used | {field_group(k) for k in drawn}


def test_a_segments_subset_follows_the_seed_and_keeps_about_half():
    avail = available_features(_generator(), None)
    assert set(avail) == set(CATALOGUE)  # every feature is drawable here: the test below means something
    subsets = [draw_subset(3, k, avail) for k in range(400)]
    assert subsets == [draw_subset(3, k, avail) for k in range(400)]
    assert [s.on for s in subsets] != [draw_subset(4, k, avail).on for k in range(400)]
    assert len({s.on for s in subsets}) > 350  # segments differ
    kept = Counter(f for s in subsets for f in s.on)
    # route:pd is put back when no answered route is kept (1 in 8): 0.5 + 0.5/8
    assert all(150 <= kept[f] <= 250 for f in avail if f != "route:pd"), kept
    assert 200 <= kept["route:pd"] <= 300, kept["route:pd"]
    assert draw_subset(3, 0, avail, full=True).on == avail and draw_subset(3, 0, avail, full=True).off == ()


def test_routes_are_never_empty_and_always_answered():
    for routes, back in ((None, "route:pd"), (["decode", "pd-abandon"], "route:decode")):
        avail = available_features(_generator(routes=routes), [])
        subsets = [draw_subset(1, k, avail) for k in range(300)]
        assert all(s.kept("route") - {"pd-abandon"} for s in subsets)
        put_back = [s for s in subsets if len(s.kept("route") - {"pd-abandon"}) == 1 and back in s.on]
        assert put_back  # the put-back happened, and named the route the flags allow


def test_what_the_flags_turned_off_is_never_available_nor_kept():
    gen = _generator(routes=["pd", "decode"], motifs=["lease-hold", "reuse"], cancel_share=0.0)
    avail = available_features(gen, ["sigstop-prefill"])
    assert "route:prefill" not in avail and "cancel" not in avail and "motif:prompts" not in avail
    assert [f for f in avail if f.startswith("nemesis:")] == ["nemesis:sigstop-prefill"]
    assert not any(f.startswith("nemesis:") for f in available_features(gen, []))  # no --nemesis-every
    for k in range(100):
        s = draw_subset(2, k, avail)
        assert set(s.on) <= set(avail) and s.nemesis_kinds() in ([], ["sigstop-prefill"])
        g = narrow(gen, s)
        assert set(g.routes) <= {"pd", "decode"} and g.cancel_share == 0 and set(g.motifs) <= {"lease-hold", "reuse"}


def test_a_full_subset_draws_what_the_generator_draws_without_swarm():
    gen = _generator()
    full = draw_subset(5, 0, available_features(gen, None), full=True)
    assert narrow(gen, full) is gen
    # the narrowing of a subset that keeps every feature removes nothing either
    every = Subset(1, full.on, full.available)
    assert [a.model_dump() for a, _ in _drawn(narrow(gen, every), range(80))] == \
        [a.model_dump() for a, _ in _drawn(_generator(), range(80))]


def test_a_removed_feature_is_never_drawn_in_its_segment():
    base = _generator(field_share=0.8)
    avail = available_features(base, None)
    used_when_on: set[str] = set()
    for k in range(24):
        s = draw_subset(9, k, avail)
        for a, motif in _drawn(narrow(base, s), range(k * 40, k * 40 + 40)):
            used = features_of(a, motif)
            assert not used & set(s.off), (k, a.index, used & set(s.off), a.describe())
            used_when_on |= used
            if a.why in HINTS:  # a goal-biased draw steers only toward what the segment keeps
                assert narrow(base, s).steers(HINTS[a.why]), (a.why, s.off)
        for i in range(5):
            if s.nemesis_kinds():
                assert narrow(base, s).nemesis(k * 40 + i, s.nemesis_kinds()).nemesis.name in s.nemesis_kinds()
    # and each drawable feature is drawn in some segment that keeps it (the narrowing is not all-removing)
    assert {f for f in avail if not f.startswith("nemesis:")} <= used_when_on, set(avail) - used_when_on


def test_a_goal_that_needs_a_removed_feature_is_not_steered_toward():
    base = _generator()
    avail = available_features(base, None)
    sub = Subset(1, tuple(f for f in avail if f not in ("motif:reuse", "sample", "route:pd-abandon")), avail)
    g = narrow(base, sub)
    assert not g.steers({"motif": "reuse"}) and not g.steers({"sample": True}) and not g.steers(
        {"route": "pd-abandon"})
    assert g.steers({"motif": "lease-hold"}) and base.steers({"motif": "reuse"})
    whys = {a.why for a, _ in _drawn(g, range(300))}
    assert not whys & {"d-prefix-hit", "prompt-reuse", "sampled-seed", "sampled-choices", "abandoned"}, whys
    assert "held-past-lease" in whys or "lease-expired" in whys


def test_the_subset_round_trips_through_the_history(tmp_path):
    base = _generator()
    sub = draw_subset(7, 3, available_features(base, list(NEMESIS_WEIGHTS)), topology="t1", every=12)
    drawn = [a for a, _ in _drawn(narrow(base, sub), range(36, 48))]
    h = History(tmp_path / "history.jsonl")
    for a in drawn:
        h.append({"phase": "explore", "index": a.index, "topology": TOPO.__dict__, "action": a.model_dump(mode="json"),
                  "swarm": sub.to_json()})
    h.close()
    entries = read_history(tmp_path / "history.jsonl")
    assert [Subset.from_json(e["swarm"]) for e in entries] == [sub] * len(drawn)
    assert [action_of(e).model_dump() for e in entries] == [a.model_dump() for a in drawn]
    # drawing the recorded segment again from the seed gives the recorded actions
    again = narrow(base, Subset.from_json(entries[0]["swarm"]))
    assert [a.model_dump() for a, _ in _drawn(again, range(36, 48))] == [action_of(e).model_dump() for e in entries]


def test_the_report_counts_actions_and_findings_per_segment_and_feature():
    avail = ("route:pd", "route:decode", "cancel")
    full = Subset(0, avail, avail, full=True, topology="prefill+decode", every=2)
    cut = Subset(1, ("route:pd", "route:decode"), avail, topology="prefill+decode", every=2)
    log = SwarmLog()
    for sub, index, key in ((full, 0, None), (full, 1, "idle-after:decode"), (cut, 2, "divergence:decode:pos=0"),
                            (cut, 3, "divergence:decode:pos=0")):
        log.add(sub, index, key)
    data = log.to_json()
    assert data["every"] == 2
    assert [(g["segment"], g["actions"], g["first"], g["last"], g["failures"]) for g in data["segments"]] == [
        (0, 2, 0, 1, ["idle-after:decode"]), (1, 2, 2, 3, ["divergence:decode:pos=0"])]
    rows = {f["feature"]: f for f in data["features"]}
    assert list(rows) == list(avail)
    assert (rows["cancel"]["actions_on"], rows["cancel"]["actions_off"]) == (2, 2)
    assert rows["cancel"]["findings_on"] == ["idle-after:decode"]
    assert rows["cancel"]["findings_off"] == ["divergence:decode:pos=0"]
    assert (rows["route:pd"]["actions_on"], rows["route:pd"]["actions_off"], len(rows["route:pd"]["findings_on"])) \
        == (4, 0, 2)
    empty = new_report("c", ExploreSettings(seed=1), Path("r"))
    md = render_md(empty.model_copy(update={"swarm": SwarmReport.model_validate(data)}))
    assert "## Swarm segments" in md and "## Swarm features" in md
    assert "| 1 | prefill+decode | 2 (2-3) | route:pd, route:decode | cancel | `divergence:decode:pos=0` |" in md
    assert "| cancel | 2 | 2 | 1 | 1 |" in md
    assert "Swarm" not in render_md(empty)
    assert SwarmLog().to_json() == {}


def test_every_motif_and_route_of_the_grammar_is_a_feature():
    assert {f"motif:{m}" for m in MOTIF_WEIGHTS} <= set(CATALOGUE)
    assert field_group("prompt_logprobs") == "fields:logprobs" and field_group("user") == "fields:other"


def test_the_cli_flags_choose_the_segments():
    def every(*flags: str) -> int:
        return _explore_phases(build_parser().parse_args(["explore", *flags]))["swarm_every"]

    assert (every(), every("--swarm-every", "5"), every("--no-swarm"), every("--swarm-every", "0")) == \
        (SWARM_EVERY, 5, 0, 0)
    with pytest.raises(ConfigError, match="--no-swarm with --swarm-every 5: give one"):
        every("--no-swarm", "--swarm-every", "5")
    with pytest.raises(ConfigError, match="--swarm-every -1: give 0"):
        every("--swarm-every", "-1")
