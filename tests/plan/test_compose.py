"""rig.plan.compose against the Compose specification's JSON schema, and back to the plan.

tests/data/compose-spec.json is compose-spec/compose-spec's schema/compose-spec.json, vendored
verbatim from the check-jsonschema 0.39.0 wheel (builtin_schemas/vendor; Apache-2.0, see
tests/data/LICENSE.compose-spec).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from rig.config import load_config
from rig.plan import compose
from rig.plan.spec import Plan, ProcessSpec

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
PROFILES = ["cpu-tiny", "l4x2", "h200", "h200-2gpu"]
RUN_HOST = "/srv/runs/r1"
MODEL_HOST = "/srv/cache/tiny"
SAFE_ENV_REWRITES = {"VLLM_NIXL_SIDE_CHANNEL_HOST", "CUDA_VISIBLE_DEVICES", "UCX_NET_DEVICES",
                     "VLLM_HOST_IP", "MC_TCP_BIND_ADDRESS"}


def render(profile: str, overrides: list[str] | None = None):
    cfg = load_config(ROOT / "configs" / f"{profile}.yaml", overrides)
    plan = compose.container_plan(cfg)
    doc = compose.render_compose(cfg, plan, "pdrig:test", RUN_HOST, model_dir_host=MODEL_HOST)
    return cfg, plan, doc


def schema_errors(doc: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def with_master(plan: Plan) -> Plan:
    """A plan with a Mooncake master in front and a store client on decode, shaped like
    rig.plan.mooncake's master_argv / store_config / store_client_env output."""
    master = ProcessSpec(
        name="mooncake-master", role="mooncake-master",
        argv=("mooncake_master", "--rpc_port", "50051", "--rpc_address", "127.0.0.1",
              "--enable_http_metadata_server=true", "--http_metadata_server_host", "127.0.0.1",
              "--http_metadata_server_port", "8080", "--metrics_port", "9003",
              "--metrics_host=127.0.0.1"),
        env={"PYTHONUNBUFFERED": "1"}, log_path=f"{plan.run_dir}/logs/mooncake-master.log",
        host="127.0.0.1", port=9003, health_path="/health", ready_ports=(50051,))
    store = f"{plan.run_dir}/mooncake/decode.json"
    d = plan.by_name("decode")
    decode = dataclasses.replace(
        d, env={**d.env, "MOONCAKE_CONFIG_PATH": store, "VLLM_HOST_IP": "127.0.0.1",
                "MC_TCP_BIND_ADDRESS": "127.0.0.1", "MC_MIN_RPC_PORT": "8582"},
        files={store: json.dumps({"metadata_server": "http://127.0.0.1:8080/metadata",
                                  "master_server_address": "127.0.0.1:50051"})})
    procs = [master, *(decode if p.name == "decode" else p for p in plan.processes)]
    return dataclasses.replace(plan, processes=tuple(procs))


@pytest.mark.parametrize("profile", PROFILES)
def test_valid_against_compose_spec(profile):
    cfg, plan, doc = render(profile)
    assert schema_errors(doc) == []
    text = compose.compose_yaml(cfg, plan, "pdrig:test", RUN_HOST, model_dir_host=MODEL_HOST)
    assert schema_errors(yaml.safe_load(text)) == []


def test_schema_is_live():
    _, _, doc = render("l4x2")
    doc["services"]["prefill"]["bogus"] = 1
    doc["services"]["decode-6blk"]["depends_on"]["decode"]["condition"] = "service_ready"  # no such
    errors = "\n".join(schema_errors(doc))
    assert "'bogus' was unexpected" in errors and "'service_ready'" in errors


@pytest.mark.parametrize("profile", PROFILES)
def test_services_mirror_the_plan(profile):
    cfg, plan, doc = render(profile)
    assert doc["name"] == f"pdrig-{cfg.name}"
    assert list(doc["services"]) == [p.name for p in plan.processes]
    for p in plan.processes:
        svc = doc["services"][p.name]
        assert svc["image"] == "pdrig:test" and svc["entrypoint"] == [] and svc["hostname"] == p.name
        assert isinstance(svc["command"], list)
        expected = list(p.argv)
        i = expected.index("--host")
        expected[i + 1] = "0.0.0.0"  # the one argv rewrite
        assert svc["command"] == expected
        assert svc["ports"] == [{"target": p.port, "published": str(p.port), "host_ip": "127.0.0.1",
                                 "protocol": "tcp"}]
        env = svc["environment"]
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == p.name  # what P advertises to D
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]
        assert {k: v for k, v in env.items() if k not in SAFE_ENV_REWRITES and v is not None} == \
            {k: v for k, v in p.env.items() if k not in SAFE_ENV_REWRITES}
        test = svc["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python3", "-c"] and len(test) == 4
        assert f"http://127.0.0.1:{p.port}/health" in test[3]
        assert repr((p.name, p.ready_ports[0])) in test[3]
        compile(test[3], "healthcheck", "exec")
        assert svc["healthcheck"]["start_period"] == f"{int(cfg.timeouts.startup_s)}s"
        assert svc["networks"] == [compose.NETWORK] and svc["restart"] == "no"
        assert {"type": "bind", "source": RUN_HOST, "target": plan.run_dir} in svc["volumes"]
        assert svc["labels"]["pdrig.log"] == f"{RUN_HOST}/logs/{p.name}.log"


def test_cpu_services():
    _, plan, doc = render("cpu-tiny")
    assert plan.model_path == compose.CONTAINER_MODEL_DIR and plan.run_dir == compose.CONTAINER_RUN_DIR
    for p in plan.processes:
        svc = doc["services"][p.name]
        assert svc["command"][:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
        assert "deploy" not in svc and "CUDA_VISIBLE_DEVICES" not in svc["environment"]
        assert svc["environment"]["UCX_NET_DEVICES"] == "eth0"  # not lo: the peer is another netns
        assert svc["environment"]["UCX_TLS"] == "tcp,self"
        assert {"type": "bind", "source": MODEL_HOST, "target": "/rig/model", "read_only": True} in svc["volumes"]
        assert "HF_TOKEN" not in svc["environment"]
        assert svc["cpuset"] == ("0" if p.role == "prefill" else "1")  # the instances' `cpus`
    assert "volumes" not in doc  # no hub cache for a local model


@pytest.mark.parametrize("profile,gpus", [("l4x2", ["0", "1", "1", "1"]), ("h200", ["0"] * 4),
                                          ("h200-2gpu", ["0", "1", "1", "1"])])
def test_gpu_services(profile, gpus):
    _, plan, doc = render(profile)
    for p, gpu in zip(plan.processes, gpus, strict=True):
        svc = doc["services"][p.name]
        assert svc["deploy"]["resources"]["reservations"]["devices"] == [
            {"driver": "nvidia", "device_ids": [gpu], "capabilities": ["gpu"]}]
        assert svc["environment"]["CUDA_VISIBLE_DEVICES"] == "0"  # the container sees one GPU
        assert svc["environment"]["HF_TOKEN"] is None  # passed through, never written
        assert svc["ipc"] == "host"
        assert {"type": "volume", "source": "hf-cache", "target": compose.CONTAINER_HF_CACHE} in svc["volumes"]
        assert svc["command"][:3] == ["vllm", "serve", "Qwen/Qwen3-0.6B"]
    assert doc["volumes"] == {"hf-cache": {}}


def test_tensor_parallel_devices_renumbered():
    _, _, doc = render("l4x2", ["prefill.prefill.tensor_parallel_size=2", "prefill.prefill.gpu_ids=[2, 3]"])
    svc = doc["services"]["prefill"]
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["2", "3"]
    assert svc["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"


@pytest.mark.parametrize("profile,deps", [
    ("cpu-tiny", {"decode": {"prefill": "service_started"}, "decode-6blk": {"prefill": "service_started"},
                  "decode-nospec": {"prefill": "service_started"}}),
    ("l4x2", {"decode": {"prefill": "service_started"},
              "decode-6blk": {"prefill": "service_started", "decode": "service_healthy"},
              "decode-nospec": {"prefill": "service_started", "decode-6blk": "service_healthy"}}),
    ("h200", {"decode": {"prefill": "service_healthy"},
              "decode-6blk": {"prefill": "service_started", "decode": "service_healthy"},
              "decode-nospec": {"prefill": "service_started", "decode-6blk": "service_healthy"}}),
])
def test_depends_on(profile, deps):
    _, _, doc = render(profile)
    got = {name: {d: c["condition"] for d, c in svc["depends_on"].items()}
           for name, svc in doc["services"].items() if "depends_on" in svc}
    assert got == deps


@pytest.mark.parametrize("profile", PROFILES)
def test_round_trip_yaml_to_plan(profile):
    """Parse the rendered text and rebuild argv/env: the plan's, up to the documented rewrites."""
    cfg, plan, _ = render(profile, ["launch.extra_args=['--api-key', 'k$1']"])
    text = compose.compose_yaml(cfg, plan, "pdrig:test", RUN_HOST, model_dir_host=MODEL_HOST)
    assert text.startswith("# Generated by pdrig")
    services = yaml.safe_load(text)["services"]
    unescape = lambda s: s.replace("$$", "$")  # noqa: E731 - Compose's interpolation of a literal
    for p in plan.processes:
        svc = services[p.name]
        assert not any(re.search(r"(?<!\$)\$(?!\$)", a) for a in svc["command"])  # no live $VAR
        argv = [unescape(a) for a in svc["command"]]
        env = {k: unescape(v) for k, v in svc["environment"].items() if v is not None}
        assert argv[-2:] == ["--api-key", "k$1"]
        host_at = argv.index("--host") + 1
        assert argv[host_at] == "0.0.0.0"
        argv[host_at] = p.host
        assert tuple(argv) == p.argv
        assert env.pop("VLLM_NIXL_SIDE_CHANNEL_HOST") == p.name
        if p.gpu_ids:
            assert env.pop("CUDA_VISIBLE_DEVICES") == ",".join(map(str, range(len(p.gpu_ids))))
        if p.env.get("UCX_NET_DEVICES") == "lo":
            assert env.pop("UCX_NET_DEVICES") == "eth0"
        assert env == {k: v for k, v in p.env.items() if k not in SAFE_ENV_REWRITES or
                       (k == "UCX_NET_DEVICES" and v != "lo")}


def test_mooncake_master_service():
    cfg = load_config(ROOT / "configs" / "cpu-tiny.yaml")
    plan = with_master(compose.container_plan(cfg))
    doc = compose.render_compose(cfg, plan, "pdrig:test", RUN_HOST, model_dir_host=MODEL_HOST)
    assert schema_errors(doc) == []
    m = doc["services"]["mooncake-master"]
    assert m["command"] == ["mooncake_master", "--rpc_port", "50051", "--rpc_address", "0.0.0.0",
                            "--enable_http_metadata_server=true", "--http_metadata_server_host",
                            "0.0.0.0", "--http_metadata_server_port", "8080", "--metrics_port", "9003",
                            "--metrics_host=0.0.0.0"]
    assert "depends_on" not in m and "deploy" not in m
    assert m["volumes"] == [{"type": "bind", "source": RUN_HOST, "target": plan.run_dir}]
    assert "http://127.0.0.1:9003/health" in m["healthcheck"]["test"][3]
    assert "('mooncake-master', 50051)" in m["healthcheck"]["test"][3]
    env = doc["services"]["decode"]["environment"]
    assert env["VLLM_HOST_IP"] == env["MC_TCP_BIND_ADDRESS"] == "decode"  # advertised to peers
    assert env["MOONCAKE_CONFIG_PATH"] == f"{plan.run_dir}/mooncake/decode.json"
    assert env["MC_MIN_RPC_PORT"] == "8582"
    for name in ("prefill", "decode", "decode-6blk", "decode-nospec"):
        assert doc["services"][name]["depends_on"]["mooncake-master"] == {"condition": "service_healthy"}
    files = compose.container_files(cfg, plan, RUN_HOST)
    assert list(files) == [f"{RUN_HOST}/mooncake/decode.json"]
    assert json.loads(files[f"{RUN_HOST}/mooncake/decode.json"]) == {
        "metadata_server": "http://mooncake-master:8080/metadata",
        "master_server_address": "mooncake-master:50051"}


def test_argument_errors():
    cfg, plan, _ = render("cpu-tiny")
    with pytest.raises(ValueError, match="must be absolute"):
        compose.render_compose(cfg, plan, "img", "runs/r1", model_dir_host=MODEL_HOST)
    with pytest.raises(ValueError, match="pass model_dir_host"):
        compose.render_compose(cfg, plan, "img", RUN_HOST)
    host_plan = dataclasses.replace(plan, run_dir="runs/r1")
    with pytest.raises(ValueError, match="must be absolute"):
        compose.render_compose(cfg, host_plan, "img", RUN_HOST, model_dir_host=MODEL_HOST)


def test_hf_cache_bind_when_given():
    cfg = load_config(ROOT / "configs" / "l4x2.yaml")
    doc = compose.render_compose(cfg, compose.container_plan(cfg), "img", RUN_HOST, hf_cache_host="/data/hf")
    assert {"type": "bind", "source": "/data/hf", "target": compose.CONTAINER_HF_CACHE} in \
        doc["services"]["decode"]["volumes"]
    assert "volumes" not in doc and schema_errors(doc) == []



def test_container_plan_uses_the_images_master_binary(monkeypatch):
    cfg = load_config(ROOT / "configs" / "cpu-tiny-mooncake.yaml")
    monkeypatch.setattr("rig.cluster.mooncake.find_master_binary", lambda venv=None: "/host/venv/mooncake_master")
    plan = compose.container_plan(cfg)
    # Not a binary of the host's venv: the one on the image's PATH.
    assert plan.by_name("mooncake-master").argv[0] == "mooncake_master"
    assert (plan.run_dir, plan.model_path) == ("/rig/run", "/rig/model")
    assert plan.by_name("prefill").argv[0] == "python3"
    own = load_config(ROOT / "configs" / "cpu-tiny-mooncake.yaml", ["mooncake.master_binary=/opt/mc/mooncake_master"])
    assert compose.container_plan(own).by_name("mooncake-master").argv[0] == "/opt/mc/mooncake_master"


@pytest.mark.parametrize("profile", ["cpu-tiny", "l4x2", "cpu-tiny-mooncake"])
def test_pdrig_compose_cli_writes_a_valid_file(profile, tmp_path):
    """`pdrig compose` / `make compose` end to end: the CLI path users run, not only the module."""
    from rig import cli
    from rig.run.topology import default_instances

    code = cli.main(["compose", "--config", f"configs/{profile}.yaml", "--set", f"cache_dir={tmp_path / 'cache'}",
                     "--set", f"run_root={tmp_path / 'runs'}"])
    assert code == 0
    run_dir = tmp_path / "runs" / f"compose-{profile}"
    out = run_dir / "docker-compose.yml"  # into the run directory, not the repository root
    doc = yaml.safe_load(out.read_text())
    assert schema_errors(doc) == []
    # one P/D pair (plus the master of a store profile), not every instance of the config
    pair, _ = default_instances(load_config(f"configs/{profile}.yaml"))
    engines = {n for n, svc in doc["services"].items() if svc["labels"]["pdrig.role"] != "mooncake-master"}
    assert engines == set(pair)
    assert (run_dir / "instances").read_text().strip() == ",".join(pair)
    # each log label names a file in that run directory
    assert all(svc["labels"]["pdrig.log"] == f"{run_dir}/logs/{n}.log" for n, svc in doc["services"].items()
               if n in pair)
    published = [p for svc in doc["services"].values() for p in svc.get("ports", [])]
    assert published and all(p["host_ip"] == "127.0.0.1" for p in published)


def test_pdrig_compose_instances_and_output(tmp_path):
    from rig import cli

    out = tmp_path / "elsewhere.yml"
    assert cli.main(["compose", "--instances", "prefill,decode-nospec", "--set", f"cache_dir={tmp_path / 'c'}",
                     "--run-dir", str(tmp_path / "r"), "-o", str(out)]) == 0
    assert set(yaml.safe_load(out.read_text())["services"]) == {"prefill", "decode-nospec"}
    assert not (tmp_path / "r" / "docker-compose.yml").exists()
