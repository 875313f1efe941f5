"""`pdrig plan` prints what runs: each printed line's argv is the spawned process's argv, exactly,
and its environment assignments are in the spawned process's environment."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from rig import cli
from rig.cluster.processes import Cluster
from rig.config import load_config
from rig.plan.processes import build_plan
from rig.run.runner import new_run_dir, resolve_model
from tests.helpers.fake_rig import fake_config, write_config
from tests.helpers.survivors import kill_pids, wait_no_survivors


def printed_commands(out: str) -> dict[str, tuple[dict[str, str], list[str]]]:
    """``{name: (env, argv)}`` from `pdrig plan`'s output (comment line '# name (role) ...')."""
    found: dict[str, tuple[dict[str, str], list[str]]] = {}
    name = None
    for line in out.splitlines():
        if line.startswith("# ") and "(" in line and name is None:
            name = line[2:].split(" ", 1)[0]
        elif line and not line.startswith("#") and name:
            words = shlex.split(line)
            n_env = next(i for i, w in enumerate(words) if "=" not in w)
            found[name] = (dict(w.split("=", 1) for w in words[:n_env]), words[n_env:])
            name = None
    return found


def test_printed_line_is_the_spawned_argv(tmp_path: Path, capsys, restore_signals):
    data = fake_config(tmp_path)
    data["decode"][0]["cpus"] = [0]  # pinning and nice must not appear as a taskset/nice wrapper
    data["launch"]["nice"] = 5
    path = write_config(tmp_path, data)
    assert cli.main(["plan", "--config", str(path)]) == 0
    printed = printed_commands(capsys.readouterr().out)
    assert set(printed) == {"prefill", "decode"}

    cfg = load_config(path)
    run_dir = new_run_dir(cfg)
    plan = build_plan(cfg, run_dir, resolve_model(cfg), sys.executable)
    try:
        with Cluster(plan, startup_timeout_s=30, grace_s=3) as cluster:
            cluster.start(["prefill", "decode"])
            for name, run in cluster.procs.items():
                pid = run.popen.pid
                spawned = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                env = dict(kv.split(b"=", 1) for kv in environ if b"=" in kv)
                p_env, p_argv = printed[name]
                assert [a.decode() for a in spawned] == p_argv, name
                assert {k: env[k.encode()].decode() for k in p_env} == p_env, name
                assert p_argv[0] == sys.executable and "taskset" not in p_argv and "nice" not in p_argv
    finally:
        kill_pids(wait_no_survivors(str(tmp_path), within_s=10))
