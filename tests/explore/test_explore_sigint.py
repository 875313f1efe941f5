"""Ctrl-C in a running ``pdrig explore``: the history and the report are kept (status
interrupted), the exit code is 130 and no server it started outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from rig.report.explore_model import ExploreReport
from tests.helpers.fake_rig import ROOT, fake_config, write_config
from tests.helpers.survivors import kill_pids, wait_no_survivors


def test_ctrl_c_keeps_history_and_report_and_stops_every_server(tmp_path):
    path = write_config(tmp_path, fake_config(tmp_path))
    out = open(tmp_path / "rig.out", "wb")  # noqa: SIM115 - the rig writes to it while the test signals it
    rig = subprocess.Popen([sys.executable, "-c", "import sys; from rig.cli import main; sys.exit(main())",
                            "explore", "--config", str(path), "--actions", "100000", "--routes", "pd,decode,prefill"],
                           cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    out.close()
    try:
        deadline = time.monotonic() + 300
        hist = None
        while time.monotonic() < deadline and rig.poll() is None:
            found = list((tmp_path / "runs").glob("*/history.jsonl")) if (tmp_path / "runs").exists() else []
            if found and len(found[0].read_text().splitlines()) >= 3:
                hist = found[0]
                break
            time.sleep(0.5)
        assert hist is not None, (tmp_path / "rig.out").read_text(errors="replace")[-3000:]
        os.killpg(rig.pid, signal.SIGINT)
        # Ctrl-C ends the action in flight, writes the report and stops every server: seconds when the
        # host is quiet, longer on a loaded one (a CI run beside other work timed out at 60 s).
        rc = rig.wait(timeout=240)
    finally:
        if rig.poll() is None:
            rig.kill()
            rig.wait()
    assert rc == 130, (tmp_path / "rig.out").read_text(errors="replace")[-3000:]
    run_dir = hist.parent
    report = ExploreReport.model_validate_json((run_dir / "explore.json").read_text())
    assert report.status == "interrupted" and report.actions >= 3
    assert len([x for x in hist.read_text().splitlines() if '"phase": "explore"' in x]) >= 3
    assert "status interrupted" in (run_dir / "explore.md").read_text()
    left = wait_no_survivors(str(tmp_path), within_s=10)
    kill_pids(left)
    assert left == {}, f"servers outlived the explorer: {left}"
