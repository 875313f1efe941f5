"""The checks of a fault scenario, from its observation and the executor's
:class:`~rig.workload.faults.FaultResult`: did each fault fire at its event, how did the faulted requests
end, did the survivors (and the restarted instances) serve and drain. Tri-state like every
check (:mod:`rig.judge.checks`): an event that never came is "not checked", never ok.
"""

from __future__ import annotations

import re
from dataclasses import replace

from rig.cluster.logs import TRACEBACK
from rig.config import ScenarioConfig
from rig.judge.checks import (
    Check,
    alive_check,
    fatal_log_check,
    idle_check,
    kv_integrity_check,
    parity_check,
    stream_check,
)
from rig.observe.observations import ScenarioObservation
from rig.workload.faults import DIAGNOSED, FaultEvent, FaultResult


def fault_fired_check(result: FaultResult) -> Check:
    """``fault-fired``: every fault's action was taken at its event. Not checked when an event
    never happened (e.g. D's KV fetch never seen in progress): the scenario then did not test
    what it says. Failed when an action raised (e.g. an instance that could not be signalled)."""
    if not result.events:
        return Check("fault-fired", None, "not checked: no fault event happened (did the prefill hop fail?)")
    errors = [e for e in result.events if e.error]
    if errors:
        return Check("fault-fired", False, "; ".join(f"{e.fault}: {e.error}" for e in errors))

    def one(e: FaultEvent) -> str:
        if not e.fired:
            return f"{e.fault}: {e.detail or 'its event never happened'}"
        lag = 1000 * (e.fired_at - e.event_at) if e.event_at is not None and e.fired_at is not None else 0.0
        return f"{e.fault}: fired {lag:.0f} ms after its event; {e.detail}"

    unfired = [e for e in result.events if not e.fired]
    text = "; ".join(one(e) for e in result.events)
    return Check("fault-fired", None if unfired else True, ("not checked: " if unfired else "") + text)


def fault_outcome_check(obs: ScenarioObservation, result: FaultResult) -> Check:
    """``fault-outcome``: every request the faults touched ended with an answer or a diagnosis
    (an HTTP error, a connection error, a stall with its frozen state, the fault's own cancel);
    failed on a request that only ran out of its deadline ("a hang after a fault is a stall
    with its diagnosis, not a timeout"). The detail names each outcome: this is where the
    verdict says what vLLM did."""
    recs = [r for r in obs.records if r.request_id != result.recovery_id]
    if not recs:
        return Check("fault-outcome", None, "not checked: no request was sent")
    bad = [r for r in recs if r.outcome not in DIAGNOSED]
    text = "; ".join(f"{r.request_id}: {r.outcome}" + (f" ({r.diagnosis[:160]})" if r.diagnosis else "")
                     for r in recs)
    return Check("fault-outcome", not bad, text, tuple(r.request_id for r in bad))


def recovery_serves_check(obs: ScenarioObservation, result: FaultResult, expected_tokens: int | None) -> Check:
    """``recovery-serves``: after the faults (and restarts) a fresh P/D request is answered with
    the expected completion tokens over KV D really pulled (D's
    ``prompt_tokens_by_source{source="external_kv_transfer"}`` grew by the prompt). Parity is
    the ``parity`` check's. Failed on the recovery request; not checked without recovery."""
    if result.recovery_id is None:
        return Check("recovery-serves", None, "not checked: recovery was not run (fault.recovery: false)")
    rec = next(r for r in obs.records if r.request_id == result.recovery_id)
    restarts = "".join(f"; {n} restarted on its ports (ready after {s:.1f} s)" for n, s in result.restarted.items())
    restarts += "".join(f"; {n} NOT restarted: {e}" for n, e in result.restart_errors.items())
    if rec.outcome != "ok":
        return Check("recovery-serves", False, f"{rec.request_id}: {rec.outcome} {rec.diagnosis}".rstrip() + restarts,
                     (rec.request_id,))
    why = []
    if expected_tokens is not None and rec.completion_tokens != expected_tokens:
        why.append(f"completion_tokens {rec.completion_tokens} != {expected_tokens}")
    if result.recovery_pulled is None:
        return Check("recovery-serves", None, "not checked: D's /metrics unavailable around the recovery request"
                     + restarts)
    if result.recovery_pulled < len(rec.prompt):
        why.append(f"D pulled {result.recovery_pulled:.0f} prompt tokens over NIXL, expected >= {len(rec.prompt)}")
    if why:
        return Check("recovery-serves", False, f"{rec.request_id}: " + ", ".join(why) + restarts, (rec.request_id,))
    return Check("recovery-serves", True, f"{rec.request_id} answered over pulled KV "
                                          f"({result.recovery_pulled:.0f} prompt tokens)" + restarts)


def fault_checks(sc: ScenarioConfig, obs: ScenarioObservation, result: FaultResult | None) -> list[Check]:
    """The checks of a fault scenario: fault-fired, fault-outcome, recovery-serves, parity (every
    answered request, the faulted ones included: a 200 with other tokens is wrong output),
    idle-after (within the named lease bound), alive, no-fatal-log (lines of an instance the
    fault killed, written before its restart, are the fault's, not a finding), kv-integrity."""
    if result is None:
        return [Check("fault-fired", None, "not checked: the fault workload did not run")]
    expected = sc.expect.completion_tokens if sc.expect.completion_tokens is not None else sc.max_tokens
    out = [fault_fired_check(result), fault_outcome_check(obs, result),
           recovery_serves_check(obs, result, expected)]
    if sc.parity:
        out.append(parity_check(obs.records, obs.parity))
    if result.drains:  # measured after the recovery request only (rig.workload.faults), bound then set
        bound = f"within kv_lease_duration + idle_margin_s = {result.idle_bound_s:g} s"
        out.append(idle_check(obs, drains=result.drains,
                              describe=lambda d: f"{d.describe()} ({bound})"))
    else:
        out.append(Check("idle-after", None, "not checked: recovery was not run"))
    down = tuple(n for n in result.killed if n not in result.restarted)
    out.append(alive_check(obs, skip=down))
    out.append(_fatal_log_check_survivors(obs, result, tuple(sc.fault.expected_survivor_errors) if sc.fault else ()))
    out.append(kv_integrity_check(obs))
    streamed = stream_check(obs.records)
    return out + ([streamed] if streamed else [])


def _fatal_log_check_survivors(obs: ScenarioObservation, result: FaultResult,
                               expected: tuple[str, ...] = ()) -> Check:
    """``no-fatal-log`` over the instances the fault did not kill; a killed instance's log
    (written before and at its death) is excluded and the exclusion named. ``expected``
    (``fault.expected_survivor_errors``): regexes of exception lines the fault makes a survivor
    log; once a fault fired, a traceback of an instance still alive that ends in such a line
    (:func:`rig.cluster.logs.fatal_lines` carries it) is named in the detail, not failed. Any
    other fatal line, on any survivor, still fails."""
    killed = set(result.killed)
    fired = any(e.fired for e in result.events)
    handled: dict[str, int] = {}

    def keep(name: str, line: str) -> bool:
        exc = line.split(" -> ", 1)[1] if TRACEBACK in line and " -> " in line else ""
        if fired and exc and name not in obs.dead and any(re.search(rx, exc) for rx in expected):
            handled[name] = handled.get(name, 0) + 1
            return False
        return True

    kept = {k: [ln for ln in v if keep(k, ln)] for k, v in obs.fatal_lines.items() if k not in killed}
    if not killed and not handled:
        return fatal_log_check(obs)
    trimmed = replace(obs, fatal_lines=kept, unscanned_logs={k: v for k, v in obs.unscanned_logs.items()
                                                             if k not in killed})
    c = fatal_log_check(trimmed)
    notes = [f"{', '.join(sorted(killed))} killed by the fault: its log not judged"] if killed else []
    notes += [f"{name}: {n} handled traceback(s) the fault was expected to cause (expected_survivor_errors)"
              for name, n in sorted(handled.items())]
    return replace(c, detail=c.detail + f" (survivors; {'; '.join(notes)})")
