"""Known issues matched on a finding's mechanism (rig.explore.mechanism), with the reason.

A known issue's symptom (rig.config.expectations: stall, crash, http-error, stale-kv, leak,
appended-token, wrong-metrics, wrong-output) is compared field by field with the mechanism's
evidence, never with the list of failed checks: the admission livelock behind a D prefix hit, or
after a router appended P's first token, is still a stall on decode waiting for capacity with its
KV fetch not started and a request that fits the free blocks; the two-prompts issue is a
divergence on a later choice of a several-prompt request whatever other fields it carried; the
decode assert is a death whose fatal line matches. Each match says why, field by field, and
whether the build's vLLM version is inside the issue's ``affects`` range.

:func:`load_known` reads the known issues of ``--known`` suites through the rig's one loader
(rig.config.files) and validates each as a :class:`rig.config.expectations.KnownIssue`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from rig.config import ConfigError, RigConfig
from rig.config.expectations import KnownIssue
from rig.config.files import load_yaml
from rig.explore.mechanism import Mechanism


@dataclass(frozen=True)
class KnownMatch:
    """A known issue ``id`` that explains a mechanism: ``why`` (the fields compared, in words) and
    ``in_range`` (the vLLM version is inside ``affects``; None when the version is unknown)."""

    id: str
    why: str
    in_range: bool | None

    def label(self) -> str:
        """The id, with '(outside affects)' when the version is outside the issue's range."""
        return self.id + (" (outside affects)" if self.in_range is False else "")


def load_known(cfg: RigConfig, suites: list[str]) -> list[dict[str, Any]]:
    """Distinct known issues (as mappings, by id) declared by the config's scenarios and by the
    scenarios of ``suites`` (YAML lists, read with rig.config.files.load_yaml). Raises ConfigError
    (an InputFileError) naming a suite that cannot be read, or a known issue that does not validate."""
    out: dict[str, dict[str, Any]] = {}
    for sc in cfg.scenarios:
        if sc.known_issue is not None:
            out.setdefault(sc.known_issue.id, sc.known_issue.model_dump(mode="json", exclude_none=True))
    for path in suites:
        data = load_yaml(Path(path), "--known", "give a suite YAML file (a list of scenarios)", top=list)
        for i, sc in enumerate(data):
            ki = sc.get("known_issue") if isinstance(sc, dict) else None
            if not (isinstance(ki, dict) and ki.get("id")):
                continue
            try:
                issue = KnownIssue.model_validate(ki)
            except ValueError as e:
                raise ConfigError(f"--known {path}: scenario {i} known_issue does not validate: {e}") from None
            out.setdefault(issue.id, issue.model_dump(mode="json", exclude_none=True))
    return list(out.values())


def _in_range(affects: str, version: str) -> bool | None:
    try:
        return Version(version) in SpecifierSet(affects, prereleases=True)
    except (InvalidVersion, InvalidSpecifier):
        return None


def _stall(sym: dict[str, Any], ev: dict[str, Any]) -> list[str] | None:
    if ev.get("role") != sym.get("instance", "decode"):
        return None
    why = [f"stall on {ev['role']}"]
    for name, have in (("waiting_reason", ev.get("waiting_reasons", [])), ("kv_fetch_stage", ev.get("kv_fetch_stages",
                                                                                                    []))):
        want = sym.get(name)
        if want is not None and want not in have:
            return None
        if want is not None:
            why.append(f"{name} {want}")
    usage = ev.get("kv_usage", 0.0)
    if (sym.get("kv_usage_max") is not None and usage > sym["kv_usage_max"]) or \
            (sym.get("kv_usage_min") is not None and usage < sym["kv_usage_min"]):
        return None
    if sym.get("admission") is not None:
        if ev.get("admission") != sym["admission"]:
            return None
        why.append(f"admission {sym['admission']} ({ev.get('arithmetic', '')})")
    return why


def _decode_children(m: Mechanism, ev: dict[str, Any]) -> list[str] | None:
    """Why the decode-children stale read explains ``m``: a divergence on a choice after 0 of a
    one-prompt request that asked for n > 1 on the decode hop only, or a stale read of one."""
    n = ev.get("decode_children", 1)
    if n < 2 or ev.get("prefill_children", 1) != 1:
        return None
    if m.kind == "divergence" and ev.get("prompts", 1) == 1 and (ev.get("choice") or 0) > 0:
        return [f"divergence on choice {ev['choice']} of a request with n={n} on the decode hop only"]
    if m.kind == "stale-read":
        return [f"P logged a read of released blocks by a request with n={n} on the decode hop only"]
    return None


def _explains(sym: dict[str, Any], m: Mechanism) -> list[str] | None:
    """The reasons (field by field) why symptom ``sym`` explains ``m``; None when it does not."""
    ev, kind = m.evidence, sym.get("kind")
    if kind == "stall" and m.kind == "stall":
        return _stall(sym, ev)
    if kind in ("crash", "appended-token") and m.kind in ("death", "fatal-log"):
        rx, role = sym.get("fatal_log", ""), sym.get("instance", "decode")
        if rx and re.search(rx, ev.get("line", "")) and ev.get("role") == role:
            return [f"{ev['role']} {m.kind} with a fatal line matching {rx!r}"]
        return None
    if kind == "http-error" and m.kind in ("http", "refusal"):
        if ev.get("hop") != sym.get("hop", "decode") or (sym.get("status") and ev.get("status") != sym["status"]):
            return None
        if sym.get("message") and not re.search(sym["message"], ev.get("message", "")):
            return None
        return [f"HTTP {ev.get('status')} on the {ev.get('hop')} hop"]
    if kind == "stale-kv" and sym.get("cause") == "decode-children":
        return _decode_children(m, ev)
    if kind == "stale-kv" and sym.get("cause") == "retry":
        return ["a decode hop sent again with the same params read the blocks P freed after the first read"] \
            if m.kind == "stale-read" and ev.get("cause") == "retry" else None
    if kind == "stale-kv" and m.kind == "divergence":
        if sym.get("cause") == "shared-params":
            ok = ev.get("prompts", 1) > 1 and (ev.get("choice") or 0) > 0
            return [f"divergence on choice {ev.get('choice')} of a {ev.get('prompts')}-prompt request"] if ok else None
        return ["divergence after the decode hop was held past the lease"] if ev.get("held_past_lease") else None
    if kind == "stale-kv" and m.kind == "stale-read" and sym.get("cause", "lease-expired") == "lease-expired":
        return ["P logged a read of released blocks after a hold past the lease"] if ev.get("held_past_lease") \
            else None
    if kind == "appended-token" and m.kind == "divergence" and ev.get("appended"):
        return [f"divergence of a request whose D prompt had P's first token appended ({ev.get('detail')})"]
    if kind == "leak" and m.kind == "leak":
        return [f"blocks held: {ev.get('detail', '')[:120]}"]
    if kind == "wrong-metrics" and m.kind == "checks" and "cached-tokens" in ev.get("checks", []):
        return ["cached-tokens overcount"]
    return None


def match_known(m: Mechanism, known: list[dict[str, Any]], version: str) -> KnownMatch | None:
    """The first known issue (in ``known``'s order, in-range ones first) whose symptom explains
    mechanism ``m`` on vLLM ``version``; None: the finding is new."""
    hits = []
    for ki in known:
        why = _explains(ki.get("symptom") or {}, m)
        if why is not None:
            hits.append(KnownMatch(ki["id"], "; ".join(why), _in_range(ki.get("affects", ""), version)))
    hits.sort(key=lambda h: h.in_range is False)
    return hits[0] if hits else None
