"""Evidence gathering (rig.observe.evidence) where `make mutation` found it untested: the owner's
stop line, marks kept across phases, the endpoints and bounds of the HTTP probes, the wait for a
silent instance to exit. Fakes: the duck-typed cluster of test_observe_evidence, log files under
tmp_path, httpx.MockTransport; the clock and sleeps are stubs (no sleeping)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest

from rig.cluster.logs import FileLog, stop_marker
from rig.observe import evidence
from rig.observe import metrics as m
from rig.observe.evidence import LogScanner, MetricPresence, healthy, metric_presence, read_versions, settle_deaths
from test_evidence import FATAL, Cluster, Log, obs
from test_stall import LIVELOCK, TEMPLATE


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
