"""An exploration of fake vLLM servers carrying one planted bug (tests/fake_vllm.py's faults), as
the planted-bug tests of the explorer's dimensions run it: small budgets, one replay, a few shrink
runs, vLLM's request models left out (no extra field drawn), so each takes seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import rig.explore.explorer as explorer_mod
from rig.config import load_config
from rig.explore.explorer import Explorer, ExploreSettings
from rig.report.explore_model import ExploreReport, FindingReport
from rig.run.runner import new_run_dir
from tests.helpers.fake_rig import fake_config, write_config

# the fake's P reaps no lease: no pd-abandon (its idle-after would wait for a reaper that is not there)
ROUTES = ["pd", "decode", "prefill"]


def explore_fake(base: Path, settings: dict[str, Any], *, prefill_env: dict[str, str] | None = None,
                 decodes: dict[str, dict[str, Any]] | None = None,
                 timeouts: dict[str, float] | None = None) -> tuple[ExploreReport, Path]:
    """Explore fake P and D (``prefill_env``, ``decodes`` as :func:`fake_config` takes them;
    ``timeouts`` over a 1.5 s stall window and a 4 s drain) with ExploreSettings ``settings`` over
    these defaults: 1 replay, 6 shrink runs, :data:`ROUTES`, no motif, no cancel. Returns the report
    and the run directory."""
    cfg = {**fake_config(base, decodes=decodes, prefill_env=prefill_env,
                         timeouts={"stall_window_s": 1.5, "drain_s": 4, **(timeouts or {})}),
           "nixl": {"kv_lease_duration": 2}}
    rig_cfg = load_config(write_config(base, cfg))
    run_dir = new_run_dir(rig_cfg, "explore")
    s = ExploreSettings(**{"replays": 1, "shrink_runs": 6, "routes": ROUTES, "motifs": [], "cancel_share": 0,
                           **settings})
    with pytest.MonkeyPatch.context() as mp:  # no vLLM in the fake's interpreter: no extra fields drawn
        mp.setattr(explorer_mod, "request_schemas", lambda python, cache: {})
        report = Explorer(rig_cfg, run_dir, s, quiet=True).run()
    return report, run_dir


def the_finding(report: ExploreReport) -> FindingReport:
    """The one finding of ``report`` (assertion error listing them otherwise)."""
    assert report.status == "done", report.error
    assert len(report.findings) == 1, [(f.mechanism.key, f.reason[:300]) for f in report.findings]
    return report.findings[0]
