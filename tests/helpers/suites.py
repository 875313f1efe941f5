"""Whole suites run by the suite runner against fake vLLM servers, and the module fixtures of a test
file that judges one such run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fake_rig import fake_config, write_config
from tests.helpers.survivors import assert_no_survivors, kill_pids, wait_no_survivors


def run_on_fakes(tmp_path: Path, scenarios: list[dict], decodes: dict[str, dict[str, Any]] | None = None,
                 overrides: list[str] | None = None, prefill_env: dict[str, str] | None = None) -> tuple[Any, Path]:
    """Run scenario dicts ``scenarios`` on fake P and D (``decodes`` and ``prefill_env`` as in
    :func:`fake_config`, ``overrides`` as ``--set``); returns (result, run dir) and asserts nothing
    was left running."""
    from rig.config import load_config
    from rig.run.runner import SuiteRunner, new_run_dir

    cfg = load_config(write_config(tmp_path, fake_config(tmp_path, decodes=decodes, scenarios=scenarios,
                                                         prefill_env=prefill_env)), overrides or [])
    run_dir = new_run_dir(cfg)
    try:
        result = SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True).run()
    finally:
        left = wait_no_survivors(str(tmp_path), within_s=10)
        kill_pids(left)
    assert left == {}, f"fake servers survived: {left}"
    return result, run_dir


def run_fake_suite(tmp: Path, overrides: list[str] | tuple[str, ...] = (), **cfg_kw: Any):
    """Run every scenario of a fake-server config written under ``tmp`` (``cfg_kw`` go to
    :func:`fake_config`, ``overrides`` are ``--set`` strings) with the suite runner, quietly.
    Returns ``(RunResult, run_dir)``."""
    from rig.config import load_config
    from rig.run.runner import SuiteRunner, new_run_dir

    tmp.mkdir(parents=True, exist_ok=True)
    cfg = load_config(write_config(tmp, fake_config(tmp, **cfg_kw)), list(overrides))
    run_dir = new_run_dir(cfg)
    return SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True).run(), run_dir


def fake_suite_fixtures(dirname: str, *, suite_of=None, overrides: list[str] | tuple[str, ...] = (),
                        **cfg_kw: Any):
    """The module fixtures of a test file that judges one fake-server suite run:

    - ``base_dir`` (module): a fresh directory ``dirname``-N holding every config, run and model
      cache of the module, so every fake server the module starts has it in its argv;
    - ``no_survivors`` (autouse): after each test no process mentioning ``base_dir`` may be alive
      (leftovers are killed by PID, then the test fails);
    - ``suite`` (module): :func:`run_fake_suite` of ``cfg_kw`` and ``overrides`` under
      ``base_dir/suite``, run once for the module; ``suite_of(result, run_dir)`` reshapes it.

    Use: ``base_dir, no_survivors, suite = fake_suite_fixtures("fake-x", decodes=..., scenarios=...)``.
    """
    @pytest.fixture(scope="module", name="base_dir")
    def base_dir_(tmp_path_factory) -> Path:
        return tmp_path_factory.mktemp(dirname)

    @pytest.fixture(autouse=True, name="no_survivors")
    def no_survivors_(base_dir):
        yield
        assert_no_survivors(base_dir, within_s=10)

    @pytest.fixture(scope="module", name="suite")
    def suite_(base_dir):
        result, run_dir = run_fake_suite(base_dir / "suite", overrides, **cfg_kw)
        return suite_of(result, run_dir) if suite_of else (result, run_dir)

    return base_dir_, no_survivors_, suite_

