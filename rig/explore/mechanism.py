"""A finding's identity is its mechanism, not the list of checks that failed.

Two actions that fail the same checks may be two bugs (a new stall folding into the known
livelock), and one bug may fail different checks (the livelock behind a D prefix hit, or after a
router appended P's first token). So a violation is named by what vLLM did, read from the
observation, in this order:

- **death**: the role that died, the exception and the code site of the first fatal frame (the
  innermost ``File "...", line N, in f`` of the traceback that ended it, from the instance's log:
  ``death:decode:AssertionError@nixl/base_worker.py:_apply_prefix_caching``);
- **stall**: the scheduler state of the frozen instance (rig.transport.records.StallFacts): its
  waiting reasons, KV-fetch stages, running requests, and the block arithmetic of the request
  against the free blocks (rig.judge.signatures.admission_of: ``fits-but-waits``, ``never-fits``,
  ``fits``), with the prompt as D got it (an appended token counts);
- **stale-read of cause retry**: a decode hop a router sent again with the same params (route
  pd-retry) answered HTTP 200 with other tokens than the reference while P's "Potentially invalid
  KV blocks for unrecognized request" line names those params (``stale-read:retry``);
- **divergence**: the hop whose answer differs from the reference, the first wrong position (0 or
  later), the choice, and where that prompt's KV came from on D (pulled over NIXL, D's prefix
  cache, recomputed, or a one-hop request's own), ``appended`` when a router appended P's token,
  ``decode-n=<n>`` when D's hop asked for ``n`` > 1 choices, ``retry`` on a retried decode hop;
- **refusal** (a 4xx the reference serves) and **http** (a 5xx): hop, status and the message with
  its numbers blanked;
- **slow**: the hop that waited past the latency bound (rig.judge.latency) and which part of it,
  to its first token or in total (``slow:decode:total``), with the wait and the bound in the
  evidence (the seconds are never in the key: the same wait is a bit longer or shorter each run);
- then what the remaining checks name: a **leak** (an instance not back to idle), a
  **fatal-log** line (exception of a survivor), **counters** that went down, **stale-read**
  (``kv-integrity`` alone; ``stale-read:retry`` when it names a retried decode hop); else the
  check-based signature.

:class:`Mechanism` carries the key (the identity, what replays and shrinking compare) and the
evidence a vLLM engineer needs to file it (rig.explore.known matches known issues on it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rig.config.blocks import BlockFacts
from rig.explore.grammar import Topology
from rig.explore.oracles import failed_hop, reference_serves
from rig.judge.counters import decreases
from rig.judge.latency import NAME as LATENCY
from rig.judge.latency import judge_latency
from rig.judge.signatures import admission_of, children_per_prompt
from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation
from rig.transport.records import PDRecord

_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_EXC = re.compile(r"(?:^|[\s>.:])(?P<exc>[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Fault)|AssertionError)\b")
_EXC_LINE = re.compile(r"(?P<exc>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Fault))(?::|$)")
_SITE = re.compile(r"\[(?P<site>[\w./-]+\.py:\d+)\]")
_PKGS = ("/vllm/", "/site-packages/", "/tests/")


@dataclass(frozen=True)
class Mechanism:
    """What vLLM did: ``kind`` (death, stall, divergence, refusal, http, slow, leak, fatal-log, counters,
    stale-read, checks), ``key`` (the identity) and ``evidence`` (name -> value, for the report
    and rig.explore.known)."""

    kind: str
    key: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict for explore.json."""
        return {"kind": self.kind, "key": self.key, "evidence": self.evidence}


def _short_path(path: str) -> str:
    """A frame's file relative to its package (``vllm/...``), stable across installs."""
    for marker in _PKGS:
        if marker in path:
            return path.rsplit(marker, 1)[1] if marker != "/vllm/" else "vllm/" + path.rsplit(marker, 1)[1]
    return path.rsplit("/", 1)[-1]


def death_site(text: str) -> tuple[str, str]:
    """``(exception, code site)`` of the first traceback in log ``text`` that ends in an
    exception: the exception's class name and the innermost frame (``file:function``); when no
    traceback is found, the first fatal-looking line's exception and its logger site
    (``[file.py:N]``); ``("?", "?")`` when nothing is there."""
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if "Traceback (most recent call last)" not in ln:
            continue
        frame: re.Match[str] | None = None
        for later in lines[i + 1:]:
            msg = later.split("] ", 1)[-1] if _SITE.search(later) else later
            m = _FRAME.search(msg)
            if m:
                frame = m
                continue
            e = _EXC_LINE.match(msg)
            if e and frame is not None:
                return e.group("exc").rsplit(".", 1)[-1], f"{_short_path(frame.group('path'))}:{frame.group('func')}"
    for ln in lines:
        e, s = _EXC.search(ln), _SITE.search(ln)
        if e:
            return e.group("exc"), s.group("site") if s else "?"
    return "?", "?"


def _death(obs: ScenarioObservation, roles: dict[str, str], logs: dict[str, str]) -> Mechanism | None:
    if not obs.dead:
        return None
    name = sorted(obs.dead)[0]
    line = obs.death_lines.get(name, "")
    exc, site = death_site(logs.get(name) or line)
    role = roles.get(name, name)
    return Mechanism("death", f"death:{role}:{exc}@{site}", {"role": role, "exception": exc, "site": site,
                                                              "line": line[:300], "exit": obs.dead[name]})


def _d_prompt_len(r: PDRecord) -> int:
    p = r.decode_prompt if r.decode_prompt is not None else r.prompt
    return len(p) if p and not isinstance(p[0], list) else r.prompt_len


def _stall(obs: ScenarioObservation, topo: Topology, roles: dict[str, str]) -> Mechanism | None:
    r = next((r for r in obs.records if r.outcome == "stalled" and r.stall is not None), None)
    if r is None or r.stall is None:
        return None
    f = r.stall
    role = roles.get(f.instance, f.instance)
    blocks = BlockFacts(block_size=topo.block_size, usable_blocks=topo.usable_blocks,
                        num_speculative_tokens=topo.spec_tokens, max_model_len=topo.max_model_len) \
        if role == "decode" else None
    fit, arithmetic = admission_of(_d_prompt_len(r), blocks, f)
    reasons = sorted(k for k, v in f.waiting_reasons.items() if v > 0)
    stages = sorted(k for k, v in f.kv_fetch_stages.items() if v > 0)
    key = (f"stall:{role}:waiting={','.join(reasons) or '-'}:fetch={','.join(stages) or '-'}"
           f":running={int(f.running)}:{fit}")
    return Mechanism("stall", key, {"role": role, "waiting_reasons": reasons, "kv_fetch_stages": stages,
                                    "running": f.running, "waiting": f.waiting, "kv_usage": f.kv_usage,
                                    "admission": fit, "arithmetic": arithmetic, "request": r.request_id,
                                    "prompt_tokens_on_d": _d_prompt_len(r), "frozen_s": f.duration_s})


def kv_source(r: PDRecord, obs: ScenarioObservation) -> str:
    """Where the prompt's KV came from on D: ``one-hop`` (a request sent straight to an instance:
    its own compute or cache), else from D's counters over the action: ``pulled``,
    ``pulled+d-cache``, ``d-cache``, ``recomputed`` or ``unknown``."""
    if r.prefill is None or r.decode is None:
        return "one-hop"
    ev = obs.evidence
    if ev is None:
        return "unknown"
    parts = [name for name, v in (("pulled", ev.external_prompt_tokens), ("d-cache", ev.cached_prompt_tokens))
             if v > 0]
    return "+".join(parts) or ("recomputed" if ev.computed_prompt_tokens > 0 else "unknown")


def _divergence(obs: ScenarioObservation) -> Mechanism | None:
    if len(obs.parity) != len(obs.records):
        return None
    for r, p in zip(obs.records, obs.parity, strict=True):
        if p is None or p.status != "diverged":
            continue
        hop = "decode" if r.prefill is not None or r.decode is not None else "?"
        if r.prefill is not None and r.decode is None:
            hop = "prefill"
        pos = "0" if p.position == 0 else ">0" if p.position is not None else (p.field or "?")
        appended = r.decode_prompt is not None and len(r.decode_prompt) > len(r.prompt)
        src = kv_source(r, obs)
        children = children_per_prompt(r.decode, r.prompt_count)
        key = (f"divergence:{hop}:pos={pos}:choice={p.choice or 0}:kv={src}" + (":appended" if appended else "")
               + (f":decode-n={children}" if children > 1 else "") + (":retry" if r.first_decode else ""))
        return Mechanism("divergence", key, {"request": r.request_id, "hop": hop, "position": p.position,
                                             "choice": p.choice, "kv_source": src, "appended": appended,
                                             "prompts": r.prompt_count, "decode_children": children,
                                             "prefill_children": children_per_prompt(r.prefill, r.prompt_count),
                                             "detail": p.describe()})
    return None


def _retry_stale(obs: ScenarioObservation) -> Mechanism | None:
    """A retried decode hop (route pd-retry: ``first_decode`` kept) that answered HTTP 200 with
    other tokens than the reference while P's ``Potentially invalid KV blocks for unrecognized
    request`` line names its params: D's retry read the blocks P freed after the first attempt's
    read (nixl base_worker.py frees them on D's done notice), a stale read of cause ``retry``."""
    if len(obs.parity) != len(obs.records):
        return None
    lines = [ln for v in obs.kv_integrity_lines.values() for ln in v if "Potentially invalid KV blocks" in ln]
    for r, p in zip(obs.records, obs.parity, strict=True):
        rid = (r.prefill.kv_transfer_params or {}).get("remote_request_id") if r.prefill else None
        if r.first_decode is None or r.outcome != "ok" or p is None or p.status != "diverged" or not rid:
            continue
        line = next((ln for ln in lines if rid in ln), None)
        if line is not None:
            return Mechanism("stale-read", "stale-read:retry", {
                "request": r.request_id, "cause": "retry", "first_attempt": r.first_decode.error or "answered",
                "position": p.position, "detail": p.describe(), "line": line[line.find("Potentially"):][:200]})
    return None


def _message(text: str) -> str:
    """An error message with its numbers and ids blanked (the same refusal with another length)."""
    return re.sub(r"\d+", "N", re.sub(r"cmpl-[\w-]+", "<id>", text or ""))[:120]


def _http(obs: ScenarioObservation, refusal_served: bool) -> Mechanism | None:
    for r in obs.records:
        if r.outcome != "http_error":
            continue
        hop, status = failed_hop(r)
        h = r.decode if hop == "decode" else r.prefill
        msg = _message(h.error if h is not None and h.error else r.diagnosis)
        if reference_serves(r) and refusal_served:
            return Mechanism("refusal", f"refusal:{hop}:{status}:{msg}", {"request": r.request_id, "hop": hop,
                                                                          "status": status, "message": msg,
                                                                          "reference_status": r.reference.status
                                                                          if r.reference else None})
        if status is not None and status >= 500:
            return Mechanism("http", f"http:{hop}:{status}:{msg}", {"request": r.request_id, "hop": hop,
                                                                    "status": status, "message": msg})
    return None


def _slow(v: ScenarioVerdict, obs: ScenarioObservation, held_s: float) -> Mechanism | None:
    """The longest hop over the latency bound when ``latency`` failed (rig.judge.latency, judged
    again on ``obs`` with the action's ``held_s``, as the kind judged it)."""
    if not any(c.name == LATENCY and c.ok is False for c in v.checks):
        return None
    j = judge_latency(obs, held_s)
    if not j.beyond_host or j.bound is None:
        return None
    w = j.beyond_host[0]
    return Mechanism("slow", f"slow:{w.hop}:{w.part}", {"request": w.request, "hop": w.hop, "part": w.part,
                                                        "instance": w.instance, "wait_s": round(w.seconds, 3),
                                                        "bound_s": j.bound.seconds, "bound": j.bound.source,
                                                        "baseline_s": obs.baseline_request_s})


def _from_checks(v: ScenarioVerdict, obs: ScenarioObservation, roles: dict[str, str],
                 signature: str) -> Mechanism:
    failed = {c.name: c for c in v.checks if c.ok is False}
    if "idle-after" in failed or "released-by-d" in failed:
        busy = sorted(roles.get(d.instance, d.instance) for d in obs.drains if d.idle is False)
        return Mechanism("leak", f"leak:{','.join(busy) or 'lease'}", {"not_idle": busy, "checks": sorted(failed),
                                                                      "detail": next(iter(failed.values())).detail})
    if "no-fatal-log" in failed:
        name, lines = next(((n, ls) for n, ls in sorted(obs.fatal_lines.items()) if ls), ("?", []))
        exc, site = death_site("\n".join(lines))
        return Mechanism("fatal-log", f"fatal-log:{roles.get(name, name)}:{exc}@{site}",
                         {"role": roles.get(name, name), "line": (lines or [""])[0][:300]})
    if "counters-monotonic" in failed:
        found, _ = decreases([r for r in obs.timeline if r.get("counters")])
        series = sorted({f"{roles.get(d.split(':', 1)[0], d.split(':', 1)[0])}:{d.split(' ')[1]}" for d in found})
        return Mechanism("counters", f"counters:{','.join(series) or '?'}", {"decreases": found[:5]})
    if "kv-integrity" in failed:
        # n > 1 on D's hop of a one-choice P answer: every child reads P's blocks (a read after the
        # first child's done notice freed them), a mechanism of its own beside a lease expiry.
        children = max((children_per_prompt(r.decode, r.prompt_count) for r in obs.records
                        if children_per_prompt(r.prefill, r.prompt_count) == 1), default=1)
        retried = any(r.first_decode is not None and r.request_id in failed["kv-integrity"].requests
                      for r in obs.records)  # the retry of a pd-retry step read what the first freed
        return Mechanism("stale-read", "stale-read:" + ("retry" if retried else "kv-integrity")
                         + (":decode-n" if children > 1 else ""),
                         {"detail": failed["kv-integrity"].detail, "decode_children": children,
                          "cause": "retry" if retried else ""})
    return Mechanism("checks", f"checks:{signature}", {"checks": sorted(failed)})


def mechanism_of(v: ScenarioVerdict, obs: ScenarioObservation, topo: Topology, roles: dict[str, str],
                 signature: str, logs: dict[str, str] | None = None, held_past_lease: bool = False,
                 held_s: float = 0.0) -> Mechanism:
    """The mechanism of a violation with check-based ``signature`` (rig.explore.oracles), from the
    observation; ``logs``: the text the dead instances logged during the run (their first
    traceback names the site); ``roles`` maps instance names to prefill/decode;
    ``held_past_lease``: the action held the decode hop at least P's lease (in the evidence, for
    the lease issues; not in the key); ``held_s``: the seconds it held the decode hop (the latency
    check leaves such a hop out)."""
    m = (_death(obs, roles, logs or {}) or _stall(obs, topo, roles) or _retry_stale(obs) or _divergence(obs)
         or _http(obs, "refused-reference-serves" in signature) or _slow(v, obs, held_s)
         or _from_checks(v, obs, roles, signature))
    return Mechanism(m.kind, m.key, {**m.evidence, "held_past_lease": held_past_lease})
