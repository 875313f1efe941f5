"""The zygote layout's fork server (rig/cluster/zygote.py) without vLLM: a zygote that preloads a
small module, children that are scripts, then fake vLLM servers through the cluster. What must
hold for a forked child as for a spawned one: its own process group (killpg, SIGSTOP), its pid,
its exit code (from the zygote's report), its log, its own environment, and nothing left alive
after teardown, also when the rig is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rig.cluster.backends.local import RUN_MARKER, processes_of_run
from rig.cluster.processes import Cluster
from rig.cluster.zygote import Zygote, ZygoteError
from rig.config import load_config
from rig.plan.processes import build_plan
from rig.run.runner import resolve_model
from tests.helpers.fake_rig import ROOT, fake_config, write_config
from tests.helpers.survivors import kill_pids, wait_no_survivors

CHILD = """
import os, sys, time
print("child", os.getpid(), os.getpgid(0), os.getppid(), os.environ.get("ZYG_LATER"),
      "zyg_mod" in sys.modules, sys.argv[1:], flush=True)
if sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]))
time.sleep(60)
"""
# Reads one key by name at import and walks the whole environment (as tqdm and platform do).
MODULE = "import os\nAT_IMPORT = os.environ.get('ZYG_AT_IMPORT')\nSNAPSHOT = dict(os.environ.items())\n"


@pytest.fixture
def box(tmp_path):
    (tmp_path / "zyg_mod.py").write_text(MODULE)
    (tmp_path / "child.py").write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "ZYG_AT_IMPORT": "a", "ZYG_LATER": "x",
           RUN_MARKER: str(tmp_path.resolve())}
    zygote = Zygote(sys.executable, ["zyg_mod"], env, tmp_path / "zygote.log", label=str(tmp_path))
    yield tmp_path, zygote, env
    zygote.close(grace_s=3)
    left = wait_no_survivors(str(tmp_path), within_s=10)
    kill_pids(left)
    assert left == {}, f"survived the zygote's close: {left}"
    assert processes_of_run(tmp_path) == []


def _line(log: Path, within_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines() if log.exists() else []:
            if line.startswith("child "):
                return line.split()
        time.sleep(0.05)
    raise AssertionError(f"no child line in {log}: {log.read_text() if log.exists() else '(no log)'}")


def _state(pid: int, want: str, within_s: float = 3.0) -> str:
    deadline = time.monotonic() + within_s
    while True:
        got = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def test_zygote_records_env_read_by_name_at_import_not_walks(box):
    _, zygote, _ = box
    zygote.wait_ready(30)
    assert zygote.threads == 1  # no thread of its own before any fork
    assert "ZYG_AT_IMPORT" in zygote.env_read
    assert "ZYG_LATER" not in zygote.env_read  # only seen by the module's walk over the environment
    assert zygote.refused_keys({**zygote.env, "ZYG_AT_IMPORT": "b"}) == ["ZYG_AT_IMPORT"]
    assert zygote.refused_keys({**zygote.env, "OMP_NUM_THREADS": "1"}) == ["OMP_NUM_THREADS"]  # read at start
    assert zygote.refused_keys({**zygote.env, "ZYG_LATER": "y"}) == []


def test_forked_child_has_its_group_env_log_and_exit_code(box):
    tmp, zygote, env = box
    log = tmp / "one.log"
    child = zygote.spawn([sys.executable, str(tmp / "child.py"), "exit", "7"], {**env, "ZYG_LATER": "mine"},
                         str(log), first_line="pdrig: starting one (pid {pid})\n")
    assert child.wait(10) == 7 and child.poll() == 7
    text = log.read_text()
    assert text.startswith(f"pdrig: starting one (pid {child.pid})\n")  # the marker before its output
    _, pid, pgid, ppid, later, preloaded, *_ = _line(log)
    assert int(pid) == int(pgid) == child.pid  # a session of its own: the rig's killpg reaches it
    assert int(ppid) == zygote.pid  # forked by the zygote, not started by the rig
    assert later == "mine" and preloaded == "True"  # its own environment; the module came with the fork


def test_forked_child_is_held_and_killed_by_its_group(box):
    tmp, zygote, env = box
    log = tmp / "two.log"
    child = zygote.spawn([sys.executable, str(tmp / "child.py"), "sleep"], env, str(log))
    _line(log)
    os.killpg(child.pid, signal.SIGSTOP)
    assert _state(child.pid, "T") == "T"
    os.killpg(child.pid, signal.SIGCONT)
    assert child.poll() is None
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(10) == -signal.SIGKILL


def test_refused_environment_and_bad_argv_leave_the_zygote_serving(box):
    tmp, zygote, env = box
    with pytest.raises(ZygoteError, match="ZYG_AT_IMPORT"):
        zygote.spawn([sys.executable, str(tmp / "child.py"), "exit", "0"], {**env, "ZYG_AT_IMPORT": "b"},
                     str(tmp / "x.log"))
    with pytest.raises(ZygoteError, match="neither"):
        zygote.spawn([sys.executable], env, str(tmp / "x.log"))
    ok = zygote.spawn([sys.executable, str(tmp / "child.py"), "exit", "3"], env, str(tmp / "x.log"))
    assert ok.wait(10) == 3


def test_close_stops_a_live_child_and_reports_it(box):
    tmp, zygote, env = box
    log = tmp / "three.log"
    child = zygote.spawn([sys.executable, str(tmp / "child.py"), "sleep"], env, str(log))
    _line(log)
    assert zygote.close(grace_s=3) == 0
    assert child.poll() == -signal.SIGTERM


RIG = """
import json, os, sys
sys.path.insert(0, {root!r})
from rig.cluster.zygote import Zygote
env = {{**os.environ, "PYTHONPATH": {path!r}}}
z = Zygote(sys.executable, [], env, {log!r}, label={tmp!r})
c = z.spawn([sys.executable, {child!r}, "sleep"], env, {clog!r})
print(json.dumps([z.pid, c.pid]), flush=True)
sys.stdin.read()
"""


def test_a_sigkilled_rig_leaves_neither_zygote_nor_child(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    script = RIG.format(root=str(ROOT), path=f"{tmp_path}{os.pathsep}{ROOT}", log=str(tmp_path / "z.log"),
                        tmp=str(tmp_path), child=str(tmp_path / "child.py"), clog=str(tmp_path / "c.log"))
    rig = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        zpid, cpid = json.loads(rig.stdout.readline())
        _line(tmp_path / "c.log")
        rig.kill()  # no teardown code runs: the zygote sees EOF on its request pipe
        rig.wait(10)
    finally:
        left = wait_no_survivors(str(tmp_path), within_s=15)
        kill_pids(left)
    assert left == {}, f"zygote {zpid} / child {cpid} outlived a SIGKILLed rig: {left}"


def test_cluster_with_layout_zygote_runs_fake_servers_as_forked_groups(tmp_path):
    cfg = load_config(write_config(tmp_path, fake_config(tmp_path)), ["launch.layout=zygote"])
    plan = build_plan(cfg, tmp_path / "run", resolve_model(cfg), sys.executable)
    assert plan.layout == "zygote"
    try:
        with Cluster(plan, startup_timeout_s=30, grace_s=3) as cluster:
            cluster.start(["prefill", "decode"])
            zygote = cluster.backend._zygote
            for name in ("prefill", "decode"):
                run = cluster.procs[name]
                assert os.getpgid(run.popen.pid) == run.popen.pid
                assert int(Path(f"/proc/{run.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == zygote.pid
                assert f"starting {name} (pid {run.popen.pid})" in Path(run.spec.log_path).read_text()
            run = cluster.procs["decode"]
            assert cluster.backend.signal(run, signal.SIGKILL) == run.popen.pid
            assert run.popen.wait(10) == -signal.SIGKILL and cluster.backend.exit_code(run) == -signal.SIGKILL
        assert processes_of_run(tmp_path / "run") == []
    finally:
        left = wait_no_survivors(str(tmp_path), within_s=10)
        kill_pids(left)
    assert left == {}, f"fake servers or the zygote survived: {left}"
