"""``latency``: no hop of an answered P/D request waited far longer than the deployment's own
measured request, neither to its first token nor in total (the explorer's requirement: a hop that
waits a timeout's worth, or tens of times its baseline, is a finding with the wait named).

Each hop a request sent (``prefill``: P's hop of a P/D request; ``decode``: D's, or the one hop of a
straight-to-D request; ``router``: the one request through a router, which drives both hops itself)
is judged on what the transport timed (rig.transport.records.Hop): ``latency_s``, from sending the
hop to its whole answer (part ``total``), and for a streamed answer ``ttft_s``, to its first token
(part ``first-token``: a hop that waited before anything came). The bound
(rig.judge.windows.latency_bound) is 20 x the deployment's measured per-request baseline
(``ScenarioObservation.baseline_request_s``) x the work the hop may have waited for, in baseline
round trips (every request of the scenario: its own, and the ones it may have queued behind), at
least ``timeouts.latency_floor_s``, at most ``timeouts.kv_transfer_s``.

Left out, each counted in the detail with why: requests that were not answered (refused, timed
out, stalled, cancelled on purpose or by the run: their own checks judge them, and a wait cut short
says nothing of how long it would have been), every request when an instance died (the death is the
finding), and the decode hops of a scenario that holds them on purpose (``hold_between_s``: the
lease-hold motif's hold and pool flush; a held hop meets a lease that expired on purpose). The fault
kind is not judged at all: every request there runs under or right after a fault the scenario
injects (a nemesis ``delay-decode``, a SIGSTOP, a restart whose first request pays the costs the
baseline is measured without), and waves and the store kinds queue thousands of requests or cancel
them by design.

Not checked (never ok): no baseline (the warm-up's round trip failed, or nothing measured one: a
bound from another deployment says nothing of this one), no hop left to judge, or a hop over the
bound on a host starved since the baseline was measured: the 1-minute load average per CPU rose
enough (rig.judge.windows.load_slowdown) that the host alone could explain the wait, as the stall
watcher calls a frozen engine on a loaded host inconclusive (rig.observe.stall). A hop beyond the
bound times that slowdown still fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from rig.judge.checks import Check
from rig.judge.windows import Bound, latency_bound, load_slowdown, round_trips
from rig.observe.observations import ScenarioObservation
from rig.transport.records import Hop, PDRecord

NAME = "latency"
PARTS = ("first-token", "total")


@dataclass(frozen=True)
class HopWait:
    """One hop's wait: ``request`` id, ``hop`` (prefill | decode | router), ``instance`` that served
    it, ``part`` (``first-token``: ``Hop.ttft_s`` of a streamed answer; ``total``: ``Hop.latency_s``)
    and ``seconds``."""

    request: str
    hop: str
    instance: str
    part: str
    seconds: float

    def text(self) -> str:
        """'edge-0: decode hop (decode) waited 6.01 s in total'."""
        what = "to its first token" if self.part == "first-token" else "in total"
        return f"{self.request}: {self.hop} hop ({self.instance}) waited {self.seconds:.2f} s {what}"


@dataclass(frozen=True)
class LatencyJudgement:
    """What :func:`judge_latency` found: the ``bound`` (None without a baseline), the host's
    ``slowdown`` since the baseline (>= 1), the hops' timed parts judged (``waits``), the hops over
    the bound (``over``: one :class:`HopWait` per hop, its ``first-token`` part when that alone is
    over, longest first), and why requests were left out (``excluded``: reason -> count)."""

    bound: Bound | None
    slowdown: float
    waits: tuple[HopWait, ...]
    over: tuple[HopWait, ...]
    excluded: dict[str, int]

    @property
    def beyond_host(self) -> tuple[HopWait, ...]:
        """The hops over the bound even times the host's slowdown: a load that rose since the
        baseline cannot explain them."""
        if self.bound is None:
            return ()
        return _over(list(self.waits), Bound(self.bound.seconds * self.slowdown, self.bound.source))


def role_of(obs: ScenarioObservation, hop: Hop, first: bool) -> str:
    """``prefill`` / ``decode`` / ``router`` for a hop served by ``hop.instance`` (``first``: the
    prefill hop of a P/D request); another instance's name as it is."""
    if hop.instance == "router":
        return "router"
    if first or hop.instance == obs.prefill:
        return "prefill"
    return "decode" if hop.instance == obs.decode else hop.instance


def _work(r: PDRecord) -> float:
    """``r`` in baseline round trips: its prompt as D got it, and its answer (or what it asked for)."""
    prompt = len(r.decode_prompt) if r.decode_prompt and not isinstance(r.decode_prompt[0], list) \
        else r.prompt_token_count
    return round_trips(prompt, max(r.completion_tokens or 0, r.max_tokens * r.prompt_count))


def _waits(obs: ScenarioObservation, r: PDRecord, held: bool) -> list[HopWait]:
    """The timed parts of ``r``'s hops (its decode hop left out when ``held``)."""
    out = []
    hops = [(r.prefill, True), (r.decode, False)] if r.prefill is not None else [(r.decode, False)]
    for hop, first in hops:
        if hop is None or (held and not first):
            continue
        role = role_of(obs, hop, first and r.decode is not None)
        if hop.ttft_s is not None:
            out.append(HopWait(r.request_id, role, hop.instance, "first-token", hop.ttft_s))
        if hop.latency_s is not None:
            out.append(HopWait(r.request_id, role, hop.instance, "total", hop.latency_s))
    return out


def judge_latency(obs: ScenarioObservation, held_s: float = 0.0) -> LatencyJudgement:
    """The waits of ``obs``'s answered requests against the bound (module docstring); ``held_s``:
    the seconds the scenario holds every decode hop on purpose (``hold_between_s``; 0 = none).
    Pure: reads only ``obs``."""
    t = obs.timeouts
    work = sum(_work(r) for r in obs.records)
    bound = latency_bound(obs.baseline_request_s, work, t.latency_floor_s, t.kv_transfer_s)
    slowdown = load_slowdown(obs.baseline_host_load_1m, obs.host_load_1m, obs.host_cpus)
    excluded: dict[str, int] = {}
    waits: list[HopWait] = []
    for r in obs.records:
        if obs.dead:
            why = f"{', '.join(sorted(obs.dead))} died in the scenario"
        elif r.outcome != "ok":
            why = "cancelled" if r.outcome == "cancelled" else f"not answered ({r.outcome}: judged by its own checks)"
        else:  # answered: judged, but for a decode hop held on purpose (its prefill hop still is)
            waits += _waits(obs, r, held_s > 0)
            why = f"decode hop(s) held {held_s:g} s on purpose (hold_between_s)" if held_s > 0 else ""
        if why:
            excluded[why] = excluded.get(why, 0) + 1
    return LatencyJudgement(bound, slowdown, tuple(waits), _over(waits, bound), excluded)


def _over(waits: list[HopWait], bound: Bound | None) -> tuple[HopWait, ...]:
    """Per hop over ``bound``, its part that says where it waited: ``first-token`` when it waited
    that long before anything came, else ``total``; longest first."""
    if bound is None:
        return ()
    per_hop: dict[tuple[str, str, str], HopWait] = {}
    for w in waits:
        key = (w.request, w.hop, w.instance)
        if w.seconds > bound.seconds and (key not in per_hop or w.part == "first-token"):
            per_hop[key] = w
    return tuple(sorted(per_hop.values(), key=lambda w: -w.seconds))


def _left_out(j: LatencyJudgement) -> str:
    return "; left out: " + ", ".join(f"{n} {why}" for why, n in j.excluded.items()) if j.excluded else ""


def _load(obs: ScenarioObservation) -> str:
    return (f"host load {obs.host_load_1m:g} on {obs.host_cpus} CPUs, {obs.baseline_host_load_1m:g} when the "
            "baseline was measured") if obs.host_load_1m is not None and obs.baseline_host_load_1m is not None \
        else "host load unknown"


def latency_check(obs: ScenarioObservation, held_s: float = 0.0) -> Check:
    """``latency`` over ``obs`` (:func:`judge_latency`; the module docstring says what is judged,
    left out and not checked). A failure names each slow request with its hop, instance, wait and
    part, and the bound with its source; its ``requests`` are the slow requests."""
    j = judge_latency(obs, held_s)
    if j.bound is None:
        return Check(NAME, None, "not checked: no per-request baseline measured for this decode (the warm-up's "
                                 "round trip failed, or nothing measured one: report.json baselines says why)")
    if not j.waits:
        return Check(NAME, None, f"not checked: no hop to judge{_left_out(j)}")
    beyond = j.beyond_host
    if j.over and not beyond:
        return Check(NAME, None, f"not checked: {j.over[0].text()}, over the bound {j.bound.text()}, but the host "
                                 f"was starved ({_load(obs)}: up to {j.slowdown:.3g} x slower), which alone could "
                                 f"explain it{_left_out(j)}")
    if beyond:
        shown = "; ".join(w.text() for w in beyond[:4]) + (f"; and {len(beyond) - 4} more" if len(beyond) > 4 else "")
        host = f" (x {j.slowdown:.3g} for the host's load: {_load(obs)})" if j.slowdown > 1 else ""
        return Check(NAME, False, f"{shown}; bound {j.bound.text()}{host}{_left_out(j)}",
                     tuple(dict.fromkeys(w.request for w in beyond)))
    longest = max(j.waits, key=lambda w: w.seconds)
    n = len({w.request for w in j.waits})
    return Check(NAME, True, f"{n} request(s) within {j.bound.text()}: longest {longest.text()}{_left_out(j)}")
