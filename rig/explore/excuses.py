"""Faults on purpose are not findings: the designed consequences of a nemesis phase, excused by name.

A nemesis phase (rig.explore.grammar.Nemesis) runs as a fault scenario: the fault, the requests
under it, the heal (SIGCONT, or the killed instance restarted on its ports) and the liveness
checks after the heal. Inside that window some failures are what the fault *does* by design, not
what vLLM does wrong; each is excused here by the name of its cause and shown in the report as
"caused by the nemesis (kind, window)":

- ``peer-disconnect``: after SIGKILL of one instance, the survivor's log lines about the vanished
  peer (D's NIXL read of a dead P: ``NIXL_ERR_REMOTE_DISCONNECT``, vLLM nixl/base_worker.py
  ``_pop_done_transfers``, measured on 0.32.0) fail ``no-fatal-log`` and nothing else;
- ``counters-restart``: counters of the instance the fault killed start again from zero in its new
  process (``counters-monotonic`` when the restart cannot be told from a decrease);
- ``lease-read``: a fault that held the decode hop (``delay-decode``) or stopped P (``sigstop``)
  past P's ``kv_lease_duration`` makes D read blocks P may have reused (``kv-integrity``,
  ``parity`` of the requests under the fault: the lease stale read, nixl base_scheduler.py).

What remains after heal is judged, never excused: ``recovery-serves`` (a fresh P/D request over
pulled KV), ``idle-after`` (blocks released within the lease + heal bound), ``alive`` (the
instance came back), ``fault-outcome`` (every request answered or diagnosed), and every failure
on the recovery request. An excuse needs the fault verified to have taken effect
(``fault-fired`` ok: the process was stopped or killed, the hop held); a phase whose fault did not
fire excuses nothing and says so (:func:`took_effect`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from rig.explore.grammar import Action, Topology
from rig.judge.checks import Check
from rig.judge.counters import decreases
from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation

# The survivor's words for a peer that vanished (regexes on a fatal log line).
PEER_DISCONNECT = (r"NIXL_ERR_REMOTE_DISCONNECT", r"nixlRemoteDisconnectError", r"Connection reset by peer")
AFTER_HEAL = frozenset({"recovery-serves", "idle-after", "alive", "fault-outcome", "fault-fired"})


@dataclass(frozen=True)
class Excuse:
    """One failed ``check`` excused as ``cause`` (peer-disconnect, counters-restart, lease-read)
    of the nemesis ``kind`` over its ``window`` (the fault and the heal bound)."""

    check: str
    cause: str
    kind: str
    window: str
    detail: str = ""

    def describe(self) -> str:
        """'no-fatal-log: peer-disconnect, caused by the nemesis (sigkill-prefill, ...)' style."""
        return f"{self.check}: {self.cause}, caused by the nemesis ({self.kind}, {self.window})" + \
            (f": {self.detail}" if self.detail else "")


def window_of(action: Action, topo: Topology) -> str:
    """The nemesis window in words: each fault and the heal bound (s)."""
    assert action.nemesis is not None
    nem = action.nemesis
    return f"{'; '.join(f.describe() for f in nem.faults)}; heal bound lease {topo.lease_s:g}s + {nem.heal_s:g}s"


def took_effect(verdict: ScenarioVerdict) -> tuple[bool, str]:
    """``(fired, detail)`` from the ``fault-fired`` check: True only when it is ok (every fault's
    action was taken: the process stopped or killed, the hop held)."""
    c = next((c for c in verdict.checks if c.name == "fault-fired"), None)
    if c is None:
        return False, "no fault-fired check"
    return c.ok is True, c.detail


def _killed(action: Action, obs: ScenarioObservation) -> set[str]:
    assert action.nemesis is not None
    roles = {"prefill": obs.prefill, "decode": obs.decode}
    return {roles.get(f.target, f.target) for f in action.nemesis.faults if f.action == "sigkill"}


def _past_lease(action: Action, topo: Topology) -> bool:
    """True when a fault held the decode hop, or stopped P, at least P's lease."""
    assert action.nemesis is not None
    return any((f.action == "delay-decode" and (f.delay_s or 0) >= topo.lease_s)
               or (f.action == "sigstop" and f.target == "prefill" and (f.stop_s or 0) >= topo.lease_s)
               for f in action.nemesis.faults)


def _excuse_one(c: Check, action: Action, obs: ScenarioObservation, topo: Topology,
                recovery: str) -> tuple[str, str] | None:
    """``(cause, detail)`` when failed check ``c`` is a designed consequence, else None."""
    killed = _killed(action, obs)
    if c.name == "no-fatal-log" and killed:
        lines = [(n, ln) for n, v in obs.fatal_lines.items() if n not in killed for ln in v]
        if lines and all(any(re.search(rx, ln) for rx in PEER_DISCONNECT) for _, ln in lines):
            return "peer-disconnect", f"{len(lines)} line(s) on {', '.join(sorted({n for n, _ in lines}))}"
    if c.name == "counters-monotonic" and killed:
        found, blind = decreases([r for r in obs.timeline if r.get("counters")])
        if (found or blind) and all(d.split(":", 1)[0] in killed for d in found) and set(blind) <= killed:
            return "counters-restart", f"{', '.join(sorted(killed))} restarted"
    if c.name in ("kv-integrity", "parity") and _past_lease(action, topo) and recovery not in c.requests:
        return "lease-read", f"held past the {topo.lease_s:g}s lease"
    return None


def excuse(action: Action, verdict: ScenarioVerdict, obs: ScenarioObservation,
           topo: Topology) -> tuple[ScenarioVerdict, list[Excuse]]:
    """``verdict`` with the nemesis' designed consequences excused (their checks marked ok, the
    detail saying why) and the list of excuses. A verdict whose failed checks are all excused
    becomes PASS. Nothing is excused outside a nemesis, when the fault did not take effect
    (:func:`took_effect`), or for a check judged after heal (:data:`AFTER_HEAL`)."""
    if action.nemesis is None or verdict.verdict not in ("FAIL",):
        return verdict, []
    fired, _ = took_effect(verdict)
    if not fired:
        return verdict, []
    recovery = f"{verdict.scenario}-recovery"
    kind, window = action.nemesis.name, window_of(action, topo)
    out: list[Excuse] = []
    checks: list[Check] = []
    for c in verdict.checks:
        why = None if c.ok is not False or c.name in AFTER_HEAL else _excuse_one(c, action, obs, topo, recovery)
        if why is None:
            checks.append(c)
            continue
        e = Excuse(c.name, why[0], kind, window, why[1])
        out.append(e)
        checks.append(replace(c, ok=True, detail=f"excused: {e.describe()} (was: {c.detail})"))
    if not out:
        return verdict, []
    left = [c for c in checks if c.ok is False]
    return replace(verdict, checks=checks, verdict="FAIL" if left else "PASS",
                   reason=verdict.reason if left else f"every failure excused: {'; '.join(e.describe() for e in out)}"
                   ), out
