"""Watching instances the rig did not start (rig.observe.endpoint_watch): fatal and KV-integrity
lines since the wave started, deaths told from owner stops, logs that cannot be read. In-process:
log files under tmp_path, /health an httpx.MockTransport, pids this test's own."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys

import httpx

from rig.cluster.logs import stop_marker
from rig.observe import endpoint_watch as ew
from rig.observe.endpoint_watch import NO_LOG_PATH, EndpointWatch, pid_alive
from rig.observe.observations import ScenarioObservation
from rig.transport.endpoint import Endpoint

FATAL = "(EngineCore pid=1) ERROR 11-30 20:00:07 [core.py:1] EngineCore encountered a fatal error"
KV_BAD = "WARNING Potentially invalid KV blocks for request r1"


def _exited_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_pid_alive_tells_a_live_process_from_an_exited_one_and_a_zombie():
    assert pid_alive(os.getpid())
    assert not pid_alive(_exited_pid())
    z = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, z.pid, os.WEXITED | os.WNOWAIT)  # until it has exited, left unreaped: a zombie
        assert not pid_alive(z.pid)
    finally:
        z.wait()


def test_pid_alive_a_process_of_another_user_without_proc_is_alive(monkeypatch):
    def denied(pid, sig):
        raise PermissionError

    monkeypatch.setattr(ew.os, "kill", denied)
    assert pid_alive(1)  # kill says it exists; its stat says it is not a zombie
    monkeypatch.setattr(ew, "Path", lambda p: _Unreadable())
    assert pid_alive(424242)


class _Unreadable:
    def read_text(self):
        raise OSError("no /proc")


def _health(status: dict[str, int], asked: list[str] | None = None) -> httpx.AsyncClient:
    def handle(req: httpx.Request) -> httpx.Response:
        if asked is not None:
            asked.append(f"{req.url.host}{req.url.path}")
        return httpx.Response(status.get(req.url.host, 200))
    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def _observe(w: EndpointWatch, status: dict[str, int] | None = None, asked: list[str] | None = None):
    obs = ScenarioObservation(scenario="w", decode="decode", prefill="prefill")

    async def run() -> None:
        async with _health(status or {}, asked) as http:
            await w.observe(http, obs)

    asyncio.run(run())
    return obs


def test_bare_urls_are_not_watched_and_observe_fills_nothing():
    w = EndpointWatch([Endpoint("decode", "http://d")])
    assert not w.watched and w.logs == {}
    w.start()
    obs = _observe(w, {"d": 500})
    assert (obs.fatal_lines, obs.unscanned_logs, obs.dead, obs.death_lines, obs.stopped) == ({}, {}, {}, {}, {})


def test_only_lines_written_since_start_count(tmp_path):
    log = tmp_path / "decode.log"
    log.write_text(f"{FATAL}\n{KV_BAD}\n")  # before the wave: not this wave's
    w = EndpointWatch([Endpoint("decode", "http://d", log=str(log), pid=os.getpid())])
    assert w.watched and set(w.logs) == {"decode"}
    w.start()
    assert w.marks == {"decode": log.stat().st_size}
    obs = _observe(w)
    assert obs.fatal_lines == {"decode": []} and obs.kv_integrity_lines == {"decode": []}
    with log.open("a") as f:
        f.write(f"INFO fine\n{FATAL}\n{KV_BAD}\n")
    obs = _observe(w)
    assert obs.fatal_lines == {"decode": [FATAL]}
    assert obs.kv_integrity_lines == {"decode": [KV_BAD]}
    assert obs.dead == {} and obs.unscanned_logs == {}


def test_an_endpoint_without_a_log_path_is_unscanned_and_one_unreadable_says_so(tmp_path):
    missing = tmp_path / "gone.log"
    w = EndpointWatch([Endpoint("prefill", "http://p", pid=os.getpid()),
                       Endpoint("decode", "http://d", log=str(missing), pid=os.getpid())])
    w.start()
    obs = _observe(w)
    assert obs.unscanned_logs == {"prefill": NO_LOG_PATH, "decode": f"cannot read file {missing}"}
    assert obs.fatal_lines == {} and obs.dead == {}


def test_a_dead_pid_is_a_death_named_by_its_first_fatal_line(tmp_path):
    log = tmp_path / "decode.log"
    log.write_text("")
    w = EndpointWatch([Endpoint("decode", "http://d", log=str(log), pid=_exited_pid())])
    w.start()
    log.write_text(f"INFO up\n{FATAL}\nINFO after\n")
    obs = _observe(w)
    assert obs.dead == {"decode": -1}
    assert obs.death_lines == {"decode": FATAL}
    assert obs.stopped == {}


def test_a_death_without_a_fatal_line_quotes_the_last_line_or_says_the_log_is_empty(tmp_path):
    log = tmp_path / "decode.log"
    log.write_text("")
    w = EndpointWatch([Endpoint("decode", "http://d", log=str(log), pid=_exited_pid())])
    w.start()
    assert _observe(w).death_lines == {"decode": "no fatal line"}
    log.write_text("INFO serving\n  INFO last words  \n\n")
    assert _observe(w).death_lines == {"decode": "no fatal line; last log line: INFO last words"}


def test_a_dead_instance_without_a_readable_log_carries_the_unscanned_reason(tmp_path):
    w = EndpointWatch([Endpoint("decode", "http://d", pid=_exited_pid())])
    w.start()
    obs = _observe(w)
    assert obs.dead == {"decode": -1} and obs.death_lines == {"decode": NO_LOG_PATH}


def test_an_instance_its_owner_stopped_is_stopped_not_dead(tmp_path):
    log = tmp_path / "decode.log"
    log.write_text("")
    w = EndpointWatch([Endpoint("decode", "http://d", log=str(log), pid=_exited_pid())])
    w.start()
    line = stop_marker("decode")
    log.write_text(f"INFO up\n{line}")
    obs = _observe(w)
    assert obs.stopped == {"decode": line.strip()}
    assert obs.dead == {} and obs.death_lines == {}
    # another instance's stop line does not excuse this one
    log.write_text(f"INFO up\n{stop_marker('prefill')}")
    obs = _observe(w)
    assert obs.dead == {"decode": -1} and obs.stopped == {}


def test_without_a_pid_health_decides_and_a_live_pid_skips_it(tmp_path):
    log = tmp_path / "p.log"
    log.write_text("")
    eps = [Endpoint("prefill", "http://p", log=str(log)), Endpoint("decode", "http://d", log=str(log)),
           Endpoint("live", "http://l", log=str(log), pid=os.getpid())]
    w = EndpointWatch(eps)
    w.start()
    asked: list[str] = []
    obs = _observe(w, {"p": 200, "d": 500, "l": 500}, asked)
    assert obs.dead == {"decode": -1}
    assert obs.death_lines == {"decode": "no fatal line"}
    assert sorted(asked) == ["d/health", "p/health"]  # a pid is asked of /proc, not of /health


def test_observe_before_start_reads_no_text(tmp_path):
    log = tmp_path / "decode.log"
    log.write_text(f"{FATAL}\n")
    w = EndpointWatch([Endpoint("decode", "http://d", log=str(log), pid=_exited_pid())])
    obs = _observe(w)  # no mark: nothing read
    assert obs.unscanned_logs == {"decode": f"cannot read file {log}"}
    assert obs.death_lines == {"decode": f"cannot read file {log}"}


def test_pid_alive_reads_the_state_after_the_last_parenthesis_of_the_name(tmp_path):
    """A process whose name has ") Z " in it (the name is the executable's) is alive while it runs."""
    exe = tmp_path / "x) Z y"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", exe)
    p = subprocess.Popen([str(exe), "30"])
    try:
        assert pid_alive(p.pid)
    finally:
        p.kill()
        p.wait()


def test_an_owner_stop_does_not_end_the_look_at_the_next_instance(tmp_path):
    log = tmp_path / "p.log"
    log.write_text("")
    eps = [Endpoint("prefill", "http://p", log=str(log), pid=_exited_pid()),
           Endpoint("decode", "http://d", log=str(tmp_path / "d.log"), pid=_exited_pid())]
    (tmp_path / "d.log").write_text("")
    w = EndpointWatch(eps)
    w.start()
    log.write_text(stop_marker("prefill"))
    (tmp_path / "d.log").write_text(FATAL + "\n")
    obs = _observe(w)
    assert set(obs.stopped) == {"prefill"} and obs.dead == {"decode": -1}
    assert obs.death_lines == {"decode": FATAL} and obs.fatal_lines["decode"] == [FATAL]
