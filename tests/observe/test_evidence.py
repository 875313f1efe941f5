"""Evidence gathering and the drain check without servers (rig/observe/evidence.py,
rig/observe/drain.py): a log that cannot be read is unscanned (never clean), an instance that
stops answering is given time to die, a missing metric is named, a drain without a sample is not
idle. Fakes: a duck-typed cluster with in-memory log sources and httpx.MockTransport. Written
against `make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest

from rig.cluster.logs import FileLog, stop_marker
from rig.observe import evidence
from rig.observe import metrics as m
from rig.observe.drain import check_drains
from rig.observe.evidence import (
    NO_LOG_SOURCE,
    UNKNOWN_VERSION,
    LogScanner,
    MetricPresence,
    healthy,
    metric_presence,
    read_versions,
    settle_deaths,
)
from rig.observe.observations import ScenarioObservation
from rig.transport.endpoint import Endpoint
from tests.helpers.stall_metrics import IDLE, LIVELOCK, TEMPLATE

FATAL = "ERROR 12-01 [core.py:1] EngineCore encountered a fatal error."
INVALID = "ERROR [pull_worker.py:667] Potentially invalid KV blocks for unrecognized request cmpl-p-0 were retrieved"


class Log:
    """A log source: text grows with ``write``; ``readable`` False makes ``since`` return None."""

    def __init__(self, text: str = "", readable: bool = True, markable: bool = True):
        self.text, self.readable, self.markable = text, readable, markable

    def write(self, s: str) -> None:
        self.text += s

    def mark(self) -> int | None:
        return len(self.text) if self.markable else None

    def since(self, mark: int | None) -> str | None:
        return self.text[mark or 0:] if self.readable else None

    def describe(self) -> str:
        return "mem.log"


class Cluster:
    def __init__(self, logs: dict[str, Log | None], dead: dict[str, int] | None = None, frozen=()):
        self.logs, self.procs, self.frozen = logs, dict.fromkeys(logs), set(frozen)
        self._dead = dict(dead or {})

    def log_source(self, n):
        return self.logs.get(n)

    def dead(self):
        return dict(self._dead)

    def url(self, n):
        return f"http://{n}"


def obs() -> ScenarioObservation:
    return ScenarioObservation(scenario="s", decode="decode", prefill="prefill")


# ------------------------------------------------------------------------- LogScanner

def test_scan_reads_only_what_was_written_since_the_last_scan():
    p, d = Log("warm-up " + FATAL + "\n"), Log()
    c = Cluster({"prefill": p, "decode": d})
    sc = LogScanner()
    sc.phase_started(c)
    o = obs()
    sc.scan(c, o)
    assert o.fatal_lines == {"prefill": [], "decode": []} and o.unscanned_logs == {}
    p.write(INVALID + "\n")
    d.write(FATAL + "\n")
    o = obs()
    sc.scan(c, o)
    assert o.fatal_lines["prefill"] == [] and len(o.fatal_lines["decode"]) == 1
    assert o.kv_integrity_lines["prefill"] == [INVALID]
    o = obs()
    sc.scan(c, o)  # nothing new: the lines are not counted twice
    assert o.fatal_lines == {"prefill": [], "decode": []}


def test_a_log_that_cannot_be_read_is_unscanned_never_clean():
    p, d = Log(), Log(readable=False)
    c = Cluster({"prefill": p, "decode": d, "router": None})
    sc = LogScanner()
    sc.phase_started(c)
    o = obs()
    sc.scan(c, o)
    assert "decode" not in o.fatal_lines and o.unscanned_logs["decode"] == "cannot read mem.log"
    assert o.unscanned_logs["router"] == NO_LOG_SOURCE and "router" not in o.fatal_lines
    assert o.fatal_lines == {"prefill": []}


def test_a_log_not_readable_at_phase_start_is_unscanned_then_read_from_then_on():
    d = Log(FATAL + "\n", markable=False)
    c = Cluster({"decode": d})
    sc = LogScanner()
    sc.phase_started(c)  # no mark: unreadable when the phase started
    d.markable = True
    o = obs()
    sc.scan(c, o)
    assert o.unscanned_logs["decode"] == "mem.log was not readable when the phase started"
    d.write(FATAL + "\n")
    o = obs()
    sc.scan(c, o)
    assert o.unscanned_logs == {} and len(o.fatal_lines["decode"]) == 1


def test_a_frozen_instance_is_neither_scanned_nor_unscanned_and_forget_restarts_the_mark():
    d = Log(FATAL + "\n")
    c = Cluster({"decode": d}, frozen=["decode"])
    sc = LogScanner()
    sc.phase_started(c)
    o = obs()
    sc.scan(c, o)
    assert o.fatal_lines == {} and o.unscanned_logs == {}
    c.frozen = set()
    sc.phase_started(c)  # continued: marked now, the earlier line is not this phase's
    o = obs()
    sc.scan(c, o)
    assert o.fatal_lines == {"decode": []}
    d.write(FATAL + "\n")
    sc.forget(["decode"])
    sc.phase_started(c)
    o = obs()
    sc.scan(c, o)
    assert o.fatal_lines == {"decode": []}


def test_the_death_line_is_the_first_fatal_line_since_the_start():
    d = Log("old " + FATAL + "\n")
    c = Cluster({"decode": d})
    sc = LogScanner()
    sc.starting(c, ["decode"])
    assert sc.death_line(c, "decode") == "no fatal line; the log is empty"
    d.write("INFO serving\nINFO still\n")
    assert sc.death_line(c, "decode") == "no fatal line; last log line: INFO still"
    d.write(FATAL + "\nINFO after\n")
    assert "EngineCore encountered a fatal error" in sc.death_line(c, "decode")
    d.readable = False
    assert sc.death_line(c, "decode") == "cannot read mem.log"
    assert sc.death_line(Cluster({"decode": None}), "decode") == NO_LOG_SOURCE
    fresh = LogScanner()  # never told of a start: the whole log
    d.readable = True
    assert "fatal error" in fresh.death_line(c, "decode")


# ------------------------------------------------------------------------- HTTP facts

def client(handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def run(coro):
    return asyncio.run(coro)


def test_healthy_is_200_only():
    async def go(status):
        async with client(lambda r: httpx.Response(status)) as h:
            return await healthy(h, "http://d")

    async def refused():
        def boom(r):
            raise httpx.ConnectError("refused")
        async with client(boom) as h:
            return await healthy(h, "http://d")
    assert run(go(200)) is True and run(go(500)) is False and run(refused()) is False


def test_settle_deaths_waits_for_a_silent_instance_to_exit():
    c = Cluster({"decode": Log(), "prefill": Log()})
    calls = {"n": 0}

    def handler(r):
        calls["n"] += 1
        if calls["n"] == 3:
            c._dead["decode"] = 0  # exits while we wait (vLLM's shutdown exits 0)
        return httpx.Response(200 if r.url.host == "prefill" else 500)

    async def go():
        async with client(handler) as h:
            return await settle_deaths(h, c, ["decode", "prefill"], 30.0)
    assert run(go()) == {"decode": 0}


def test_settle_deaths_returns_at_once_when_all_answer_and_gives_up_at_the_deadline():
    c = Cluster({"decode": Log()})

    async def go(status, within):
        async with client(lambda r: httpx.Response(status)) as h:
            return await settle_deaths(h, c, ["decode"], within)
    assert run(go(200, 30.0)) == {}
    assert run(go(500, 0.0)) == {}  # silent but alive at the deadline: not dead


def test_read_versions_unknown_when_not_answered():
    def handler(r):
        host = r.url.host
        if host == "a":
            return httpx.Response(200, json={"version": "0.32.0"})
        if host == "b":
            return httpx.Response(404)
        if host == "c":
            return httpx.Response(200, text="not json")
        if host == "d":
            return httpx.Response(200, json={"other": 1})
        raise httpx.ConnectError("refused")

    async def go():
        async with client(handler) as h:
            return await read_versions(h, Cluster({}), ["a", "b", "c", "d", "e"])
    assert run(go()) == {"a": "0.32.0", "b": UNKNOWN_VERSION, "c": UNKNOWN_VERSION, "d": UNKNOWN_VERSION,
                         "e": UNKNOWN_VERSION}


def test_metric_presence_names_what_is_missing_and_what_was_unreachable():
    text = TEMPLATE.format(**LIVELOCK)

    def handler(r):
        if r.url.host == "gone":
            raise httpx.ConnectError("refused")
        return httpx.Response(200, text=text)

    async def go():
        async with client(handler) as h:
            return await metric_presence(h, Cluster({}), {"decode": "decode", "gone": "prefill"}, {"decode": True})
    pres = run(go())
    assert pres.unreachable == {"gone": "ConnectError: refused"}
    want = m.missing_metrics(m.parse_metrics(text, "decode", t=0), m.required_metrics("decode", True))
    assert pres.required["decode"] == want and want  # the template lacks some required metrics
    assert pres.error({"decode": "0.32.0"}).startswith(f"metrics the checks read are missing: decode (vLLM 0.32.0) "
                                                       f"lacks {want[0]}")


def test_metric_presence_lists_and_error():
    p = MetricPresence(required={"d": ["a"], "p": []}, diagnostic={"d": ["b"], "p": [], "x": ["c"]})
    assert p.all_missing() == {"d": ["a", "b"], "x": ["c"]}
    assert p.error({}).startswith("metrics the checks read are missing: d (vLLM unknown) lacks a")
    assert MetricPresence(required={"p": []}).error({}) == ""


@pytest.mark.parametrize("text,idle", [(TEMPLATE.format(**IDLE), True), (TEMPLATE.format(**LIVELOCK), False)])
def test_check_drains_waits_on_every_endpoint(text, idle):
    async def go():
        async with client(lambda r: httpx.Response(200, text=text)) as h:
            return await check_drains(h, [Endpoint("decode", "http://d"), Endpoint("prefill", "http://p")],
                                      {"decode": 0.0}, drain_s=0.3, interval_s=0.05)
    out = run(go())
    assert [d.instance for d in out] == ["decode", "prefill"] and all(d.idle is idle for d in out)


def test_a_frozen_or_sourceless_instance_does_not_stop_the_scan_of_the_next():
    d = Log()
    c = Cluster({"held": Log(), "router": None, "decode": d}, frozen=["held"])
    sc = LogScanner()
    sc.phase_started(c)
    d.write(FATAL + "\n")
    o = obs()
    sc.scan(c, o)
    assert len(o.fatal_lines["decode"]) == 1 and o.unscanned_logs == {"router": NO_LOG_SOURCE}
    assert "held" not in o.fatal_lines


def test_an_unreachable_instance_does_not_stop_the_presence_check_of_the_next():
    text = TEMPLATE.format(**LIVELOCK)

    def handler(r):
        if r.url.host == "gone":
            raise httpx.ConnectError("refused")
        return httpx.Response(200, text=text)

    async def go():
        async with client(handler) as h:
            return await metric_presence(h, Cluster({}), {"gone": "prefill", "decode": "decode"}, {})
    pres = run(go())
    assert "gone" in pres.unreachable and "decode" in pres.required and "decode" in pres.diagnostic
    # without NIXL the decode is not asked for the NIXL metrics
    snap = m.parse_metrics(text, "decode", t=0)
    assert pres.required["decode"] == m.missing_metrics(snap, m.required_metrics("decode", False))
    assert pres.diagnostic["decode"] == m.missing_metrics(snap, m.DIAGNOSTIC_METRICS.get("decode", ()))


def test_a_fresh_scanner_reads_the_death_line_from_the_logs_first_byte():
    d = Log(FATAL + "\n")
    assert LogScanner().death_line(Cluster({"decode": d}), "decode") == FATAL


# -------------------------------------------------------------------------------------------------
# Evidence gathering (rig.observe.evidence) where `make mutation` found it untested: the owner's
# stop line, marks kept across phases, the endpoints and bounds of the HTTP probes, the wait for a
# silent instance to exit. Fakes: the duck-typed cluster above, log files under
# tmp_path, httpx.MockTransport; the clock and sleeps are stubs (no sleeping).

class _FileCluster(Cluster):
    """The fake cluster with real log files (FileLog: a mark is a byte offset, since(None) is an error)."""

    def __init__(self, logs: dict[str, FileLog]):
        super().__init__(logs)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- the owner's stop line

def test_stop_line_is_the_owners_last_stop_line_since_the_start():
    d = Log(stop_marker("decode"))  # an earlier incarnation's stop
    c = Cluster({"decode": d, "prefill": Log(), "router": None})
    sc = LogScanner()
    sc.starting(c, ["decode", "router"])
    assert sc.stop_line(c, "decode") is None
    d.write("INFO serving\n" + stop_marker("prefill") + "INFO x\n")
    assert sc.stop_line(c, "decode") is None  # another instance's stop line
    line = stop_marker("decode", "SIGINT")
    d.write(line)
    assert sc.stop_line(c, "decode") == line.strip()
    d.readable = False
    assert sc.stop_line(c, "decode") is None
    assert sc.stop_line(c, "router") is None  # no log source


def test_stop_line_of_an_instance_never_started_reads_its_whole_log(tmp_path):
    path = tmp_path / "decode.log"
    line = stop_marker("decode")
    path.write_text(line)
    c = _FileCluster({"decode": FileLog("decode", str(path))})
    assert LogScanner().stop_line(c, "decode") == line.strip()
    assert LogScanner().death_line(c, "decode") == f"no fatal line; last log line: {line.strip()}"


def test_starting_a_log_not_yet_written_reads_it_from_its_first_byte(tmp_path):
    path = tmp_path / "decode.log"
    c = _FileCluster({"decode": FileLog("decode", str(path))})
    sc = LogScanner()
    sc.starting(c, ["decode"])  # the file does not exist yet
    path.write_text(FATAL + "\n")
    assert sc.death_line(c, "decode").endswith(FATAL)
    assert sc.death_line(c, "decode").startswith("ERROR")


def test_starting_an_instance_without_a_log_source_is_no_error():
    c = Cluster({"router": None})
    sc = LogScanner()
    sc.starting(c, ["router"])
    assert sc._start == {"router": 0}


# ------------------------------------------------------------------------- scan marks

def test_an_instance_kept_into_the_next_phase_keeps_its_mark():
    d = Log()
    c = Cluster({"decode": d})
    sc = LogScanner()
    sc.phase_started(c)
    d.write(FATAL + "\n")
    sc.phase_started(c)  # the next phase keeps decode: its unscanned line stays unscanned, not skipped
    o = obs()
    sc.scan(c, o)
    assert o.fatal_lines == {"decode": [FATAL]}


def test_forgetting_an_instance_never_scanned_is_no_error():
    sc = LogScanner()
    sc.forget(["never"])
    assert sc._scan == {}


def test_a_log_whose_end_cannot_be_marked_is_read_again_from_the_same_place():
    d = Log(markable=True)
    c = Cluster({"decode": d})
    sc = LogScanner()
    sc.phase_started(c)
    d.write(FATAL + "\n")
    d.markable = False  # its size cannot be read now: the next scan starts where this one did
    o = obs()
    sc.scan(c, o)
    assert o.fatal_lines == {"decode": [FATAL]}
    d.markable = True
    o = obs()
    sc.scan(c, o)
    assert o.fatal_lines == {"decode": [FATAL]} and o.unscanned_logs == {}


# ------------------------------------------------------------------------- HTTP probes

def _client(handler, asked: list[httpx.Request]) -> httpx.AsyncClient:
    def record(req: httpx.Request) -> httpx.Response:
        asked.append(req)
        return handler(req)
    # a long client default: the probes must bound themselves
    return httpx.AsyncClient(transport=httpx.MockTransport(record), timeout=httpx.Timeout(60.0))


def test_healthy_asks_health_within_five_seconds():
    asked: list[httpx.Request] = []

    async def go() -> bool:
        async with _client(lambda r: httpx.Response(200 if r.url.path == "/health" else 404), asked) as h:
            return await healthy(h, "http://d")

    assert asyncio.run(go()) is True
    assert [r.url.path for r in asked] == ["/health"]
    assert asked[0].extensions["timeout"] == {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}


def test_read_versions_asks_version_within_five_seconds_and_needs_a_200():
    asked: list[httpx.Request] = []

    def handler(r: httpx.Request) -> httpx.Response:
        if r.url.path != "/version":
            return httpx.Response(404)
        return httpx.Response(200 if r.url.host == "a" else 503, json={"version": "0.32.0"})

    async def go():
        async with _client(handler, asked) as h:
            return await read_versions(h, Cluster({}), ["a", "b"])

    assert asyncio.run(go()) == {"a": "0.32.0", "b": "unknown"}  # b's 503 body is no answer
    assert asked[0].extensions["timeout"] == {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}


def test_metric_presence_asks_nixl_metrics_only_of_a_nixl_decode():
    text = TEMPLATE.format(**LIVELOCK)  # has vllm:nixl_bytes_transferred_{sum,count}, not prompt_tokens_by_source
    no_nixl = "\n".join(ln for ln in text.splitlines() if "nixl" not in ln) + "\n"
    pages = {"d1": no_nixl, "d2": no_nixl}

    async def go(nixl):
        async with _client(lambda r: httpx.Response(200, text=pages[r.url.host]), []) as h:
            return await metric_presence(h, Cluster({}), {"d1": "decode", "d2": "decode"}, nixl)

    plain = asyncio.run(go({"d1": False}))
    assert m.NIXL_BYTES_SUM not in plain.required["d1"] and m.NIXL_BYTES_SUM not in plain.required["d2"]
    pulls = asyncio.run(go({"d1": True}))
    assert m.NIXL_BYTES_SUM in pulls.required["d1"] and m.NIXL_XFER_COUNT in pulls.required["d1"]
    assert m.NIXL_BYTES_SUM not in pulls.required["d2"]  # not named in nixl: no NIXL pull
    lean = "\n".join(ln for ln in no_nixl.splitlines() if "by_reason" not in ln and "by_stage" not in ln) + "\n"
    pages.update(d1=lean)
    assert asyncio.run(go({})).diagnostic["d1"] == [m.WAITING_BY_REASON, m.KV_FETCH_BY_STAGE]


# ------------------------------------------------------------------------- settle_deaths

def _clock(monkeypatch) -> list[float]:
    """evidence's clock advances 1 s per reading; its sleeps are recorded, not slept."""
    now = [0.0]

    def monotonic() -> float:
        now[0] += 1.0
        return now[0]

    slept: list[float] = []
    real = asyncio.sleep

    async def sleep(s: float) -> None:
        slept.append(s)
        await real(0)

    monkeypatch.setattr(evidence, "time", SimpleNamespace(monotonic=monotonic))
    monkeypatch.setattr(evidence.asyncio, "sleep", sleep)
    return slept


def test_settle_deaths_asks_each_instance_at_its_own_url_and_polls_every_quarter_second(monkeypatch):
    slept = _clock(monkeypatch)
    c = Cluster({"decode": Log(), "prefill": Log()})
    asked: list[str] = []

    def handler(r: httpx.Request) -> httpx.Response:
        asked.append(r.url.host)
        if r.url.host == "decode" and asked.count("decode") == 2:
            c._dead["decode"] = 0
        return httpx.Response(500 if r.url.host == "decode" else 200)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as h:
            return await settle_deaths(h, c, ["decode", "prefill"], 30.0)

    assert asyncio.run(go()) == {"decode": 0}
    assert asked == ["decode", "prefill", "decode", "prefill", "prefill"]
    assert slept == [0.25, 0.25]


def _settle(c: Cluster, names: list[str], within: float, status: int) -> tuple[dict[str, int], list[str]]:
    """settle_deaths over instances whose /health all answer ``status``; (its result, hosts asked)."""
    asked: list[str] = []

    def handler(r: httpx.Request) -> httpx.Response:
        asked.append(r.url.host)
        return httpx.Response(status)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as h:
            return await settle_deaths(h, c, names, within)

    return asyncio.run(go()), asked


@pytest.mark.parametrize("within,asks", [(0.0, 1), (2.0, 2), (3.0, 3)])
def test_settle_deaths_gives_a_silent_instance_exactly_its_grace(within, asks, monkeypatch):
    _clock(monkeypatch)  # the deadline is read at 1 s, each round reads the clock once more
    dead, asked = _settle(Cluster({"decode": Log()}), ["decode"], within, 500)
    assert dead == {}  # silent but alive at the deadline: not dead
    assert len(asked) == asks


def test_settle_deaths_returns_at_once_when_every_instance_answers(monkeypatch):
    slept = _clock(monkeypatch)
    c = Cluster({"decode": Log(), "prefill": Log()}, dead={"old": 1})
    dead, asked = _settle(c, ["decode", "prefill", "gone"], 30.0, 200)
    assert dead == {"old": 1}
    assert asked == ["decode", "prefill"] and slept == []  # "gone" is no process of the cluster


def test_all_missing_names_an_instance_that_lacks_only_required_or_only_diagnostic_metrics():
    p = MetricPresence(required={"d": ["vllm:a"], "p": []}, diagnostic={"x": ["vllm:c"]})
    assert p.all_missing() == {"d": ["vllm:a"], "x": ["vllm:c"]}


def test_the_error_names_every_instance_its_version_and_what_to_do():
    p = MetricPresence(required={"decode": ["vllm:a", "vllm:b"], "prefill": ["vllm:c"], "ok": []})
    assert p.error({"decode": "0.32.0"}) == (
        "metrics the checks read are missing: decode (vLLM 0.32.0) lacks vllm:a, vllm:b; prefill (vLLM unknown) "
        "lacks vllm:c (rig/observe/metrics.py REQUIRED_METRICS: a renamed metric needs the rig updated for this "
        "vLLM version)")
