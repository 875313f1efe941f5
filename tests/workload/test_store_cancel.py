"""The store wave's R14 options (bug record R14: cancel waves on the Mooncake profile) without live
servers: the fields' validation, the cancel plan, and fake-server runs (tests/workload/test_store.py's
in-process P, D and master, with hop delays) showing that a cancellation fires at its time on
the named hop and not before, that the prefix-cache reset runs between rounds (and fails the
scenario when the server refuses it), and that a leak (D's KV usage stays up after its cancelled
requests) or a hang fails the wave's checks.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from rig.config import ConfigError, ScenarioConfig, StoreScenarioConfig, load_config
from rig.judge import store_checks as sj
from rig.observe.observations import ScenarioObservation, wait_idle
from rig.report.build import observation_report, store_report, verdict_report
from rig.report.store_section import store_section
from rig.transport.client import HttpxTransport
from rig.transport.endpoint import Endpoint
from rig.workload import store as st
from rig.workload.store_rounds import plan_store_cancels, streamed
from tests.helpers.store_world import LABELS, World, fast_settle  # noqa: F401 - fast_settle: autouse fixture

ROOT = Path(__file__).resolve().parents[2]
CFG_PATH = ROOT / "configs" / "cpu-regressions-mooncake.yaml"
CFG = load_config(CFG_PATH)
P, D, M = "http://p.test", "http://d.test", "http://m.test"



def store_md(sc, obs, so, v) -> str:
    """The scenario's store section as summary.md renders it: from the report's data."""
    return store_section(sc.name, sc.description or "", observation_report(obs), store_report(so, obs),
                         verdict_report(v))

def r14(**store) -> ScenarioConfig:
    """r14-cancel-wave-store of the suite, smaller, with ``store`` overrides."""
    sc = next(s for s in CFG.scenarios if s.name == "r14-cancel-wave-store")
    base = {"groups": 2, "per_group": 4, "rounds": 2, "concurrency": 4, "stream": "never"}
    return sc.model_copy(update={"store": sc.store.model_copy(update={**base, **store})})


# --- validation -------------------------------------------------------------------------------


def _scenario(**store) -> dict:
    return {"name": "s", "kind": "prefix-wave-store", "prompt_tokens": 128, "max_tokens": 8, "store": store}


@pytest.mark.parametrize("store,words", [
    ({"cancel_after_ms": [300, 100]}, "store.cancel_after_ms [300, 100]: give [lo, hi] ms with 0 <= lo <= hi"),
    ({"cancel_after_ms": [-5, 100]}, "0 <= lo <= hi"),
    ({"cancel_fraction": 1.5}, "cancel_fraction"),
    ({"reset_prefix_cache": True}, "store.reset_prefix_cache resets between rounds: set store.rounds >= 2"),
    ({"cancel_hop": "prefill", "route": "store", "cancel_fraction": 0.3}, "a store-routed request has no prefill hop"),
    ({"cancel_hop": "both"}, "cancel_hop"),
    ({"rounds": 0}, "rounds"),
])
def test_store_wave_fields_refused(store, words):
    with pytest.raises(ValueError, match="store") as e:
        ScenarioConfig.model_validate(_scenario(**store))
    assert words in str(e.value)


def test_r14_options_only_on_prefix_wave_store():
    with pytest.raises(ValueError) as e:
        ScenarioConfig.model_validate({**_scenario(cancel_fraction=0.3, rounds=2), "kind": "store-roundtrip"})
    assert "store.cancel_fraction, store.rounds: only for kind prefix-wave-store (kind is 'store-roundtrip')" \
        in str(e.value)
    ScenarioConfig.model_validate({**_scenario(requests=2), "kind": "store-roundtrip"})  # defaults are fine


def test_reset_refused_without_dev_mode():
    with pytest.raises(ConfigError) as e:
        load_config(CFG_PATH, ["launch.env={}"])
    msg = str(e.value)
    assert "scenario r14-cancel-wave-store: store.reset_prefix_cache needs VLLM_SERVER_DEV_MODE=1 in prefill " \
           "prefill's env" in msg and "decode decode's env" in msg
    # dev mode on one instance only still refuses the other
    with pytest.raises(ConfigError, match="in decode decode's env"):
        load_config(CFG_PATH, ["launch.env={}", "prefill.prefill.env={VLLM_SERVER_DEV_MODE: '1'}"])


def test_plan_store_cancels_is_seeded_and_honours_the_hop():
    st_ = StoreScenarioConfig(cancel_fraction=0.5, cancel_after_ms=(10, 20), cancel_hop="either")
    routes = ["store", "pd"] * 10
    a, b = plan_store_cancels(routes, st_, 7), plan_store_cancels(routes, st_, 7)
    assert a == b and sum(c is not None for c in a) == 10
    assert all(10 <= c.after_ms <= 20 for c in a if c)
    assert all(c.hop == "decode" for c, r in zip(a, routes, strict=True) if c and r == "store")
    assert {c.hop for c in a if c} == {"prefill", "decode"}
    only_p = plan_store_cancels(routes, st_.model_copy(update={"cancel_hop": "prefill", "cancel_fraction": 0.8}), 1)
    # 16 wanted, only the 10 P/D requests have a prefill hop
    assert [i for i, c in enumerate(only_p) if c] == [i for i, r in enumerate(routes) if r == "pd"]
    assert plan_store_cancels(routes, StoreScenarioConfig(), 1) == [None] * 20
    assert [streamed("mixed", i) for i in range(4)] == [False, True, False, True]
    assert streamed("always", 0) and not streamed("never", 1)


# --- fake servers with hop delays ---------------------------------------------------------------


class TimedWorld(World):
    """tests/workload/test_store.py's World with per-instance answer delays, a request log with the time
    each hop was received and, when the client closed it, how long after; optionally a D that
    keeps KV after a cancelled request (a leak), a D that never answers (a hang), and
    /reset_prefix_cache answers."""

    def __init__(self, p_delay: float = 0.0, d_delay: float = 0.0, leak: bool = False, hang_d: bool = False,
                 reset_status: int = 200, reset_busy: int = 0, **kw):
        super().__init__(**kw)
        self.delay = {"p": p_delay, "d": d_delay}
        self.leak, self.hang_d = leak, hang_d
        self.leaked = False
        self.reset_status, self.reset_busy = reset_status, reset_busy
        self.log: list[dict] = []  # every completions request and reset, in order

    async def ahandler(self, req: httpx.Request) -> httpx.Response:
        host = req.url.host.split(".")[0]
        if req.url.path == "/reset_prefix_cache":
            self.log.append({"reset": host, "t": time.monotonic()})
            if self.reset_status != 200:
                return httpx.Response(self.reset_status, json={"detail": "Not Found"})
            self.reset_busy -= 1
            return httpx.Response(200, json={"success": self.reset_busy < 0})
        if req.url.path == "/v1/completions":
            body = json.loads(req.content)
            entry = {"inst": host, "prompt": tuple(body["prompt"]), "t": time.monotonic(),
                     "pd": body.get("kv_transfer_params") is not None, "cancelled_after": None}
            self.log.append(entry)
            try:
                if host == "d" and self.hang_d and body["max_tokens"] > 1:
                    await asyncio.Event().wait()
                await asyncio.sleep(self.delay[host] if body["max_tokens"] > 1 or host == "p" else 0)
            except asyncio.CancelledError:
                entry["cancelled_after"] = time.monotonic() - entry["t"]
                self.leaked = self.leaked or (self.leak and host == "d")
                raise
        return self.handler(req)

    def vllm_metrics(self, inst: str) -> str:
        text = super().vllm_metrics(inst)
        if inst == "d" and self.leaked:  # the cancelled requests' blocks are never freed
            text = text.replace(f"vllm:kv_cache_usage_perc{{{LABELS}}} 0", f"vllm:kv_cache_usage_perc{{{LABELS}}} 0.25")
        return text

    def hops(self, inst: str, prompt: list[int]) -> list[dict]:
        return [e for e in self.log if e.get("inst") == inst and e["prompt"] == tuple(prompt) and
                (inst == "p" and not e["pd"] or inst == "d" or e["pd"])]


def run(world: TimedWorld, sc: ScenarioConfig, tmp_path: Path, drain_s: float = 0.3):
    """The scenario against ``world`` as the runner runs it: the workload, then the drains
    (rig.observe.observations.wait_idle on the fake's /metrics, ``drain_s``)."""
    async def go():
        transport = httpx.MockTransport(world.ahandler)
        http = httpx.AsyncClient(transport=transport)
        client = HttpxTransport("tiny", timeout_s=1000, http=httpx.AsyncClient(transport=transport, timeout=1000))
        ctx = st.StoreContext(cfg=CFG.model_copy(update={"timeouts": CFG.timeouts.model_copy(
            update={"metrics_interval_s": 0.05})}), p=Endpoint("prefill", P), d=Endpoint("decode", D),
            master=Endpoint("mooncake-master", M), client=client, http=http, snapshots=None, run_dir=tmp_path)
        obs = ScenarioObservation(scenario=sc.name, decode="decode", prefill="prefill",
                                  fatal_lines={"prefill": [], "decode": []},
                                  kv_integrity_lines={"prefill": [], "decode": []})
        try:
            so = await st.run_store_scenario(sc, ctx, obs)
            for name, url in (("decode", D), ("prefill", P)):
                obs.drains.append(await wait_idle(http, name, url, 0.0, drain_s, interval_s=0.05))
        finally:
            await http.aclose()
            await client.aclose()
        return obs, so
    return asyncio.run(go())


def by_name(v) -> dict:
    return {c.name: c for c in v.checks}


def test_decode_cancel_fires_at_its_time_not_before(tmp_path):
    world = TimedWorld(d_delay=0.6)
    sc = r14(cancel_fraction=0.5, cancel_after_ms=(150, 250), cancel_hop="decode", rounds=2)
    obs, so = run(world, sc, tmp_path)
    cancelled = [r for r in obs.records if r.cancel]
    assert len(cancelled) == 8  # half of 2 rounds x 8
    for r in cancelled:
        assert r.intentional and r.cancel.point == "during-decode" and r.outcome == "cancelled"
        assert r.cancel.hop == "decode" and 150 <= r.cancel.after_ms <= 250
        assert r.cancel.after_ms <= r.cancel.fired_ms < r.cancel.after_ms + 150
        (d_hop,) = world.hops("d", r.prompt)
        # the fake saw the hop closed at its time, not before: after_ms after the rig sent it
        assert d_hop["cancelled_after"] is not None
        closed_at = d_hop["t"] + d_hop["cancelled_after"]
        due = r.cancel.sent_at + r.cancel.after_ms / 1000
        assert due <= closed_at < due + 0.15
        if so.routes[obs.records.index(r)] == "pd":  # the prefill hop was not touched
            assert all(h["cancelled_after"] is None for h in world.hops("p", r.prompt))
    for r in obs.records:
        if not r.cancel:
            assert r.outcome == "ok"
            assert all(h["cancelled_after"] is None for h in world.hops("d", r.prompt))
    v = sj.judge_store(sc, obs, so)
    assert v.verdict == "PASS", v.reason
    checks = by_name(v)
    assert "8/8 completed; 8 cancelled on purpose (during-decode 8)" in checks["completed"].detail
    assert checks["prefix-cache-reset"].ok and "2/2 POST /reset_prefix_cache answered success" \
        in checks["prefix-cache-reset"].detail
    assert [w["cancelled"] for w in so.waves] == [4, 4] and [w["round"] for w in so.waves] == [0, 1]
    section = store_md(sc, obs, so, v)
    assert "| round 1 wave 0 | 4/8 (4 cancelled) |" in section
    assert "| planned cancellations | 8 cancelled on purpose (during-decode 8)" in section
    assert "| prefix-cache resets between rounds | round 1 prefill: ok (HTTP 200, 1 attempt(s)" in section


def test_prefill_cancel_closes_p_and_never_sends_d(tmp_path):
    world = TimedWorld(p_delay=0.5)
    # mixed routes: the 4 P/D requests are the ones with a prefill hop to cancel
    sc = r14(cancel_fraction=0.5, cancel_after_ms=(100, 100), cancel_hop="prefill", rounds=1,
             reset_prefix_cache=False)
    obs, so = run(world, sc, tmp_path)
    cancelled = [r for r in obs.records if r.cancel]
    assert [so.routes[obs.records.index(r)] for r in cancelled] == ["pd"] * 4
    for r in cancelled:
        assert r.cancel.point == "before-prefill" and r.prefill is None and r.decode is None
        assert 100 <= r.cancel.fired_ms < 250
        (p_hop,) = world.hops("p", r.prompt)
        assert r.cancel.sent_at + 0.1 <= p_hop["t"] + p_hop["cancelled_after"] < r.cancel.sent_at + 0.25
        assert world.hops("d", r.prompt) == []
    assert sj.judge_store(sc, obs, so).verdict == "PASS"


def test_prefill_answered_first_abandons_between_and_decode_answered_first_is_judged(tmp_path):
    world = TimedWorld(p_delay=0.01, d_delay=0.01)
    sc = r14(cancel_fraction=1.0, cancel_after_ms=(300, 300), cancel_hop="either", rounds=1,
             reset_prefix_cache=False)
    obs, so = run(world, sc, tmp_path)
    between = [r for r in obs.records if r.cancel and r.cancel.hop == "prefill"]
    missed = [r for r in obs.records if r.cancel and r.cancel.hop == "decode"]
    assert between and missed
    for r in between:  # P answered first: D never asked, as a wave abandons between the hops
        assert r.intentional and r.cancel.point == "between" and r.cancel.fired_ms is None
        assert world.hops("d", r.prompt) == []
    for r in missed:  # D answered first: the request is an answered one, with parity
        assert not r.intentional and r.outcome == "ok" and r.cancel.fired_ms is None and r.cancel.point is None
    v = sj.judge_store(sc, obs, so)
    assert v.verdict == "PASS", v.reason
    assert f"{len(missed)} planned cancels missed (the decode hop answered first)" in by_name(v)["completed"].detail


def test_leak_after_cancels_fails_idle_after(tmp_path):
    world = TimedWorld(d_delay=0.4, leak=True)
    sc = r14(cancel_fraction=0.5, cancel_after_ms=(50, 100), cancel_hop="decode", rounds=1, reset_prefix_cache=False)
    obs, so = run(world, sc, tmp_path)
    v = sj.judge_store(sc, obs, so)
    idle = by_name(v)["idle-after"]
    assert v.verdict == "FAIL" and idle.ok is False and "decode" in idle.detail
    # the same wave without the leak passes: the check failed on the leak, not on the cancels
    obs, so = run(TimedWorld(d_delay=0.4), sc, tmp_path)
    assert sj.judge_store(sc, obs, so).verdict == "PASS"


def test_hang_fails_completed(tmp_path):
    world = TimedWorld(hang_d=True)
    sc = r14(cancel_fraction=0.25, rounds=1, reset_prefix_cache=False).model_copy(update={"deadline_s": 0.5})
    obs, so = run(world, sc, tmp_path)
    v = sj.judge_store(sc, obs, so)
    assert v.verdict == "FAIL" and by_name(v)["completed"].ok is False
    hung = [r for r in obs.records if not r.intentional]
    assert hung and all(r.outcome in ("timeout", "stalled") for r in hung)


def test_reset_between_rounds_retries_busy_and_fails_when_refused(tmp_path):
    world = TimedWorld(reset_busy=2)  # success=false twice (blocks still held), then true
    sc = r14(rounds=2)
    obs, so = run(world, sc, tmp_path)
    resets = [i for i, e in enumerate(world.log) if "reset" in e]
    round0 = [i for i, e in enumerate(world.log) if e.get("inst") == "d" and
              any(e["prompt"] == tuple(r.prompt) for r in obs.records if "-r0-" in r.request_id)]
    round1 = [i for i, e in enumerate(world.log) if e.get("inst") == "d" and
              any(e["prompt"] == tuple(r.prompt) for r in obs.records if "-r1-" in r.request_id)]
    assert max(round0) < min(resets) and max(resets) < min(round1)
    assert so.resets[0]["attempts"] == 3 and all(r["success"] for r in so.resets)
    assert sj.judge_store(sc, obs, so).verdict == "PASS"
    obs, so = run(TimedWorld(reset_status=404), sc, tmp_path)
    v = sj.judge_store(sc, obs, so)
    reset = by_name(v)["prefix-cache-reset"]
    assert v.verdict == "FAIL" and reset.ok is False and "HTTP 404" in reset.detail \
        and "VLLM_SERVER_DEV_MODE=1" in reset.detail


# --- the matrix on a build without Mooncake ------------------------------------------------------


class NoMooncakeBuilder:
    """A Builder whose build interpreter cannot find ``mooncake`` (a script that exits 1)."""

    def __init__(self, python: Path):
        self.py = python

    def python(self, name: str) -> Path:
        return self.py

    def stamp(self, name: str) -> dict | None:
        return None

    def checked(self, name: str, model, log_file: Path) -> None:  # no overlay here: nothing to check
        return None


def test_matrix_row_without_mooncake_is_not_run_never_pass(tmp_path):
    from rig.cluster.builds import has_module, load_builds
    from rig.run.matrix import Matrix

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    assert not has_module(fake, "mooncake") and not has_module(tmp_path / "missing", "mooncake")
    m = Matrix(load_builds(), NoMooncakeBuilder(fake), str(CFG_PATH), [], ["regressions-mooncake"],
               tmp_path / "out", quiet=True)
    (rep,) = m.run_build("0.32.0", resume=False)
    assert rep.status == "not-run" and not (tmp_path / "out" / "0.32.0" / "regressions-mooncake" / "logs").exists()
    md, passed = m.write(["0.32.0"], ["test"])
    cell = json.loads((tmp_path / "out" / "matrix.json").read_text())["cells"][0]
    assert not passed and cell["verdict"] == "NOT RUN" and cell["scenario"] == "r14-cancel-wave-store"
    assert cell["reason"].startswith("not run: no mooncake in this build")
