"""Where a topology lives besides the rig's own host processes: its port reservations
(:class:`PortsConfig`, rig/cluster/ports.py), the deployment ``pdrig e2e --attach`` judges
(:class:`AttachConfig`: endpoints and log sources, rig/cluster/logs.py) and how ``pdrig k8s``
renders it (:class:`KubernetesConfig`, rig/plan/k8s.py).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rig.config.base import StrictModel


class PortsConfig(StrictModel):
    """How a run holds its TCP ports (rig/cluster/ports.py): reserved host-wide for the run's life."""

    free: bool = Field(
        False, description="take free ports: every port of the config moved by the smallest offset at "
                           "which all are free (the plan records the ports used); false = exactly the "
                           "configured ports, refused at once when another run holds one")
    lock_dir: str = Field("/tmp/pdrig-ports", description="one flock'ed lock file per reserved port, "
                                                          "shared by every run on the host")


# Kubernetes' own name rules (k8s.io/apimachinery/pkg/util/validation): a DNS-1123 label (namespaces,
# Services, label values' shape), a DNS-1123 subdomain (claims), a label key (optional DNS prefix and
# '/', then a name of 1-63), a resource quantity. Checked here so `pdrig k8s` never renders an object
# `kubectl apply` refuses, nor a string that was meant as something else (`-n '../x; rm -rf /'`).
DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
DNS_SUBDOMAIN = rf"(?=.{{1,253}}$){DNS_LABEL}(\.{DNS_LABEL})*"
LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = rf"({DNS_SUBDOMAIN}/)?{LABEL_NAME}"
QUANTITY = r"\d+(\.\d+)?([KMGTPE]i|[kMGTPE]|m)?"
# A container image reference (registry/name:tag@digest): no whitespace, quote or shell character.
IMAGE_REF = r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}"


def k8s_name_problem(value: str, pattern: str, what: str) -> str | None:
    """Why ``value`` does not fully match Kubernetes name rule ``pattern`` (one of the patterns
    above), worded for ``what`` (e.g. "a namespace is a DNS label: 1-63 ..."), or None."""
    return None if isinstance(value, str) and re.fullmatch(pattern, value) else f"{value!r} is not {what}"


LABEL_WORDS = "a DNS-1123 label (1-63 lowercase letters, digits and '-', a letter or digit at both ends)"
SUBDOMAIN_WORDS = "a DNS-1123 subdomain (labels of lowercase letters, digits and '-' joined by '.', at most 253)"


class KubernetesConfig(StrictModel):
    """How ``pdrig k8s`` renders the plan (rig/plan/k8s.py); ignored everywhere else. Every name
    follows Kubernetes' rule for it (:data:`DNS_LABEL` and the patterns beside it)."""

    placement: Literal["same-node", "spread"] = Field(
        "same-node", description="same-node: decode pods on the node of this run's prefill pod "
                                 "(pod affinity); spread: prefill and decode never share a node "
                                 "(pod anti-affinity), so the KV crosses the network")
    image: str | None = Field(None, description="container image; None = pdrig:cpu / pdrig:gpu (docker/)")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="nodeSelector of every engine pod, e.g. a GPU node label")
    model_cache_claim: str | None = Field(
        None, description="an existing PersistentVolumeClaim holding the Hugging Face cache (hub "
                          "models); ReadWriteMany when placement is spread. None = a hostPath per node")
    model_cache_host_path: str = Field(
        "/var/cache/pdrig/huggingface", description="node directory of the HF cache when no claim is given")
    run_dir_claim: str | None = Field(
        None, description="an existing PersistentVolumeClaim for the Job's run directories; None = "
                          "a claim pdrig-<run id>-runs is rendered")
    run_dir_storage: str = Field("1Gi", description="size of the rendered run-directory claim")
    resources: dict[str, str] = Field(
        default_factory=dict, description="extra resource limits of every engine pod, e.g. "
                                          "{rdma/rdma_shared_device_a: '1'} for RDMA NICs")

    @model_validator(mode="after")
    def _kubernetes_names(self) -> KubernetesConfig:
        checks: list[tuple[str, str | None, str, str]] = [
            ("image", self.image, IMAGE_REF, "an image reference (letters, digits and ._/:@+-)"),
            ("model_cache_claim", self.model_cache_claim, DNS_SUBDOMAIN, SUBDOMAIN_WORDS),
            ("run_dir_claim", self.run_dir_claim, DNS_SUBDOMAIN, SUBDOMAIN_WORDS),
            ("run_dir_storage", self.run_dir_storage, QUANTITY, "a Kubernetes quantity (e.g. 1Gi, 500Mi)")]
        checks += [(f"node_selector key {k!r}", k, LABEL_KEY, "a label key ([prefix/]name)")
                   for k in self.node_selector]
        checks += [(f"node_selector.{k}", v, f"({LABEL_NAME})?", "a label value (at most 63 letters, digits, "
                    "-_.)") for k, v in self.node_selector.items()]
        checks += [(f"resources key {k!r}", k, LABEL_KEY, "a resource name ([prefix/]name)") for k in self.resources]
        checks += [(f"resources.{k}", v, QUANTITY, "a Kubernetes quantity (e.g. 1, 2Gi)")
                   for k, v in self.resources.items()]
        for field, value, pattern, words in checks:
            problem = None if value is None else k8s_name_problem(value, pattern, words)
            if problem:
                raise ValueError(f"{field}: {problem}")
        if not self.model_cache_host_path.startswith("/") or "\0" in self.model_cache_host_path:
            raise ValueError(f"model_cache_host_path: {self.model_cache_host_path!r} is not an absolute path "
                             "of the node")
        return self


class ComposeLogConfig(StrictModel):
    """A Docker Compose service's log (``docker compose -f FILE logs SERVICE``)."""

    file: str = Field("docker-compose.yml", description="the compose file")
    service: str


class KubernetesLogConfig(StrictModel):
    """The logs of the pods a label selector matches (read through the Kubernetes API)."""

    namespace: str | None = Field(None, description="None = the client's namespace (in a pod: its own)")
    selector: str = Field(min_length=1, description="label selector, e.g. 'app=vllm,role=decode'")
    container: str | None = Field(None, description="None = the pod's only container")


class AttachLogConfig(StrictModel):
    """Where one attached instance's log is: exactly one of ``file``, ``compose``, ``kubernetes``."""

    file: str | None = Field(None, description="a log file on the rig's host")
    compose: ComposeLogConfig | None = None
    kubernetes: KubernetesLogConfig | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> AttachLogConfig:
        given = [k for k in ("file", "compose", "kubernetes") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of file, compose, kubernetes (got {given or 'none'})")
        return self


# Seconds an attached endpoint may leave every request unanswered (attach.connect_s): several probes
# (3 s HTTP timeout each, every 0.5 s: rig.cluster.processes), far below a start-up ceiling.
ATTACH_CONNECT_S = 10.0


class AttachConfig(StrictModel):
    """``pdrig e2e --attach``: judge a deployment the rig did not start (rig/cli.py cmd_e2e).

    ``endpoints`` replaces an instance's ``http://host:port`` (default: the config's host and
    port; rig.plan.processes.with_endpoints); ``logs`` says where its log is
    (rig.cluster.logs.attach_log_source). An instance without a log source has its log checks
    "not checked". Both are keyed by instance name and used only with ``--attach``; so is
    ``connect_s`` (rig.cluster.backends.attached).
    """

    endpoints: dict[str, str] = Field(default_factory=dict, description="instance -> http://host:port")
    logs: dict[str, AttachLogConfig] = Field(default_factory=dict, description="instance -> log source")
    connect_s: float | None = Field(
        ATTACH_CONNECT_S, gt=0, allow_inf_nan=False,
        description="seconds an attached endpoint may leave every request unanswered before the start fails "
                    "naming it (a wrong URL, a deployment that is down); one that answers is waited for up to "
                    "timeouts.startup_s. null = wait up to timeouts.startup_s for the first answer too (a "
                    "deployment that starts with the run: the Kubernetes Job)")

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, v: dict[str, str]) -> dict[str, str]:
        for name, url in v.items():
            m = re.fullmatch(r"http://[^/:\s]+:(\d{1,5})/?", url)
            if not m:
                raise ValueError(f"endpoints.{name}: {url!r} is not http://HOST:PORT "
                                 "(e.g. http://10.0.0.5:8200)")
            if not 1 <= int(m.group(1)) <= 65535:
                raise ValueError(f"endpoints.{name}: {url!r}: port {int(m.group(1))} is not a TCP port; give 1-65535")
        return v
