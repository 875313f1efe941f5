"""Fixtures of every test: signal handlers given back, a per-test directory no fake server may
outlive, an idle host for fake-server stall verdicts.

The helpers test modules share are in tests/helpers/ and imported as a package
(``from tests.helpers.fake_rig import fake_config``); nothing here starts a real vLLM server.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers.fake_pd import fake_pd
from tests.helpers.survivors import assert_no_survivors, kill_pids, wait_no_survivors


@pytest.fixture()
def restore_signals():
    """cli.main installs SIGINT/SIGTERM/SIGHUP handlers; give pytest its own back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.fixture()
def fake_servers_dir(tmp_path) -> Path:
    """Per-test directory for fake-server configs and runs; after the test no process mentioning
    it may survive (leftovers are killed by PID, then the test fails)."""
    yield tmp_path
    assert_no_survivors(tmp_path, within_s=10)


@pytest.fixture(autouse=True)
def _idle_host_for_fakes(request, monkeypatch):
    """Fake-server and recorded tests judge stalls as on an idle host: the stall evidence reads the
    host's load average (rig.cluster.proctree.host_load), and on a host at load 50 a fake's spinning
    EngineCore may get too little CPU to count as stepping, which would make their verdicts depend
    on other people's work. Live tests (marker ``e2e``) keep the real load; a test that needs a load
    patches it itself (tests/observe/test_stall_evidence.py)."""
    if request.node.get_closest_marker("e2e") is None:
        from rig.cluster import proctree

        monkeypatch.setattr(proctree, "host_load", lambda: (0.0, 0.0, 0.0))
    yield


@pytest.fixture()
def base(tmp_path) -> Path:
    """Per-test directory; every fake server of the test has it in its argv, and none may outlive
    the test (leftovers are killed by PID, then the test fails)."""
    yield tmp_path
    left = wait_no_survivors(str(tmp_path), within_s=10)
    kill_pids(left)
    assert left == {}, f"fake servers survived the run: {left}"


@pytest.fixture(scope="module")
def healthy():
    """A healthy fake P/D pair (tests/helpers/fake_pd.py) shared by a module's tests: (P, D) Endpoints."""
    with fake_pd() as eps:
        yield eps
