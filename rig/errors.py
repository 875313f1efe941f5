"""Every exception the rig raises on purpose, as one tree (the shape of httpx's ``_exceptions.py``).

Layering: the lowest layer of ``rig``; it imports nothing from the rig, so every layer can raise
these and the command line (rig/cli) can map them to exit codes in one place
(``rig.cli.common.EXIT_CODES``)::

    PdrigError                    anything the rig raises on purpose
    ├── ConfigError               bad input (also a ValueError): a config, --set, flag or file that
    │   │                         cannot be used; refused before a port, directory or server is taken
    │   │                         (exit code 2). The message names the file or field and the fix.
    │   └── InputFileError        a file the rig reads (config, suite, builds file, endpoints.json,
    │                             history.jsonl) that is too big, not UTF-8, not YAML/JSON, has a
    │                             duplicate key, an alias bomb or nesting too deep
    ├── RigError                  the run itself broke (exit code 3): the environment or the rig,
    │   │                         not the system under test
    │   ├── ClusterError          a process could not be started or made ready (also a RuntimeError)
    │   │   ├── PortConflict      a port is reserved by another run or in use (rig/cluster/ports.py)
    │   │   └── ContainerError    a docker command failed or timed out
    │   └── BuildError            a vLLM build's env could not be created (also a RuntimeError)
    └── TransportError            one HTTP exchange with an instance failed; recorded on the hop,
        │                         never an exit code of its own
        ├── HopFailed             the proxy's hop gave no usable answer (rig/proxy.py)
        └── BadStreamChunk        an SSE ``data:`` payload that is not JSON (rig/transport/fast.py)

A scenario that fails is not an exception: it is a verdict (exit code 1, rig/judge).
"""

from __future__ import annotations


class PdrigError(Exception):
    """The root of every exception the rig raises on purpose (the module docstring draws the tree)."""


class ConfigError(PdrigError, ValueError):
    """A config file, override, flag or input file that cannot be used; the message names the
    field (or file) and the fix. Also a ValueError, so pydantic validators and older callers that
    catch ValueError keep working. Exit code 2."""


class InputFileError(ConfigError):
    """A file the rig reads that cannot be used as it is (rig.config.files): ``path`` the file,
    ``line`` the 1-based line of the problem when known (else None)."""

    def __init__(self, message: str, path: str = "", line: int | None = None):
        super().__init__(message)
        self.path = path
        self.line = line


class RigError(PdrigError):
    """The run itself broke (the environment or the rig, not the system under test). Exit code 3."""


class ClusterError(RigError, RuntimeError):
    """A process could not be started or made ready; ``log_tail`` holds its last log lines,
    ``exit_code`` the code it exited with when it exited before it was ready (else None) and
    ``summary`` the message without the log tail (one line, for a verdict's reason)."""

    def __init__(self, message: str, name: str = "", log_tail: str = "", exit_code: int | None = None):
        super().__init__(message + (f"\n--- last lines of {name}'s log ---\n{log_tail}" if log_tail else ""))
        self.name = name
        self.log_tail = log_tail
        self.exit_code = exit_code
        self.summary = message


class ContainerError(ClusterError):
    """A docker command failed or timed out (message: the command and docker's stderr)."""


class BuildError(RigError, RuntimeError):
    """A build could not be created (install failed, a patch did not apply)."""


class TransportError(PdrigError):
    """One HTTP exchange with an instance failed; the rig records it on the hop
    (``rig.transport.records.Hop.failure``) rather than letting it end a run."""
