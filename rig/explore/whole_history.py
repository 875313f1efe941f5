"""Checks over the whole history of an exploration, after the run (Jepsen's Elle: checkers that
read the complete history, not one action at a time).

Each check reads every exploring action of ``history.jsonl`` (phase explore or nemesis) with what
rig.explore.lives records: the deployment ``life`` the action ran on, its counter windows and a
prompt identity per request. A life is judged on its own (counters restart with a new process,
a new topology has other caches):

1. ``crossed-answers``: no answer equals the non-disaggregated reference answer of *another*
   prompt of the same life while differing from its own reference: KV read from another
   request's blocks, across actions (rig.explore.oracles.crossed_answers judges one action);
2. ``transfers-conserved``: per life, the NIXL transfers D counted (done, failed) and the leases
   P reaped (expired) fit the KV offers the rig's requests made;
3. ``counters-quiet``: no request-driven counter moves between two actions, when no request of
   the rig is in flight (the lease reaper's expiry after an abandon is excused by name);
4. ``every-request-ended``: no request of the history is left without an outcome.

A check that cannot look (a counter missing, an old history without the fields) is "not
checked" with the reason, never ok. Each failed check gives :class:`HistoryFailure` rows, each
with a mechanism key (``history:crossed-answer``, ``history:transfers-not-conserved``,
``history:counter-moved-idle:<counter>``, ``history:no-outcome``) naming its actions and requests.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from rig.explore.lives import source_key
from rig.explore.mechanism import Mechanism
from rig.observe import metrics as m

# An answer shorter than this is never judged a crossed answer: the tiny models the rig runs
# answer a 1- or 2-token completion with the same few frequent tokens for many prompts, so two
# prompts' short answers collide by chance. Four tokens of one prompt's answer in another's is
# distinctive, and a sequence that is the reference of two or more other prompts is the model's
# generic answer (also never judged).
MIN_TOKENS = 4
# The counters a request moves and nothing else does (rig.explore.lives.WATCHED without the
# per-source split): any of them moving with no request in flight is unexplained.
QUIET = (m.PROMPT_TOKENS, m.GENERATION_TOKENS, m.REQUEST_SUCCESS, m.PREEMPTIONS, m.NIXL_XFER_COUNT,
         m.NIXL_FAILED_TRANSFERS, m.NIXL_FAILED_NOTIFS, m.NIXL_EXPIRED, m.PREFIX_QUERIES)
# Seconds past P's kv_lease_duration its reaper may take to count an expiry (it runs each engine
# step; a loaded 2-core host is slow to step).
REAPER_SLACK_S = 5.0
ENDED = frozenset({"ok", "stalled", "timeout", "http_error", "connection_error", "empty", "cancelled"})


@dataclass(frozen=True)
class HistoryFailure:
    """One violation a whole-history check found: its mechanism ``key``, the ``life``, the
    ``actions`` (indexes) and ``requests`` (ids) it names, and the ``detail`` in words."""

    key: str
    life: int | None
    actions: tuple[int, ...]
    requests: tuple[str, ...]
    detail: str

    def mechanism(self) -> Mechanism:
        """The finding's mechanism (kind ``history``)."""
        return Mechanism("history", self.key, {"life": self.life, "actions": list(self.actions),
                                               "requests": list(self.requests), "detail": self.detail})


@dataclass
class HistoryCheck:
    """One whole-history check: ``state`` ok / failed / not checked, ``detail`` in words,
    ``samples`` (the actions it judged) and its ``failures``."""

    name: str
    state: str
    detail: str
    samples: int = 0
    failures: list[HistoryFailure] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict for explore.json."""
        return {"check": self.name, "state": self.state, "detail": self.detail, "samples": self.samples,
                "failures": [f.__dict__ | {"actions": list(f.actions), "requests": list(f.requests)}
                             for f in self.failures]}


def _judged(name: str, samples: int, failures: list[HistoryFailure], ok: str, not_checked: str = "") -> HistoryCheck:
    if failures:
        return HistoryCheck(name, "failed", "; ".join(f.detail for f in failures[:3])
                            + (f"; and {len(failures) - 3} more" if len(failures) > 3 else ""), samples, failures)
    if not_checked:
        return HistoryCheck(name, "not checked", not_checked, samples)
    return HistoryCheck(name, "ok", ok, samples)


def by_life(entries: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    """The entries grouped by their ``life`` (None for a history written without lives), in order."""
    out: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        out[e.get("life")].append(e)
    return out


# --- 1. crossed answers ---------------------------------------------------------------------------
def _tokens(hop: dict[str, Any] | None) -> tuple[int, ...]:
    """The first choice's token IDs of a hop (its ``choices[0]``, else ``token_ids``)."""
    if not hop:
        return ()
    return tuple((hop.get("choices") or [hop.get("token_ids") or []])[0] or ())


def _same_start(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """The compared length when ``a`` and ``b`` agree on their first ``min(len)`` tokens, else 0."""
    n = min(len(a), len(b))
    return n if n and a[:n] == b[:n] else 0


def check_crossed(entries: list[dict[str, Any]]) -> HistoryCheck:
    """Check 1 (module docstring). An answer ``a`` (D's hop, the first choice) of a request with
    prompt key ``p`` is crossed when, over ``n = min(len(a), len(ref))`` >= :data:`MIN_TOKENS`
    tokens, it equals the reference answer ``ref`` of a prompt ``q != p`` of the same life, its own
    reference differs from it over those tokens, and no second prompt other than ``p`` has that
    start (the model's generic answer). Not checked when no record carries a prompt key."""
    failures: list[HistoryFailure] = []
    samples = keyed = 0
    for life, group in by_life(entries).items():
        refs: dict[str, tuple[tuple[int, ...], int, str]] = {}  # prompt key -> (reference, action, request)
        for e in group:
            for r in e.get("records") or []:
                if r.get("prompt_key") and (ref := _tokens(r.get("reference"))):
                    refs.setdefault(r["prompt_key"], (ref, e.get("index", -1), r["request_id"]))
        for e in group:
            judged = False
            for r in e.get("records") or []:
                key = r.get("prompt_key")
                keyed += bool(key)
                a, own = _tokens(r.get("decode")), _tokens(r.get("reference"))
                if not key or len(a) < MIN_TOKENS or not own:
                    continue
                judged = True
                if a == own:
                    continue
                hits = [(q, act, rid, n) for q, (ref, act, rid) in refs.items()
                        if q != key and (n := _same_start(a, ref)) >= MIN_TOKENS and own[:n] != a[:n]]
                if len(hits) != 1:  # none, or the model's generic answer
                    continue
                q, act, rid, n = hits[0]
                failures.append(HistoryFailure(
                    "history:crossed-answer", life, tuple(sorted({act, e.get("index", -1)})), (r["request_id"], rid),
                    f"life {life}: request {r['request_id']} (action {e.get('index')}) answered the first {n} "
                    f"tokens of the reference of request {rid}'s other prompt (action {act}), not its own"))
            samples += judged
    if not keyed:
        return HistoryCheck("crossed-answers", "not checked",
                            "no record carries a prompt identity (prompt_key: a history written before it)", 0)
    return _judged("crossed-answers", samples, failures,
                   f"no answer of >= {MIN_TOKENS} tokens equals another prompt's reference "
                   f"over {len(by_life(entries))} life(s)")


# --- 2. conservation of transfers ---------------------------------------------------------------
def _delta(w: dict[str, Any] | None, name: str) -> float | None:
    """``end - start`` of counter ``name`` over one instance window; None when a reading or the
    counter is missing, or the window spans a restart (another process life)."""
    if not w or not w.get("start") or not w.get("end") or w["start"].get("life") != w["end"].get("life"):
        return None
    a, b = w["start"]["values"].get(name), w["end"]["values"].get(name)
    return None if a is None or b is None else b - a


def _role_window(e: dict[str, Any], role: str) -> dict[str, Any] | None:
    return next((w for w in (e.get("counters") or {}).values() if w.get("role") == role), None)


def offered(r: dict[str, Any]) -> bool:
    """Whether P made a KV offer for record ``r``: its prefill hop answered 2xx with
    ``kv_transfer_params`` naming remote blocks (P keeps them for D until read or reaped)."""
    p = r.get("prefill") or {}
    ktp = p.get("kv_transfer_params") or {}
    blocks = ktp.get("remote_block_ids")
    return bool(p.get("status") and 200 <= p["status"] < 300 and blocks and any(blocks))


def _offer_bounds(e: dict[str, Any], ext_tokens: float, max_model_len: int) -> tuple[int, int, int]:
    """``(offers, lowest, highest)`` transfer outcomes (done + failed + expired) the action's
    offers allow. An offer D answered reads once per choice at most (vLLM's ``n`` children each
    read, rig.judge.signatures.children_per_prompt); one that never reached D may only expire; a
    cut, failed or nemesis-held one may be read, fail (a handshake or notification failure counts
    too, nixl/stats.py) and expire, or none of these (D's abort notice freed it): up to 3 per
    choice. Lowest: D's pulled prompt tokens over the most one transfer carries (a prompt of
    ``max_model_len``), since D may serve a prompt from its own cache without a read. A router's
    retry of the decode hop (route pd-retry: the first attempt kept as ``first_decode``) sends the
    same offer to D twice, each attempt with the outcomes of a cut one: up to 3 per choice more."""
    n = hi = 0
    for r in e.get("records") or []:
        if not offered(r):
            continue
        n += 1
        d = r.get("decode")
        choices = max(1, len((d or {}).get("choices") or []))
        if d is None:
            hi += 1
        elif r.get("outcome") == "ok" and e.get("phase") != "nemesis":
            hi += choices
        else:
            hi += 3 * choices
        if r.get("first_decode") is not None:
            hi += 3 * choices
    lo = -(-int(ext_tokens) // max(1, max_model_len)) if ext_tokens > 0 else 0
    return n, lo, hi


def check_conservation(entries: list[dict[str, Any]]) -> HistoryCheck:
    """Check 2 (module docstring): per life, the lowest <= done + failed + expired <= the highest
    of :func:`_offer_bounds` summed over the life's actions, done being D's
    ``vllm:nixl_bytes_transferred_count``, failed D's ``vllm:nixl_num_failed_transfers_total``,
    expired P's ``vllm:nixl_num_kv_expired_reqs_total`` (vLLM counts expiry on P, nixl/stats.py).
    An action whose window spans a restart is left out (its counters restarted). Not checked when
    an instance lacks one of these counters or the history carries no counter windows."""
    need = {"decode": (m.NIXL_XFER_COUNT, m.NIXL_FAILED_TRANSFERS, source_key("external_kv_transfer")),
            "prefill": (m.NIXL_EXPIRED,)}
    failures: list[HistoryFailure] = []
    samples, missing, spanning = 0, set(), 0
    for life, group in by_life(entries).items():
        tot = {"offers": 0, "lo": 0, "hi": 0, "done": 0.0, "failed": 0.0, "expired": 0.0}
        acts: list[int] = []
        for e in group:
            if not e.get("counters"):
                missing.add("the history's counter windows (a history written before them)")
                continue
            ws = {role: _role_window(e, role) for role in need}
            vals = {(role, c): _delta(ws[role], c) for role, cs in need.items() for c in cs}
            if any(v is None for v in vals.values()):
                if any(w and w.get("start") and w.get("end") and w["start"].get("life") != w["end"].get("life")
                       for w in ws.values()):
                    spanning += 1
                else:
                    missing |= {f"{role}'s {c}" for (role, c), v in vals.items() if v is None}
                continue
            n, lo, hi = _offer_bounds(e, vals[("decode", source_key("external_kv_transfer"))] or 0.0,
                                      int((e.get("topology") or {}).get("max_model_len") or 1))
            tot["offers"] += n
            tot["lo"] += lo
            tot["hi"] += hi
            tot["done"] += vals[("decode", m.NIXL_XFER_COUNT)] or 0.0
            tot["failed"] += vals[("decode", m.NIXL_FAILED_TRANSFERS)] or 0.0
            tot["expired"] += vals[("prefill", m.NIXL_EXPIRED)] or 0.0
            acts.append(e.get("index", -1))
            samples += 1
        counted = tot["done"] + tot["failed"] + tot["expired"]
        if acts and not tot["lo"] <= counted <= tot["hi"]:
            way = "more than the offers allow" if counted > tot["hi"] else "fewer than D's pulled tokens need"
            failures.append(HistoryFailure(
                "history:transfers-not-conserved", life, tuple(acts), (),
                f"life {life} ({len(acts)} actions {acts[0]}-{acts[-1]}): {tot['offers']} KV offers allow "
                f"{tot['lo']}..{tot['hi']} transfer outcomes; counted done {tot['done']:g} + failed "
                f"{tot['failed']:g} + expired {tot['expired']:g} = {counted:g}, {way}"))
    left = f"; {spanning} action(s) spanning a restart left out" if spanning else ""
    why = f"not judged without {', '.join(sorted(missing))}" if missing and not samples else ""
    return _judged("transfers-conserved", samples, failures,
                   f"done + failed + expired within the offers' bounds in every life{left}"
                   + (f"; some actions lacked {', '.join(sorted(missing))}" if missing else ""), why)


# --- 3. counters quiet between actions -----------------------------------------------------------
def abandoned(r: dict[str, Any]) -> bool:
    """Whether record ``r`` left a KV offer D did not take whole: P offered (:func:`offered`)
    and D's hop never went, or did not answer ok (cut, failed, timed out): P's lease reaper ends it."""
    return offered(r) and (r.get("decode") is None or r.get("outcome") != "ok")


def _reaper_excuse(group: list[dict[str, Any]], gap_start: float, moved: float, lease_s: float) -> str | None:
    """Why P's expiry counter may move by ``moved`` in a gap starting at ``gap_start`` (unix s):
    the actions of ``group`` (the life's, up to the gap) that abandoned offers (:func:`abandoned`) and ended less
    than ``lease_s`` + :data:`REAPER_SLACK_S` before it, when they abandoned at least ``moved``;
    else None."""
    recent = [(e.get("index", -1), sum(abandoned(r) for r in e.get("records") or [])) for e in group
              if ((_role_window(e, "prefill") or {}).get("end") or {}).get("wall", -1e18) + lease_s + REAPER_SLACK_S
              >= gap_start]
    recent = [(i, k) for i, k in recent if k]
    if not recent or sum(k for _, k in recent) < moved:
        return None
    return (f"lease-reaper: P reaped {moved:g} lease(s) of the {sum(k for _, k in recent)} request(s) abandoned "
            f"in action(s) {', '.join(str(i) for i, _ in recent)} within kv_lease_duration {lease_s:g} s")


def _gap(prev: dict[str, Any], nxt: dict[str, Any]) -> tuple[list[tuple[str, str, dict, dict]], str]:
    """The (instance, role, end reading of ``prev``, pre reading of ``nxt``) pairs of the gap
    between two actions, or [] with why the gap cannot be judged."""
    if prev.get("idle_after") is not True:
        return [], "the earlier action did not end idle (a request may still run)"
    out = []
    for name, w in (prev.get("counters") or {}).items():
        end, pre = w.get("end"), ((nxt.get("counters") or {}).get(name) or {}).get("pre")
        if end is None or pre is None:
            return [], f"{name} has no reading at the gap's ends"
        if end.get("life") is None or pre.get("life") is None:
            return [], f"{name} exposes no {m.PROCESS_START} (a restart cannot be told from a move)"
        if end["life"] != pre["life"]:
            return [], f"{name} restarted in the gap (a new life)"
        out.append((name, w.get("role", "?"), end, pre))
    return out, "" if out else "no counter windows"


def check_quiet(entries: list[dict[str, Any]]) -> HistoryCheck:
    """Check 3 (module docstring): between one action's ``end`` reading and the next action's
    ``pre`` reading on the same life (rig.explore.lives), no counter of :data:`QUIET` moves.
    Excused by name: P's ``vllm:nixl_num_kv_expired_reqs_total`` moving within its
    kv_lease_duration after actions that abandoned at least that many offers (:func:`_reaper_excuse`).
    A gap after an action that did not end idle, or across a restart, is not judged."""
    failures: list[HistoryFailure] = []
    samples, excused, why_not = 0, [], set()
    for i in range(len(entries) - 1):
        prev, nxt = entries[i], entries[i + 1]
        life = nxt.get("life")
        if life is None or prev.get("life_end", prev.get("life")) != life:
            continue  # another topology or a restart: counters start again
        pairs, why = _gap(prev, nxt)
        if not pairs:
            why_not.add(why)
            continue
        samples += 1
        lease = float((prev.get("topology") or {}).get("lease_s") or 0.0)
        same = [e for e in entries[:i + 1] if life in (e.get("life"), e.get("life_end"))]
        for name, role, end, pre in pairs:
            for c in QUIET:
                a, b = end["values"].get(c), pre["values"].get(c)
                if a is None or b is None or b <= a:
                    continue
                excuse = _reaper_excuse(same, end["wall"], b - a, lease) \
                    if c == m.NIXL_EXPIRED and role == "prefill" else None
                if excuse:
                    excused.append(f"{c} on {name} after action {prev.get('index')}: {excuse}")
                    continue
                failures.append(HistoryFailure(
                    f"history:counter-moved-idle:{c}", life, (prev.get("index", -1), nxt.get("index", -1)), (),
                    f"life {life}: {c} on {name} ({role}) rose by {b - a:g} between action {prev.get('index')}'s "
                    f"end and action {nxt.get('index')}'s start ({pre['wall'] - end['wall']:.1f} s, no request "
                    "of the rig in flight)"))
    if not samples:
        return HistoryCheck("counters-quiet", "not checked",
                            "no gap between two actions could be judged" + (f": {'; '.join(sorted(why_not))}"
                                                                            if why_not else ""), 0)
    return _judged("counters-quiet", samples, failures,
                   f"no request-driven counter moved in {samples} gap(s) between actions"
                   + (f"; excused: {'; '.join(excused)}" if excused else "")
                   + (f"; gaps not judged: {'; '.join(sorted(why_not))}" if why_not else ""))


# --- 4. every request ended ----------------------------------------------------------------------
def check_outcomes(entries: list[dict[str, Any]]) -> HistoryCheck:
    """Check 4 (module docstring): every record of every action has an outcome (``pending`` or
    none is a request the rig never saw end: each action's bound is judged with the action)."""
    failures = []
    for e in entries:
        left = [r.get("request_id", "?") for r in e.get("records") or [] if r.get("outcome") not in ENDED]
        if left:
            failures.append(HistoryFailure("history:no-outcome", e.get("life"), (e.get("index", -1),), tuple(left),
                                           f"action {e.get('index')}: {len(left)} request(s) without an outcome: "
                                           f"{', '.join(left[:5])}"))
    total = sum(len(e.get("records") or []) for e in entries)
    return _judged("every-request-ended", len(entries), failures,
                   f"all {total} requests of {len(entries)} actions ended with an outcome")


def run_checks(entries: list[dict[str, Any]]) -> list[HistoryCheck]:
    """The four whole-history checks over ``entries`` (history lines of phase explore or nemesis,
    in order)."""
    return [check_crossed(entries), check_conservation(entries), check_quiet(entries), check_outcomes(entries)]
