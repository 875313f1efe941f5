"""The plan as Kubernetes manifests (``pdrig k8s``): one Pod and one Service per instance, and a
Job that runs the suite in attach mode inside the cluster.

Like :mod:`rig.plan.compose`, this is a projection of :class:`~rig.plan.processes.Plan` (built by
:func:`rig.plan.compose.container_plan`), not a second source of truth: each engine pod runs the plan's
argv with the plan's environment, through the same container rewrites as Compose
(:func:`rig.plan.compose.container_argv`, :func:`rig.plan.compose.container_env`: bind ``0.0.0.0``,
``CUDA_VISIBLE_DEVICES`` from 0, ``UCX_NET_DEVICES=lo`` -> ``eth0``). What differs:

- ``VLLM_NIXL_SIDE_CHANNEL_HOST`` is the instance's **Service** name ``pdrig-<run>-<instance>``.
  vLLM binds its NIXL handshake listener to that host and advertises it to D as ``remote_host``
  (nixl/base_scheduler.py, pull_scheduler.py), so the name must resolve to the pod's own IP
  inside the pod and from D's pod. The Service is therefore *headless* (``clusterIP: None``: DNS
  answers with the pod IP, not a virtual IP the pod cannot bind) with
  ``publishNotReadyAddresses: true`` (the listener is bound during start-up, before the pod is
  ready). Same namespace, so the short name resolves through the pod's DNS search path.
- Pods, not Deployments: ``restartPolicy: Never``. A crashed engine must fail the run (the
  ``alive`` check), not be hidden by a restart; for the same reason there is no liveness probe.
- The readiness probe is the rig's readiness (:func:`rig.plan.compose.readiness_code`: ``/health``
  200, the served model listed by ``/v1/models``, the side channel accepting connections). A
  probe cannot express the rest of the rig's start-up rules: "exited before ready -> fail at once
  with the log tail" (the pod just turns Failed; the Job waits for ``timeouts.startup_s``), and
  the start-up deadline itself (a probe only retries). Those are enforced by the Job, whose
  attach-mode start waits for every endpoint's readiness within ``timeouts.startup_s``.
- Placement (``kubernetes.placement``): ``spread`` gives every pod a required pod anti-affinity
  against the other role's pods of the same run on one ``kubernetes.io/hostname``, so prefill and
  decode never share a node and the KV crosses the network; ``same-node`` gives decode pods a
  required pod affinity to the run's prefill pod (UCX ``cuda_ipc``/shared memory possible;
  GPU pods then get ``hostIPC``).
- Resources: ``nvidia.com/gpu: len(gpu_ids)``. A GPU cannot be shared between pods this way, so
  a profile that splits one GPU between instances (``gpu_memory_utilization``) gets one GPU per
  pod here. ``cpus`` (CPU pinning) becomes a CPU request and limit of ``len(cpus)``: Kubernetes
  cannot pick CPU numbers; with the kubelet's static CPU manager and Guaranteed pods it gives
  exclusive cores. ``launch.nice`` is not applied.
- The model: a hub model's Hugging Face cache is a volume (``kubernetes.model_cache_claim``, or a
  hostPath per node); the tiny model (CPU default) is built by an init container into the pod's
  own ``emptyDir`` (small; per pod, so concurrent builds never share a directory).
- The Job runs ``pdrig e2e --attach`` with the config from a ConfigMap whose ``attach`` section
  names each Service as endpoint and each pod's log (``kubernetes`` log source: the run's labels,
  read through the API with a ServiceAccount allowed to get pods and their logs). Run
  directories go to a PersistentVolumeClaim mounted at ``/rig/runs``; the verdict table is the
  Job's log.

Every object carries ``pdrig/run: <run id>`` (and names start ``pdrig-<run id>-``), so several runs
coexist in one namespace and ``kubectl delete all,cm,sa,role,rolebinding,pvc -l pdrig/run=ID``
removes one. Store modes (Mooncake) are refused: their master and connector files are not rendered.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from rig.config import ConfigError, RigConfig
from rig.plan import compose
from rig.plan.processes import build_plan
from rig.plan.spec import Plan, ProcessSpec

CONFIG_DIR = "/rig/config"  # the ConfigMap with the Job's config (and the tiny model's recipe)
CONFIG_FILE = f"{CONFIG_DIR}/config.yaml"
RUNS_DIR = "/rig/runs"  # the run-directory claim, in the Job's pod
CACHE_DIR = "/rig/cache"  # the tiny model's emptyDir in an engine pod (config cache_dir)
ENGINE_CONTAINER = "vllm"
RUN_ID_PATTERN = r"[a-z0-9]([a-z0-9-]{0,18}[a-z0-9])?"
LABEL_RUN, LABEL_ROLE, LABEL_INSTANCE = "pdrig/run", "pdrig/role", "pdrig/instance"
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"


def name_of(run_id: str, instance: str) -> str:
    """``pdrig-<run id>-<instance>``: the pod and the Service of an instance (a DNS-1035 label)."""
    return f"pdrig-{run_id}-{instance}"


def k8s_plan(cfg: RigConfig) -> Plan:
    """The plan as the pods see it: :func:`rig.plan.compose.container_plan`, except that the tiny model
    lives under the pod's ``CACHE_DIR`` (where its init container builds it).

    Raises ConfigError for what this renderer does not cover: store modes, ``model.source: path``.
    """
    modes = {i.connector or cfg.connector for _, i in cfg.instances()}
    if modes != {"nixl"}:
        raise ConfigError(f"connector {sorted(modes)}: pdrig k8s renders NIXL only (the Mooncake "
                          "master and store files are not rendered); use connector: nixl")
    if cfg.model.source == "path":
        raise ConfigError("model.source: path names a directory on this host, which pods cannot "
                          "see; use model.source: hub (or tiny) for pdrig k8s")
    if cfg.model.source == "hub":
        return compose.container_plan(cfg)
    model = f"{CACHE_DIR}/models/tiny-qwen3-{cfg.model.tiny.cache_key()}"  # rig.run.runner.resolve_model
    return build_plan(cfg, compose.CONTAINER_RUN_DIR, model, compose.CONTAINER_PYTHON)


def _labels(run_id: str, role: str | None = None, instance: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "pdrig", "app.kubernetes.io/part-of": f"pdrig-{run_id}",
           LABEL_RUN: run_id}
    if role:
        out[LABEL_ROLE] = role
    if instance:
        out[LABEL_INSTANCE] = instance
    return out


def _meta(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels}


def _esc(value: str) -> str:
    """Kubernetes expands ``$(VAR)`` in command and env values; ``$$(`` is a literal ``$(``."""
    return value.replace("$(", "$$(")


def affinity(placement: str, run_id: str, role: str) -> dict[str, Any] | None:
    """The pod (anti-)affinity of a ``role`` pod for ``placement`` (module docstring); None when
    the pod needs none (the prefill pods of a same-node run: the decode pods follow them)."""
    def term(other: str) -> dict[str, Any]:
        return {"labelSelector": {"matchLabels": {LABEL_RUN: run_id, LABEL_ROLE: other}},
                "topologyKey": HOSTNAME_TOPOLOGY}

    other = "decode" if role == "prefill" else "prefill"
    if placement == "spread":
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term(other)]}}
    if role == "decode":
        return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("prefill")]}}
    return None


def _engine_volumes(cfg: RigConfig, configmap: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of an engine pod: /dev/shm, and the model (HF cache or tiny emptyDir)."""
    k = cfg.kubernetes
    # vLLM's shared-memory queues; the container runtime's default /dev/shm is 64 MiB.
    volumes: list[dict[str, Any]] = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}]
    mounts: list[dict[str, Any]] = [{"name": "shm", "mountPath": "/dev/shm"}]
    if cfg.model.source == "hub":
        src = ({"persistentVolumeClaim": {"claimName": k.model_cache_claim}} if k.model_cache_claim
               else {"hostPath": {"path": k.model_cache_host_path, "type": "DirectoryOrCreate"}})
        volumes.append({"name": "model-cache", **src})
        mounts.append({"name": "model-cache", "mountPath": compose.CONTAINER_HF_CACHE})
    else:
        volumes += [{"name": "model-cache", "emptyDir": {}},
                    {"name": "config", "configMap": {"name": configmap}}]  # the init container's recipe
        mounts.append({"name": "model-cache", "mountPath": CACHE_DIR})
    return volumes, mounts


def engine_pod(cfg: RigConfig, spec: ProcessSpec, run_id: str, namespace: str, image: str,
               configmap: str) -> dict[str, Any]:
    """The Pod of one instance (module docstring for every choice)."""
    k = cfg.kubernetes
    service = name_of(run_id, spec.name)
    env = compose.container_env(spec, advertised_host=service)
    env_list: list[dict[str, Any]] = [{"name": k_, "value": _esc(v)} for k_, v in env.items()]
    if cfg.model.source == "hub" and "HF_TOKEN" not in env:
        # From an optional Secret (kubectl create secret generic hf-token --from-literal=token=...),
        # never written into the manifest.
        env_list.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": "hf-token", "key": "token", "optional": True}}})
    limits: dict[str, str] = dict(k.resources)
    if spec.gpu_ids:
        limits["nvidia.com/gpu"] = str(len(spec.gpu_ids))
    if spec.cpus:
        limits["cpu"] = str(len(spec.cpus))
    volumes, mounts = _engine_volumes(cfg, configmap)
    container: dict[str, Any] = {
        "name": ENGINE_CONTAINER,
        "image": image,
        "command": [_esc(a) for a in compose.container_argv(spec)],
        "env": env_list,
        "ports": [{"name": "http", "containerPort": spec.port, "protocol": "TCP"},
                  *({"name": f"nixl-{i}" if i else "nixl", "containerPort": p, "protocol": "TCP"}
                    for i, p in enumerate(spec.ready_ports))],
        "readinessProbe": {
            "exec": {"command": ["python3", "-c", compose.readiness_code(spec, service)]},
            "periodSeconds": 5, "timeoutSeconds": 10, "failureThreshold": 3},
        "volumeMounts": mounts,
    }
    if limits:
        # Requests default to limits: Guaranteed QoS when only cpu / devices are given.
        container["resources"] = {"limits": limits}
    if spec.gpu_ids:
        # RDMA memory registration (UCX rc/ib) needs to lock memory; no ulimit knob in a pod spec.
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # No <SERVICE>_PORT variables: vLLM reads VLLM_* variables, and a Service named vllm
        # would inject VLLM_PORT (a known vLLM start-up failure on Kubernetes).
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": int(cfg.timeouts.shutdown_grace_s),
        "containers": [container],
        "volumes": volumes,
    }
    if cfg.model.source != "hub":
        pod_spec["initContainers"] = [{
            "name": "build-model", "image": image,
            "command": ["pdrig", "build-model", "--config", CONFIG_FILE],
            "volumeMounts": [{"name": "model-cache", "mountPath": CACHE_DIR},
                             {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]}]
    aff = affinity(k.placement, run_id, spec.role)
    if aff:
        pod_spec["affinity"] = aff
    if k.node_selector:
        pod_spec["nodeSelector"] = dict(k.node_selector)
    if spec.gpu_ids and k.placement == "same-node":
        pod_spec["hostIPC"] = True  # CUDA IPC (UCX cuda_ipc) between P and D pods on one node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _meta(service, namespace, _labels(run_id, spec.role, spec.name)),
            "spec": pod_spec}


def engine_service(spec: ProcessSpec, run_id: str, namespace: str) -> dict[str, Any]:
    """The headless Service of one instance: HTTP and NIXL side-channel ports, DNS -> pod IP."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(name_of(run_id, spec.name), namespace, _labels(run_id, spec.role, spec.name)),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {LABEL_RUN: run_id, LABEL_INSTANCE: spec.name},
                     "ports": [{"name": "http", "port": spec.port, "targetPort": spec.port, "protocol": "TCP"},
                               *({"name": f"nixl-{i}" if i else "nixl", "port": p, "targetPort": p,
                                  "protocol": "TCP"} for i, p in enumerate(spec.ready_ports))]}}


def job_config(cfg: RigConfig, plan: Plan, run_id: str) -> dict[str, Any]:
    """The config the Job (and the tiny model's init containers) read from the ConfigMap: the
    config with its suite inlined, run directories on the claim, and ``attach`` naming each
    instance's Service as endpoint and its pod's log as log source; the first answer of each is
    waited for up to ``timeouts.startup_s`` (``attach.connect_s: null``)."""
    data = cfg.model_dump(mode="json", exclude_defaults=True)
    data.pop("suite", None)  # scenarios are already inlined by load_config
    data["run_root"], data["cache_dir"] = RUNS_DIR, CACHE_DIR
    data["attach"] = {
        "endpoints": {p.name: f"http://{name_of(run_id, p.name)}:{p.port}" for p in plan.processes},
        "logs": {p.name: {"kubernetes": {"selector": f"{LABEL_RUN}={run_id},{LABEL_INSTANCE}={p.name}",
                                         "container": ENGINE_CONTAINER}} for p in plan.processes},
        # The pods start with the Job: an engine answers no request until it has started (minutes).
        "connect_s": None}
    return data


def _rbac(run_id: str, namespace: str) -> list[dict[str, Any]]:
    """ServiceAccount + Role + RoleBinding letting the Job read its pods' logs (KubernetesLog)."""
    name = f"pdrig-{run_id}-reader"
    labels = _labels(run_id)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, namespace, labels)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, namespace, labels),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                   {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(name, namespace, labels),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]


def suite_job(cfg: RigConfig, run_id: str, namespace: str, image: str, configmap: str,
              claim: str) -> dict[str, Any]:
    """The Job running ``pdrig e2e --attach`` once (``backoffLimit: 0``: a failed suite is a
    result, not something to retry); its log ends with the verdict table, its run directory is on
    ``claim`` under ``/rig/runs``."""
    name = f"pdrig-{run_id}-suite"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, namespace, _labels(run_id, "suite")),
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"labels": _labels(run_id, "suite")},
                "spec": {"restartPolicy": "Never", "serviceAccountName": f"pdrig-{run_id}-reader",
                         "enableServiceLinks": False,
                         "containers": [{"name": "pdrig", "image": image,
                                         "command": ["pdrig", "e2e", "--config", CONFIG_FILE, "--attach"],
                                         "volumeMounts": [{"name": "runs", "mountPath": RUNS_DIR},
                                                          {"name": "config", "mountPath": CONFIG_DIR,
                                                           "readOnly": True}]}],
                         "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": claim}},
                                     {"name": "config", "configMap": {"name": configmap}}]}}}}


def render_k8s(cfg: RigConfig, run_id: str, namespace: str = "default", image: str | None = None) -> list[dict]:
    """Every object of one run, in apply order: ConfigMap, run-directory claim (unless
    ``kubernetes.run_dir_claim``), RBAC, per instance a Service and a Pod, the Job.

    ``image`` None = ``kubernetes.image``, else ``pdrig:gpu`` / ``pdrig:cpu`` (docker/README.md).
    Raises ConfigError for a run id that is not ``RUN_ID_PATTERN`` (lower-case letters, digits,
    '-', at most 20 characters, so every name stays a 63-character DNS label) and what
    :func:`k8s_plan` refuses.
    """
    if not re.fullmatch(RUN_ID_PATTERN, run_id):
        raise ConfigError(f"--run-id {run_id!r}: use 1-20 lower-case letters, digits or '-' "
                          "(not at either end), e.g. --run-id r1")
    plan = k8s_plan(cfg)
    image = image or cfg.kubernetes.image or ("pdrig:gpu" if cfg.device == "cuda" else "pdrig:cpu")
    configmap = f"pdrig-{run_id}-config"
    config_text = yaml.safe_dump(job_config(cfg, plan, run_id), sort_keys=False)
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(configmap, namespace, _labels(run_id)),
         "data": {"config.yaml": config_text}}]
    claim = cfg.kubernetes.run_dir_claim or f"pdrig-{run_id}-runs"
    if not cfg.kubernetes.run_dir_claim:
        objects.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": _meta(claim, namespace, _labels(run_id)),
                        "spec": {"accessModes": ["ReadWriteOnce"],
                                 "resources": {"requests": {"storage": cfg.kubernetes.run_dir_storage}}}})
    objects += _rbac(run_id, namespace)
    for spec in plan.processes:
        objects.append(engine_service(spec, run_id, namespace))
        objects.append(engine_pod(cfg, spec, run_id, namespace, image, configmap))
    objects.append(suite_job(cfg, run_id, namespace, image, configmap, claim))
    return objects


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, with multi-line strings (the ConfigMap's config) as ``|`` blocks."""


_Dumper.add_representer(str, lambda d, v: d.represent_scalar(
    "tag:yaml.org,2002:str", v, style="|" if "\n" in v else None))


HEADER = """\
# Generated by pdrig (rig/plan/k8s.py) from the plan of config {name!r}, run id {run_id!r}. Do not edit;
# re-render. Apply: kubectl apply -f THIS; the verdict: kubectl logs -f job/pdrig-{run_id}-suite;
# clean up: kubectl delete all,cm,sa,role,rolebinding,pvc -l pdrig/run={run_id}
# VLLM_NIXL_SIDE_CHANNEL_HOST is each instance's headless Service: P advertises it to D as remote_host.
"""


def k8s_yaml(cfg: RigConfig, run_id: str, namespace: str = "default", image: str | None = None) -> str:
    """:func:`render_k8s` as a multi-document YAML stream with a header (same errors)."""
    docs = render_k8s(cfg, run_id, namespace, image)
    body = yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=1_000_000, default_flow_style=False)
    return HEADER.format(name=cfg.name, run_id=run_id) + "---\n" + body
