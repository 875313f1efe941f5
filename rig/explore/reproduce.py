"""Reproduce, shrink, emit and triage every distinct finding, on the live deployment.

Each finding (rig.explore.findings.Finding, identified by its mechanism) is replayed ``replays``
times with fresh prompts (stable, or flaky with its rate), shrunk (rig.explore.shrink, each
candidate a live run on the same deployment compared by mechanism key), written as a suite YAML
under ``findings/`` and run once as written. Its known issue is matched on the mechanism
(rig.explore.known, the reason kept); the emitted YAML then carries that known issue and is run
with it once more (the verdict engine's own XFAIL confirms it). A finding no known issue explains
by mechanism is tried against the plausible ones through the verdict engine as before, and
otherwise is "new" with its mechanism's evidence.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rig.config import ConfigError, RigConfig
from rig.explore.emit import resource_scenarios, scenario_of, suite_yaml
from rig.explore.findings import Finding, finding_id, sets_of
from rig.explore.grammar import Action, Topology
from rig.explore.known import match_known
from rig.explore.oracles import plausible
from rig.explore.shrink import shrink
from rig.judge.verdict import ScenarioVerdict
from rig.workload.prompts import seed_of

# (key, verdict, scenario mapping) of one live run: rig.explore.explorer.Explorer.run_judged
RunJudged = Callable[[Action, Topology, str, int, "dict[str, Any] | None"], tuple[str | None, ScenarioVerdict, dict]]


class Reproducer:
    """Replays, shrinks and emits the findings of one exploration: ``run`` runs one action live
    and returns its mechanism key and verdict (see :data:`RunJudged`); ``history`` gets one line
    per run (``append``); ``log`` prints progress; ``version`` returns the vLLM version served,
    ``cfg`` the running config (its lease goes into the emitted reproduce line)."""

    def __init__(self, run: RunJudged, history: Any, log: Callable[[str], None], seed: int, run_dir: Path,
                 known: list[dict[str, Any]], version: Callable[[], str], cfg: Callable[[], RigConfig]):
        self.run, self.history, self.log, self.seed, self.run_dir = run, history, log, seed, run_dir
        self.known, self.version, self.cfg = known, version, cfg

    def test(self, action: Action, topo: Topology, phase: str, tag: str, runs: int) -> str | None:
        """Run ``action`` once with fresh prompts (no prefix-cache carry-over), record it under
        ``phase``; its mechanism key (None: it passed)."""
        name = f"{phase[0]}{runs:05d}"
        key, v, sc = self.run(action, topo, name, seed_of(f"{self.seed}/{phase}/{tag}/{runs}"), None)
        self.history.append({"phase": phase, "tag": tag, "scenario": sc, "verdict": v.verdict, "reason": v.reason,
                             "signature": key})
        return key

    def process(self, i: int, f: Finding, replays: int, shrink_runs: int, runs: Callable[[], int]) -> None:
        """Replay, shrink and emit finding ``i``; ``runs`` gives the live-run counter (names)."""
        self.log(f"finding {i}: replaying {replays}x: {f.mechanism.key}")
        f.replays = [self.test(f.action, f.topology, "replay", f"{i}/{k}", runs()) for k in range(replays)]
        if replays and not any(s == f.mechanism.key for s in f.replays):
            self.emit(i, f, f.action)
            return

        def same(cand: Action) -> bool:
            try:
                return self.test(cand, f.topology, "shrink", str(i), runs()) == f.mechanism.key
            except ConfigError:  # a candidate the scenario language refuses (e.g. a reused prompt's length)
                return False

        t = time.monotonic()
        result = shrink(f.action, same, f.topology, shrink_runs)
        f.minimal, f.shrink_runs, f.shrink_s = result.action, result.runs, time.monotonic() - t
        self.log(f"finding {i}: shrunk to {result.action.requests()} request(s) in {result.runs} runs: "
                 f"{result.action.describe()}")
        self.emit(i, f, result.action)

    def emit(self, i: int, f: Finding, action: Action) -> None:
        """Write the finding's suite YAML; run it once without a known issue (``emitted_verdict``:
        does the minimal action still fail?); match the known issues (each confirmed by a run with it,
        ``known_why``)."""
        name = finding_id(self.seed, i)
        seed = seed_of(f"{self.seed}/emit/{i}")
        key, v = self._emitted(action, f.topology, name, seed, None)
        f.emitted_verdict = v.verdict + ("" if key == f.mechanism.key else f" (mechanism {key})")
        known = self._known(f, action, name, seed)
        sc = {**scenario_of(action, f.topology, name, known, f"explore seed {self.seed}: {f.mechanism.key}"),
              "seed": seed}
        primers = [{**p, "seed": seed_of(f"{seed}/{p['name']}")} for p in resource_scenarios(action, name)]
        header = (f"pdrig explore finding {i} (seed {self.seed}, action {f.action.index})\n"
                  f"mechanism: {f.mechanism.key}\nsignature: {f.signature}\n"
                  f"stability: {f.stability}; known issue: {f.known_issue}"
                  + (f" ({f.known_why})" if f.known_why else "") + "\n"
                  f"without a known issue it gave: {f.emitted_verdict}\n"
                  + (f"topology {f.topology.variant} drawn from vLLM's knobs\n" if f.topology.variant else "")
                  + f"reproduce: pdrig e2e --config <this profile> --set suite=<this file>"
                  f"{sets_of(self.cfg(), f.topology)}")
        path = self.run_dir / "findings" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(suite_yaml([*primers, sc], header))
        f.yaml_path = str(path)

    def _known(self, f: Finding, action: Action, name: str, seed: int) -> dict[str, Any] | None:
        """The known issue that explains ``f``: by mechanism (confirmed by a run with it), else
        the first plausible one the verdict engine turns into XFAIL; None: new."""
        hit = match_known(f.mechanism, self.known, self.version())
        if hit is not None:
            ki = next(k for k in self.known if k["id"] == hit.id)
            try:
                _, kv = self._emitted(action, f.topology, name, seed, ki)
                confirm = f"; as written with it: {kv.verdict}"
            except ConfigError as e:  # its rules do not fit this scenario's kind
                confirm = f"; its scenario rules do not fit the emitted kind ({str(e)[:120]})"
            f.known_issue, f.known_why = hit.label(), f"matched by mechanism: {hit.why}{confirm}"
            return ki
        for ki in self.known:
            if not plausible(ki.get("symptom", {}).get("kind", ""), f.signature):
                continue
            try:
                _, kv = self._emitted(action, f.topology, name, seed, ki)
            except ConfigError:
                continue
            if kv.verdict == "XFAIL" or "matches known issue" in kv.reason:
                f.known_issue = ki["id"] + ("" if kv.verdict == "XFAIL" else " (outside affects)")
                f.known_why = f"the verdict engine's symptom matcher gave {kv.verdict} (not by mechanism)"
                return ki
        f.known_why = f"no known issue explains {f.mechanism.key}"
        return None

    def _emitted(self, action: Action, topo: Topology, name: str, seed: int,
                 ki: dict[str, Any] | None) -> tuple[str | None, ScenarioVerdict]:
        key, v, sc = self.run(action, topo, name, seed, ki)
        self.history.append({"phase": "emit", "scenario": sc, "verdict": v.verdict, "reason": v.reason,
                             "signature": key})
        return key, v
