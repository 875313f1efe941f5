"""rig.plan.k8s: the plan as Kubernetes manifests, validated offline against the Kubernetes schemas
(kubernetes-validate bundles them), checked against the plan, and compared with golden files.

The golden files tests/data/k8s-cpu-tiny.yaml and tests/data/k8s-h200-2node.yaml are regenerated
with (after a deliberate change to the rendering, then review the diff):

    PYTHONPATH=$PWD .venv/bin/python -m rig.cli k8s -c configs/cpu-tiny.yaml --run-id golden -n pdrig \\
        -o tests/data/k8s-cpu-tiny.yaml
    PYTHONPATH=$PWD .venv/bin/python -m rig.cli k8s -c configs/h200-2node.yaml --run-id golden -n pdrig \\
        -o tests/data/k8s-h200-2node.yaml
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import kubernetes_validate
import pytest
import yaml

from rig.config import ConfigError, load_config
from rig.plan import compose, k8s

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
K8S_VERSION = "1.33"  # a Kubernetes release the bundled schemas cover; any of 1.2x-1.37 works
GOLDEN = {"cpu-tiny": DATA / "k8s-cpu-tiny.yaml", "h200-2node": DATA / "k8s-h200-2node.yaml"}
PROFILES = ["cpu-tiny", "h200-2node", "h200-2gpu", "l4x2"]


def cfg_of(profile: str, overrides: list[str] | None = None):
    return load_config(ROOT / "configs" / f"{profile}.yaml", overrides)


def objects(profile: str, run_id: str = "r1", overrides: list[str] | None = None) -> list[dict]:
    return k8s.render_k8s(cfg_of(profile, overrides), run_id, "pdrig")


def of_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def schema_errors(obj: dict) -> str | None:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{obj['kind']}/{obj['metadata']['name']}: {e.message}"
    return None


@pytest.fixture()
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test: validation must be offline."""
    def refuse(*_a, **_k):
        raise AssertionError("network access during validation")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("profile", PROFILES)
def test_manifests_validate_offline(profile, no_network):
    objs = objects(profile)
    assert [schema_errors(o) for o in objs] == [None] * len(objs)
    # The text form too (what `pdrig k8s | kubectl apply -f -` sends).
    docs = [d for d in yaml.safe_load_all(k8s.k8s_yaml(cfg_of(profile), "r1", "pdrig")) if d]
    assert docs == objs


def test_schema_is_live(no_network):
    pod = of_kind(objects("cpu-tiny"), "Pod")[0]
    pod["spec"]["containers"][0]["bogus"] = 1
    assert "'bogus' was unexpected" in schema_errors(pod)
    svc = of_kind(objects("cpu-tiny"), "Service")[0]
    svc["spec"]["ports"][0]["port"] = "http"  # must be an integer
    assert schema_errors(svc) is not None


def masked(text: str) -> tuple[str, list[dict]]:
    """(header comment, documents) of a manifest stream, the ConfigMap's config text masked: it
    embeds the whole suite, which changes with every scenario edit, and is checked on its own
    (test_job_config_loads_and_attaches_to_the_services)."""
    header = text.split("\n---\n", 1)[0]
    docs = [d for d in yaml.safe_load_all(text) if d]
    for d in docs:
        if d["kind"] == "ConfigMap":
            d["data"]["config.yaml"] = "<masked>"
    return header, docs


@pytest.mark.parametrize("profile", sorted(GOLDEN))
def test_golden(profile):
    text = k8s.k8s_yaml(cfg_of(profile), "golden", "pdrig")
    assert masked(text) == masked(GOLDEN[profile].read_text()), \
        f"rendering changed; if deliberate, regenerate {GOLDEN[profile].name} (module docstring)"


@pytest.mark.parametrize("profile", PROFILES)
def test_pods_mirror_the_plan(profile):
    cfg = cfg_of(profile)
    plan = k8s.k8s_plan(cfg)
    objs = k8s.render_k8s(cfg, "r1", "pdrig")
    pods = {p["metadata"]["labels"]["pdrig/instance"]: p for p in of_kind(objs, "Pod")}
    services = {s["metadata"]["name"]: s for s in of_kind(objs, "Service")}
    assert list(pods) == [p.name for p in plan.processes]
    for spec in plan.processes:
        pod = pods[spec.name]
        c = pod["spec"]["containers"][0]
        assert pod["metadata"]["name"] == f"pdrig-r1-{spec.name}"
        assert pod["spec"]["restartPolicy"] == "Never"
        assert c["command"] == compose.container_argv(spec)
        assert c["command"][c["command"].index("--host") + 1] == "0.0.0.0"
        env = {e["name"]: e.get("value") for e in c["env"]}
        want = compose.container_env(spec, advertised_host=f"pdrig-r1-{spec.name}")
        assert {k: v for k, v in env.items() if k != "HF_TOKEN"} == want
        # The side-channel host is the Service's DNS name, and that Service selects this pod
        # and is headless (DNS answers the pod IP, which the pod can bind), published before ready.
        svc = services[env["VLLM_NIXL_SIDE_CHANNEL_HOST"]]
        assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
        assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == \
            [(spec.port, spec.port), *((p, p) for p in spec.ready_ports)]
        assert {p["containerPort"] for p in c["ports"]} == {spec.port, *spec.ready_ports}
        assert int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) in spec.ready_ports
        limits = c.get("resources", {}).get("limits", {})
        assert limits.get("nvidia.com/gpu") == (str(len(spec.gpu_ids)) if spec.gpu_ids else None)
        probe = c["readinessProbe"]["exec"]["command"]
        assert probe[:2] == ["python3", "-c"] and probe[2] == compose.readiness_code(spec, svc["metadata"]["name"])
        assert "livenessProbe" not in c  # a stalled engine is observed, not restarted


def test_tiny_model_built_per_pod_and_hub_cache_is_a_volume():
    cfg = cfg_of("cpu-tiny")
    pod = of_kind(k8s.render_k8s(cfg, "r1"), "Pod")[0]
    model = pod["spec"]["containers"][0]["command"][pod["spec"]["containers"][0]["command"].index("--model") + 1]
    init = pod["spec"]["initContainers"][0]
    assert init["command"] == ["pdrig", "build-model", "--config", k8s.CONFIG_FILE]
    # The init container's config puts the cache where the engine's --model points.
    cm = yaml.safe_load(of_kind(k8s.render_k8s(cfg, "r1"), "ConfigMap")[0]["data"]["config.yaml"])
    assert model == f"{cm['cache_dir']}/models/tiny-qwen3-{cfg.model.tiny.cache_key()}"
    assert {"name": "model-cache", "mountPath": k8s.CACHE_DIR} in init["volumeMounts"]
    assert {"name": "model-cache", "emptyDir": {}} in pod["spec"]["volumes"]
    hub = of_kind(objects("h200-2node"), "Pod")[0]
    mounts = hub["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "model-cache", "mountPath": compose.CONTAINER_HF_CACHE} in mounts
    assert any(v["name"] == "model-cache" and "hostPath" in v for v in hub["spec"]["volumes"])
    claim = of_kind(objects("h200-2node", overrides=["kubernetes.model_cache_claim=hf"]), "Pod")[0]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf"}} in claim["spec"]["volumes"]
    assert "initContainers" not in hub["spec"]


# --- placement: evaluate the pods' required (anti-)affinity terms like the scheduler does -----

def _matches(term: dict, labels: dict) -> bool:
    return term["labelSelector"]["matchLabels"].items() <= labels.items()


def allowed_on_node(pod: dict, others_on_node: list[dict]) -> bool:
    """Would the scheduler admit ``pod`` next to ``others_on_node`` (one node: every term's
    topologyKey is the hostname)? Required terms only, both directions for anti-affinity."""
    aff = pod["spec"].get("affinity", {})
    for term in aff.get("podAntiAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", []):
        assert term["topologyKey"] == "kubernetes.io/hostname"
        if any(_matches(term, o["metadata"]["labels"]) for o in others_on_node):
            return False
    for o in others_on_node:  # existing pods' anti-affinity is symmetric in the scheduler
        for term in o["spec"].get("affinity", {}).get("podAntiAffinity", {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution", []):
            if _matches(term, pod["metadata"]["labels"]):
                return False
    for term in aff.get("podAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", []):
        assert term["topologyKey"] == "kubernetes.io/hostname"
        if not any(_matches(term, o["metadata"]["labels"]) for o in others_on_node):
            return False
    return True


def role_pods(objs: list[dict], role: str) -> list[dict]:
    return [p for p in of_kind(objs, "Pod") if p["metadata"]["labels"]["pdrig/role"] == role]


def test_spread_puts_prefill_and_decode_on_different_nodes():
    objs = objects("h200-2node")
    assert cfg_of("h200-2node").kubernetes.placement == "spread"
    (p,), decodes = role_pods(objs, "prefill"), role_pods(objs, "decode")
    assert len(decodes) == 3
    for d in decodes:
        assert not allowed_on_node(d, [p]) and not allowed_on_node(p, [d])
        assert allowed_on_node(d, [])  # alone on another node: fine
    assert allowed_on_node(decodes[1], [decodes[0]])  # decodes may share their node
    # Another run's prefill does not repel this run's decode: runs are independent.
    other_p = role_pods(objects("h200-2node", run_id="r2"), "prefill")[0]
    assert allowed_on_node(decodes[0], [other_p])


def test_same_node_keeps_decode_with_its_prefill():
    objs = objects("h200-2node", overrides=["kubernetes.placement=same-node"])
    (p,), decodes = role_pods(objs, "prefill"), role_pods(objs, "decode")
    assert allowed_on_node(p, [])
    for d in decodes:
        assert allowed_on_node(d, [p]) and not allowed_on_node(d, [])
        assert d["spec"]["hostIPC"] is True  # CUDA IPC between the P and D pods
    assert "hostIPC" not in role_pods(objects("h200-2node"), "decode")[0]["spec"]


def test_node_selector_and_extra_resources():
    objs = objects("h200-2node", overrides=['kubernetes.resources={rdma/rdma_shared_device_a: "1"}'])
    for pod in of_kind(objs, "Pod"):
        assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"rdma/rdma_shared_device_a": "1", "nvidia.com/gpu": "1"}
        assert pod["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]


# --- the suite Job ----------------------------------------------------------------------------

def test_job_config_loads_and_attaches_to_the_services(tmp_path):
    objs = objects("cpu-tiny")
    cm = of_kind(objs, "ConfigMap")[0]
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    cfg = load_config(path)
    orig = cfg_of("cpu-tiny")
    # The same topology and scenarios as the rendered profile, run directories on the claim.
    assert cfg.model_dump(exclude={"attach", "run_root", "cache_dir", "suite"}) == \
        orig.model_dump(exclude={"attach", "run_root", "cache_dir", "suite"})
    assert cfg.run_root == k8s.RUNS_DIR
    pods = {p["metadata"]["labels"]["pdrig/instance"]: p for p in of_kind(objs, "Pod")}
    services = {s["metadata"]["name"]: s for s in of_kind(objs, "Service")}
    for name, url in cfg.attach.endpoints.items():
        host, port = url.removeprefix("http://").split(":")
        assert int(port) in [p["port"] for p in services[host]["spec"]["ports"]]
        assert services[host]["spec"]["selector"].items() <= pods[name]["metadata"]["labels"].items()
        sel = cfg.attach.logs[name].kubernetes
        wanted = dict(t.split("=") for t in sel.selector.split(","))
        assert wanted.items() <= pods[name]["metadata"]["labels"].items()  # the log is this pod's
        assert sel.container == pods[name]["spec"]["containers"][0]["name"]
    assert set(cfg.attach.logs) == set(pods)
    assert cfg.attach.connect_s is None  # the pods start with the Job: their first answer takes minutes


def test_job_runs_attach_mode_keeps_its_run_dir_and_may_read_logs():
    objs = objects("cpu-tiny")
    job = of_kind(objs, "Job")[0]
    spec = job["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert c["command"] == ["pdrig", "e2e", "--config", k8s.CONFIG_FILE, "--attach"]
    assert job["spec"]["backoffLimit"] == 0 and spec["restartPolicy"] == "Never"
    runs = next(v for v in spec["volumes"] if v["name"] == "runs")
    claim = of_kind(objs, "PersistentVolumeClaim")[0]
    assert runs["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert {"name": "runs", "mountPath": k8s.RUNS_DIR} in c["volumeMounts"]
    sa = spec["serviceAccountName"]
    binding = of_kind(objs, "RoleBinding")[0]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "pdrig"}]
    role = of_kind(objs, "Role")[0]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert {("pods", "list"), ("pods", "get"), ("pods/log", "get")} <= granted
    # An existing claim replaces the rendered one.
    objs2 = objects("cpu-tiny", overrides=["kubernetes.run_dir_claim=shared-runs"])
    assert of_kind(objs2, "PersistentVolumeClaim") == []
    vol = next(v for v in of_kind(objs2, "Job")[0]["spec"]["template"]["spec"]["volumes"] if v["name"] == "runs")
    assert vol["persistentVolumeClaim"]["claimName"] == "shared-runs"


def test_two_runs_coexist_in_one_namespace():
    a, b = objects("cpu-tiny", "r1"), objects("cpu-tiny", "r2")
    names_a = {(o["kind"], o["metadata"]["name"]) for o in a}
    names_b = {(o["kind"], o["metadata"]["name"]) for o in b}
    assert len(names_a) == len(a) and not names_a & names_b
    assert all(o["metadata"]["labels"]["pdrig/run"] == "r1" for o in a)
    # Every selector of run r1 selects only r1's pods.
    for svc in of_kind(a, "Service"):
        assert svc["spec"]["selector"]["pdrig/run"] == "r1"


def test_refusals():
    with pytest.raises(ConfigError, match="--run-id"):
        k8s.render_k8s(cfg_of("cpu-tiny"), "R_1")
    with pytest.raises(ConfigError, match="NIXL only"):
        k8s.render_k8s(cfg_of("cpu-tiny-mooncake"), "r1")
    with pytest.raises(ConfigError, match="model.source: path"):
        k8s.render_k8s(cfg_of("cpu-tiny", ["model.source=path", "model.path=/m"]), "r1")


def test_dollar_parens_are_escaped():
    cfg = cfg_of("cpu-tiny", ["launch.extra_args=['--x=$(HOME)']", "launch.env={A: '$(B)'}"])
    pod = of_kind(k8s.render_k8s(cfg, "r1"), "Pod")[0]
    c = pod["spec"]["containers"][0]
    assert "--x=$$(HOME)" in c["command"]
    assert {"name": "A", "value": "$$(B)"} in c["env"]


def test_cli_prints_manifests(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rig.cli", "k8s", "-c", "configs/h200-2node.yaml",
                          "--run-id", "golden", "-n", "pdrig"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert masked(out.stdout) == masked(GOLDEN["h200-2node"].read_text())
    assert out.stdout == k8s.k8s_yaml(cfg_of("h200-2node"), "golden", "pdrig")
    bad = subprocess.run([sys.executable, "-m", "rig.cli", "k8s", "--run-id", "Bad"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(ROOT)})
    assert bad.returncode == 2 and "--run-id 'Bad'" in bad.stderr


def test_readiness_probe_passes_exactly_when_the_server_is_ready(tmp_path):
    """The probe's one-liner (shared with Compose) against a fake vLLM server: fails while
    /health answers 503, passes once it is up with the model listed and the side channel open,
    fails for a model the server does not serve."""
    import dataclasses
    import time

    from rig.plan.spec import ProcessSpec
    from tests.helpers.fake_rig import FAKE, free_ports

    port, side = free_ports(2)
    spec = ProcessSpec(name="decode", role="decode", argv=(), env={}, log_path="", host="127.0.0.1",
                       port=port, served_model="tiny", ready_ports=(side,))

    def serve(startup_delay_s: float) -> subprocess.Popen:
        env = {**os.environ, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side),
               "FAKE_VLLM_STARTUP_DELAY": str(startup_delay_s)}
        return subprocess.Popen([sys.executable, str(FAKE), "--port", str(port), "--served-model-name", "tiny"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def probe(s: ProcessSpec) -> int:
        return subprocess.run([sys.executable, "-c", compose.readiness_code(s, "127.0.0.1")],
                              capture_output=True, timeout=30).returncode

    def health() -> int | None:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
        except httpx.HTTPError:
            return None

    server = serve(600)  # listens at once, answers /health 503 for ten minutes
    try:
        deadline = time.monotonic() + 30
        while health() is None:
            assert server.poll() is None and time.monotonic() < deadline, "fake server never listened"
            time.sleep(0.05)
        # listening and not ready before and after the probe: the probe's failure is the 503's
        assert health() == 503
        assert probe(spec) != 0
        assert health() == 503
    finally:
        server.kill()
        server.wait(timeout=10)
    server = serve(0)
    try:
        deadline = time.monotonic() + 30
        while probe(spec) != 0:
            assert time.monotonic() < deadline, "fake server never became ready"
            time.sleep(0.3)
        assert probe(dataclasses.replace(spec, served_model="other-model")) == 1
        assert probe(dataclasses.replace(spec, ready_ports=(free_ports(1)[0],))) != 0  # side channel closed
    finally:
        server.kill()
        server.wait(timeout=10)
