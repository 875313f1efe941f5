"""The nemesis' designed consequences are excused by name, and only they (rig.explore.excuses):
the survivor's peer-disconnect lines after a SIGKILL, a lease read when the fault held the decode
hop past the lease; never what is judged after heal, never when the fault did not take effect."""

from __future__ import annotations

from pathlib import Path

import pytest

from rig.config.faults import Fault
from rig.config.sequence import Step
from rig.explore.excuses import excuse
from rig.explore.explorer import nemesis_row
from rig.explore.grammar import Action, Nemesis, Topology
from rig.explore.oracles import signature_of
from rig.explore.report import new_report
from rig.explore.settings import ExploreSettings
from rig.judge.checks import Check
from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation
from rig.report.explore_render import render_md

TOPO = Topology(prefill="prefill", decode="decode", block_size=32, max_model_len=128, usable_blocks=4, lease_s=5)
DISCONNECT = ("Traceback (most recent call last) -> nixl_cu12._bindings.nixlRemoteDisconnectError: "
              "NIXL_ERR_REMOTE_DISCONNECT")


def nemesis(name: str, fault: dict) -> Action:
    nem = Nemesis(name=name, faults=[Fault.model_validate(fault)], requests=2)
    return Action(index=4, steps=[Step(id="s0", route="pd", prompt_tokens=64, max_tokens=4)], why="nemesis",
                  nemesis=nem)


KILL_P = nemesis("sigkill-prefill", {"trigger": {"event": "prefill-answered"}, "target": "prefill",
                                     "action": "sigkill"})
HOLD = nemesis("delay-past-lease", {"trigger": {"event": "prefill-answered"}, "target": "request",
                                    "action": "delay-decode", "delay_s": 8.0})
FIRED = Check("fault-fired", True, "sigkill prefill: fired 3 ms after its event")


def verdict(*checks: Check) -> ScenarioVerdict:
    return ScenarioVerdict("x00004", "FAIL", "pass", "failed", [FIRED, Check("recovery-serves", True, "ok"),
                                                                   *checks])


def obs(**kw) -> ScenarioObservation:
    return ScenarioObservation(scenario="x00004", decode="decode", prefill="prefill", **kw)


def test_peer_disconnect_after_sigkill_is_excused_and_named():
    v, got = excuse(KILL_P, verdict(Check("no-fatal-log", False, "decode: 1 fatal line")), obs(
        fatal_lines={"decode": [DISCONNECT]}), TOPO)
    assert v.verdict == "PASS" and [e.cause for e in got] == ["peer-disconnect"]
    assert got[0].describe().startswith("no-fatal-log: peer-disconnect, caused by the nemesis (sigkill-prefill, "
                                        "sigkill prefill on prefill-answered")
    assert signature_of(v, obs(), {}) is None
    row = nemesis_row(KILL_P, v, got)
    assert row.took_effect and row.excused == [got[0].describe()]
    r = new_report("c", ExploreSettings(seed=1), Path("."))
    r.nemeses = [row]
    md = render_md(r)
    assert "caused by the nemesis (sigkill-prefill" in md


@pytest.mark.parametrize("why, v, o", [
    ("another fatal line", verdict(Check("no-fatal-log", False, "x")),
     obs(fatal_lines={"decode": [DISCONNECT, "Cannot get 3 free blocks from the pool"]})),
    ("the fault did not take effect", ScenarioVerdict("x00004", "FAIL", "pass", "", [
        Check("fault-fired", None, "not checked: its event never happened"), Check("no-fatal-log", False, "x")]),
     obs(fatal_lines={"decode": [DISCONNECT]})),
    ("judged after heal", verdict(Check("idle-after", False, "decode not idle"),
                                  Check("recovery-serves", False, "x00004-recovery: stalled")),
     obs(fatal_lines={})),
])
def test_nothing_else_is_excused(why, v, o):
    out, got = excuse(KILL_P, v, o, TOPO)
    assert got == [] and out.verdict == "FAIL", why


def test_a_lease_read_under_a_hold_past_the_lease_is_excused_on_the_held_requests_only():
    held = verdict(Check("parity", False, "diverged at 0", ("x00004-0",)),
                   Check("kv-integrity", False, "Potentially invalid KV blocks"))
    v, got = excuse(HOLD, held, obs(), TOPO)
    assert v.verdict == "PASS" and {e.cause for e in got} == {"lease-read"}
    after = verdict(Check("parity", False, "diverged at 0", ("x00004-recovery",)))
    v, got = excuse(HOLD, after, obs(), TOPO)
    assert v.verdict == "FAIL" and got == []
    # a hold shorter than the lease excuses nothing
    v, got = excuse(HOLD, held, obs(), Topology(**{**TOPO.__dict__, "lease_s": 30}))
    assert v.verdict == "FAIL" and got == []


def test_outside_a_nemesis_nothing_is_excused():
    plain = Action(index=1, steps=[Step(id="s0", route="pd", prompt_tokens=64, max_tokens=4)])
    v = verdict(Check("no-fatal-log", False, "x"))
    assert excuse(plain, v, obs(fatal_lines={"decode": [DISCONNECT]}), TOPO) == (v, [])
