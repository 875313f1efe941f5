"""Where an instance's log is read from: the seam between log checks and log locations.

A launched instance writes its log to a file in the run directory; a deployment the rig did not
launch (``--attach``: Docker Compose, Kubernetes, an llm-d install) keeps its logs elsewhere. The
log checks (``no-fatal-log``, ``kv-integrity``) read every instance's log through one
:class:`LogSource`, so they work the same whatever the deployment, and a source that cannot be
read makes those checks "not checked", never ok.

A source is read by *mark*: :meth:`LogSource.mark` returns the current end of the log (a
character offset into the text the source returns), and :meth:`LogSource.since` returns the text
written after a mark. Both return ``None`` when the log cannot be read.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rig.config.deployment import AttachLogConfig


@runtime_checkable
class LogSource(Protocol):
    """One instance's log. Implementations: :class:`FileLog` (launched instances, or a path given
    for an attached one), :class:`ComposeLog` and :class:`KubernetesLog` (attached deployments;
    :func:`attach_log_source` builds them from the config's ``attach.logs``)."""

    @property
    def instance(self) -> str:
        """The instance whose log this is."""
        ...

    def describe(self) -> str:
        """Where the log is read from, for diagnoses ('file runs/x/logs/decode.log')."""
        ...

    def mark(self) -> int | None:
        """The current end of the log as an offset usable with :meth:`since`; None if unreadable."""
        ...

    def since(self, mark: int) -> str | None:
        """The log text written after ``mark`` (decoded UTF-8, errors replaced); None if unreadable."""
        ...


@dataclass(frozen=True)
class FileLog:
    """A log file on this host; marks are byte offsets. A missing file is unreadable (None)."""

    instance: str
    path: str

    def describe(self) -> str:
        """'file <path>'."""
        return f"file {self.path}"

    def mark(self) -> int | None:
        """Size of the file in bytes, or None when it does not exist."""
        try:
            return os.path.getsize(self.path)
        except OSError:
            return None

    def since(self, mark: int) -> str | None:
        """Text from byte ``mark`` to the end, or None when the file cannot be read."""
        try:
            with open(Path(self.path), "rb") as f:
                f.seek(mark)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return None


# Lines the rig itself writes into a launched instance's log (rig.cluster.backends.local): where it
# started the process and where it began stopping it. What vLLM logs after a stop marker is the
# teardown the rig caused (EngineDeadError tracebacks, nanobind "leaked" lines), not a finding.
START_MARKER = "pdrig: starting"
STOP_MARKER = "pdrig: stopping"
_TEARDOWN = re.compile(rf"^{re.escape(STOP_MARKER)} .*?(?=^{re.escape(START_MARKER)} |\Z)", re.M | re.S)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def start_marker(instance: str, pid: int) -> str:
    """The line written into ``instance``'s log right after the rig spawned it (pid ``pid``)."""
    return f"{START_MARKER} {instance} (pid {pid}) at {_now()}\n"


def stop_marker(instance: str, signal_name: str = "SIGTERM") -> str:
    """The line written into ``instance``'s log right before the rig sends it ``signal_name``:
    ``pdrig: stopping decode (SIGTERM) at 2026-11-30T20:01:02+00:00``."""
    return f"{STOP_MARKER} {instance} ({signal_name}) at {_now()}\n"


def owner_stop_line(text: str, instance: str) -> str | None:
    """The last :func:`stop_marker` line for ``instance`` in ``text`` (its owner, a ``pdrig``
    command such as ``pdrig up``, said it was stopping it), stripped; None when there is none.

    An instance found gone by a run that attached to it is then *stopped by its owner*, not dead:
    ``pdrig up`` stops every instance once one of them died, and only that one is the death."""
    prefix = f"{STOP_MARKER} {instance} ("
    hits = [ln.strip() for ln in text.splitlines() if ln.startswith(prefix)]
    return hits[-1] if hits else None


def until_stop_marker(text: str) -> str:
    """``text`` without the teardown the rig caused: each section from a :func:`stop_marker`
    line up to the next :func:`start_marker` line (a restart into the same log) or the end.

    Every log check reads text through :func:`matching_lines`, which applies this cut, so a
    fatal-line scan never reports the shutdown the rig itself asked for.
    """
    return _TEARDOWN.sub("", text) if STOP_MARKER in text else text
class _SnapshotLog:
    """Base of the sources that can only re-read a whole log (``docker compose logs``, the
    Kubernetes pod log API): each :meth:`mark` stores the length of every stream it saw and
    returns the index of that snapshot; :meth:`since` returns each stream's text past its stored
    length. A stream shorter than at the mark (a container restarted, the log rotated) is returned
    whole; a stream new since the mark (another pod) too. Streams are keyed (pod name; one key
    for Compose) so that several replicas' logs growing at once keep their own offsets.
    """

    def _read(self) -> dict[str, str] | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __post_init__(self) -> None:
        self._marks: list[dict[str, int]] = []

    def mark(self) -> int | None:
        """Index of a snapshot of every stream's length; None if the log cannot be read."""
        streams = self._read()
        if streams is None:
            return None
        self._marks.append({k: len(v) for k, v in streams.items()})
        return len(self._marks) - 1

    def since(self, mark: int) -> str | None:
        """Text written to each stream after snapshot ``mark`` (streams in name order); None if the
        log cannot be read. Raises IndexError for a mark this source did not return."""
        then = self._marks[mark]
        streams = self._read()
        if streams is None:
            return None
        parts = []
        for key in sorted(streams):
            text = streams[key]
            start = then.get(key, 0)
            parts.append(text[start:] if len(text) >= start else text)
        return "".join(parts)


@dataclass
class ComposeLog(_SnapshotLog):
    """A Docker Compose service's output, read with
    ``docker compose -f FILE logs --no-color --no-log-prefix SERVICE`` (an argv, never a shell).

    Unreadable (None) when ``docker`` is missing, exits non-zero (no engine, unknown service) or
    takes longer than ``timeout_s``. Marks are per snapshot (see :class:`_SnapshotLog`).
    """

    instance: str
    compose_file: str
    service: str
    docker: str = "docker"
    timeout_s: float = 30.0

    def describe(self) -> str:
        """'docker compose -f FILE logs SERVICE'."""
        return f"docker compose -f {self.compose_file} logs {self.service}"

    def argv(self) -> list[str]:
        """The command that reads the whole log."""
        return [self.docker, "compose", "-f", self.compose_file, "logs", "--no-color",
                "--no-log-prefix", self.service]

    def _read(self) -> dict[str, str] | None:
        try:
            out = subprocess.run(self.argv(), capture_output=True, timeout=self.timeout_s,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode != 0:
            return None
        return {self.service: out.stdout.decode("utf-8", "replace")}


@dataclass
class KubernetesLog(_SnapshotLog):
    """The logs of every pod matching a label selector, through the Kubernetes API (lightkube:
    ``GET /api/v1/namespaces/NS/pods?labelSelector=...`` then ``.../pods/NAME/log``).

    ``client`` is a ``lightkube.Client`` (default: built on first use from the environment:
    in-cluster service account, else ``~/.kube/config``). ``namespace`` None = the client's.
    Unreadable (None) when the API cannot be reached, refuses (RBAC: the reader needs ``get`` and
    ``list`` on ``pods`` and ``get`` on ``pods/log``), or no pod matches.
    """

    instance: str
    selector: str
    namespace: str | None = None
    container: str | None = None
    client: Any = None
    client_factory: Callable[[], Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        _selector_filter(self.selector)  # unsupported selector syntax fails here, not mid-run

    def describe(self) -> str:
        """'kubernetes pods -l SELECTOR in NS (container C)'."""
        return (f"kubernetes pods -l {self.selector} in {self.namespace or 'the current namespace'}"
                + (f" (container {self.container})" if self.container else ""))

    def _client(self) -> Any:
        if self.client is None:
            if self.client_factory is not None:
                self.client = self.client_factory()
            else:
                from lightkube import Client

                self.client = Client()
        return self.client

    def _read(self) -> dict[str, str] | None:
        import httpx2  # lightkube's HTTP client: its transport errors (refused, timeout, DNS)
        from lightkube.core.exceptions import ApiError, ConfigError
        from lightkube.resources.core_v1 import Pod

        try:
            client = self._client()
            pods = sorted(p.metadata.name for p in client.list(
                Pod, namespace=self.namespace, labels=_selector_filter(self.selector)))
            if not pods:
                return None
            return {name: "".join(client.log(name, namespace=self.namespace, container=self.container))
                    for name in pods}
        except (ApiError, ConfigError, httpx2.HTTPError, OSError):
            return None


def _selector_filter(selector: str) -> dict[str, Any]:
    """A ``key=value,key2=value2`` / ``key`` selector as lightkube's ``labels=`` filter.

    Raises ValueError for selector syntax lightkube's dict form cannot carry (``!=``, ``in``).
    """
    out: dict[str, Any] = {}
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        if "!=" in term or " in " in term or " notin " in term:
            raise ValueError(f"label selector term {term!r}: only key=value and key are supported")
        key, _, value = term.partition("=")
        key = key.rstrip("=").strip()
        out[key] = value.lstrip("=").strip() if value else None  # None: the label exists
    return out


def attach_log_source(instance: str, spec: AttachLogConfig) -> LogSource:
    """The :class:`LogSource` an ``attach.logs`` entry (:class:`rig.config.AttachLogConfig`) names."""
    if spec.file is not None:
        return FileLog(instance, spec.file)
    if spec.compose is not None:
        return ComposeLog(instance, spec.compose.file, spec.compose.service)
    k = spec.kubernetes
    assert k is not None  # AttachLogConfig validates that exactly one of the three is given
    return KubernetesLog(instance, k.selector, namespace=k.namespace, container=k.container)


# The patterns the log checks look for (rig.observe.evidence, rig.observe.endpoint_watch), whatever the
# source. Lines that mean an engine is broken even if it still answers /health.
FATAL_PATTERNS = (
    "Cannot get",  # "Cannot get N free blocks from the pool" (vllm/v1/core/block_pool.py)
    "EngineCore encountered a fatal error",
    "EngineDeadError",
    "Traceback (most recent call last)",
    "Segmentation fault",
    "Illegal instruction",
    "core dumped",
    # bug record R12 (vllm PRs #34079, #43828): a negative counter increment kills the API server's
    # output handler (prometheus_client's ValueError, then vllm/v1/engine/async_llm.py's log).
    "Counters can only be incremented by non-negative amounts",
    "AsyncLLM output_handler failed",
    # bug record R14 (vllm #46240, #51786, #52954): a late or duplicate transfer completion trips the
    # scheduler's asserts in _update_from_kv_xfer_finished (vllm/v1/core/sched/scheduler.py,
    # 0.32.0) and EngineCore dies; the traceback quotes the assert's source line.
    "assert req_id in self.requests",
    "assert RequestStatus.is_finished(req.status)",
    # bug record R26 (vllm PR #50558, #51505): D's prompt one token longer than P exported (a router
    # appended P's first token) trips nixl/base_worker.py _apply_prefix_caching's assert (0.32.0).
    "assert num_decode_blocks <= len(prefill_group)",
)


# vLLM's own words when a decode worker read KV blocks the prefill had already released: the
# NIXL lease (kv_lease_duration, 30 s) expired while the request waited on decode. The answer is
# HTTP 200 with tokens computed from stale or reused blocks (measured: a pressure wave on a
# starved 2-core host diverged at token 0 with these lines in prefill's log).
KV_INTEGRITY_PATTERNS = (
    "Potentially invalid KV blocks",  # vllm/.../nixl/pull_worker.py
    "Releasing expired KV blocks",  # vllm/.../nixl/base_worker.py
)


def matching_lines(text: str, patterns: tuple[str, ...]) -> list[str]:
    """Stripped lines of ``text`` containing any of ``patterns`` (substring match), not counting
    the rig's own teardown (:func:`until_stop_marker`)."""
    return [ln.strip() for ln in until_stop_marker(text).splitlines() if any(p in ln for p in patterns)]


# A vLLM log line's prefix: "(EngineCore pid=11661) ERROR 11-30 20:00:07 [core.py:1368] ".
_VLLM_PREFIX = re.compile(r"^(\([\w-]+ pid=\d+\) )?(\w+ \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] )?")


TRACEBACK = "Traceback (most recent call last)"


def _exception_line(lines: list[str], header: int) -> str | None:
    """The line that ends the traceback whose header is ``lines[header]``: the first later line
    whose message, after vLLM's "(Proc pid=N) LEVEL date [file:line] " prefix, is neither
    indented, empty nor a caret marker; None when the log ends first."""
    at = _exception_index(lines, header)
    return None if at is None else lines[at].strip()


def _exception_index(lines: list[str], header: int) -> int | None:
    """The index of :func:`_exception_line` in ``lines``; None when the log ends first."""
    for at in range(header + 1, len(lines)):
        later = lines[at]
        prefix = _VLLM_PREFIX.match(later)  # every group is optional: it always matches
        msg = later[prefix.end():] if prefix else later
        if msg.strip() and not msg[:1].isspace() and not msg.lstrip().startswith("^"):
            return at
    return None


# Python's words between the tracebacks of a chained exception (traceback.py, PEP 3134).
CHAINED = ("During handling of the above exception, another exception occurred:",
           "The above exception was the direct cause of the following exception:")
# How far below a fatal line that names no exception its traceback may start (vLLM logs
# "EngineCore encountered a fatal error." and the traceback on the next line, vllm/v1/engine/core.py).
TRACEBACK_WITHIN_LINES = 3


def _message(line: str) -> str:
    """``line`` without vLLM's "(Proc pid=N) LEVEL date [file:line] " prefix, stripped."""
    prefix = _VLLM_PREFIX.match(line)
    return (line[prefix.end():] if prefix else line).strip()


def final_exception(lines: list[str], start: int) -> str | None:
    """The exception that ended the traceback at or just below ``lines[start]`` (its header at most
    :data:`TRACEBACK_WITHIN_LINES` lines further), without vLLM's log prefix: for a chained
    traceback (:data:`CHAINED`) the last exception of the chain, e.g. "TimeoutError: RPC call to
    sample_tokens timed out." below "EngineCore encountered a fatal error.". None when no
    traceback starts there or the log ends inside it."""
    header = next((i for i in range(start, min(start + 1 + TRACEBACK_WITHIN_LINES, len(lines)))
                   if TRACEBACK in lines[i]), None)
    last = None
    while header is not None:
        at = _exception_index(lines, header)
        if at is None:
            return last
        last = _message(lines[at])
        # The chain goes on when the next message lines are Python's chaining words and a new header.
        rest = [i for i in range(at + 1, min(at + 6, len(lines))) if _message(lines[i])]
        if len(rest) >= 2 and _message(lines[rest[0]]) in CHAINED and TRACEBACK in lines[rest[1]]:
            header = rest[1]
        else:
            header = None
    return last


def death_summary(text: str, patterns: tuple[str, ...]) -> str | None:
    """What ended an instance, from its log ``text``: the exception that ended the traceback of its
    first fatal line (:func:`final_exception`) followed by that line, ``"<exception> (first fatal
    line: <line>)"``; ``"<exception> (logged by <vLLM's log prefix>)"`` when the first fatal line is
    that exception (a traceback header's, :func:`first_fatal_line`); the line alone when no
    traceback follows it; None when no line matches ``patterns``. "EngineCore encountered a
    fatal error" alone reads like a vLLM crash whatever the cause (an RPC timeout on a busy host, an
    assert of the connector), so the exception comes first."""
    lines = until_stop_marker(text).splitlines()
    found = _first_fatal(lines, patterns)
    if found is None:
        return None
    i, line = found
    exc = final_exception(lines, i)
    if exc is None:
        return line
    if line.endswith(exc):  # the first fatal line is that exception (a traceback header's)
        where = line[:len(line) - len(exc)].strip()
        return f"{exc} (logged by {where})" if where else exc
    return f"{exc} (first fatal line: {line})"


def first_fatal_line(text: str, patterns: tuple[str, ...]) -> str | None:
    """The first line of ``text`` matching ``patterns``, stripped; None when no line matches.

    A Python traceback header ("Traceback (most recent call last):") names nothing, so for it
    the exception line that ends that traceback is returned instead (:func:`_exception_line`), and a
    fatal line directly followed by a traceback gets `` -> <exception line>`` appended,
    e.g. "(Worker pid=11739) ERROR ... TypeError: Cannot inspect kernel parameters for
    function" in tests/data/vllm-0.30.0-decode-ngram-crash.log. The rig's own teardown is
    left out (:func:`until_stop_marker`).
    """
    lines = until_stop_marker(text).splitlines()
    found = _first_fatal(lines, patterns)
    if found is None:
        return None
    i, line = found
    # "EngineCore encountered a fatal error." (logger.exception, vllm/v1/engine/core.py) is
    # followed by its traceback: the exception that ended it is named too.
    if TRACEBACK not in lines[i] and i + 1 < len(lines) and TRACEBACK in lines[i + 1]:
        exc = _exception_line(lines, i + 1)
        return f"{line} -> {exc}" if exc else line
    return line


def _first_fatal(lines: list[str], patterns: tuple[str, ...]) -> tuple[int, str] | None:
    """``(index, line)`` of :func:`first_fatal_line` in ``lines``; None when no line matches."""
    for i, ln in enumerate(lines):
        if not any(p in ln for p in patterns):
            continue
        if TRACEBACK not in ln:
            return i, ln.strip()
        return i, _exception_line(lines, i) or ln.strip()
    return None


def fatal_lines(text: str, patterns: tuple[str, ...]) -> list[str]:
    """Like :func:`matching_lines`, but a traceback header carries the exception that ends it:
    ``"<header> -> <exception line>"`` (so a check, or a fault scenario's
    ``expected_survivor_errors``, can tell one traceback from another)."""
    lines = until_stop_marker(text).splitlines()
    out = []
    for i, ln in enumerate(lines):
        if not any(p in ln for p in patterns):
            continue
        exc = _exception_line(lines, i) if TRACEBACK in ln else None
        out.append(ln.strip() + (f" -> {exc}" if exc else ""))
    return out
