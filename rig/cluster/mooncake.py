"""Host probes for the Mooncake store: can this machine run a store topology?

The shared libraries the ``mooncake`` wheel needs but does not ship, where the
``mooncake_master`` binary is, and :func:`preflight`, which refuses a store topology this
machine cannot run before anything starts. The pure pieces (argv, JSON, environment, port
layout) are in rig.connectors.mooncake; the config's own checks in rig.config.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from rig.config import ConfigError, RigConfig
from rig.connectors.mooncake import MASTER_BINARY_NAME

# Shared objects the mooncake wheel needs but does not ship. ``mooncake_master``,
# ``mooncake/store.so`` and ``mooncake/engine.so`` link ``libibverbs.so.1`` directly; it in turn
# needs the two libnl libraries. Without them: "mooncake_master: error while loading shared
# libraries: libibverbs.so.1: cannot open shared object file: No such file or directory" (and
# ``ImportError: libibverbs.so.1: ...`` from ``import mooncake.store``), measured on Debian 12.
REQUIRED_SYSTEM_LIBRARIES: tuple[str, ...] = (
    "libibverbs.so.1",
    "libnl-3.so.200",
    "libnl-route-3.so.200",
)

# Debian/Ubuntu package that provides each library (Debian 12 package names, verified with
# ``apt-get install -y libibverbs1 libnl-3-200 libnl-route-3-200``).
DEBIAN_PACKAGE_FOR_LIBRARY: dict[str, str] = {
    "libibverbs.so.1": "libibverbs1",
    "libnl-3.so.200": "libnl-3-200",
    "libnl-route-3.so.200": "libnl-route-3-200",
}

PIP_INSTALL_HINT = ("pip install mooncake-transfer-engine-non-cuda==0.3.13.post1 msgpack "
                    "(`make setup`; on GPU nodes mooncake-transfer-engine)")


def missing_system_libraries(
    libraries: Iterable[str] = REQUIRED_SYSTEM_LIBRARIES,
) -> list[str]:
    """Names (sonames) of the shared libraries Mooncake needs that the dynamic loader cannot load.

    Each name is ``dlopen``-ed through ``ctypes`` (the same search the loader does for
    ``mooncake_master`` and ``store.so``: ``LD_LIBRARY_PATH``, the ld.so cache, default
    directories); when that fails, ``ldconfig -p`` is not consulted further, since a library
    listed there but not loadable is still unusable. A library whose own dependency is missing
    (``libibverbs.so.1`` without ``libnl-3.so.200``) is reported too. Order follows
    ``libraries``; an empty list means all load. Loading is a side effect only on success and
    harmless for these libraries. Never raises for a missing library.

    Turn the result into an install hint with :func:`describe_missing_libraries`.
    """
    missing = []
    for name in libraries:
        try:
            ctypes.CDLL(name, mode=getattr(os, "RTLD_LOCAL", 0))
        except OSError:
            missing.append(name)
    return missing


def describe_missing_libraries(missing: Sequence[str]) -> str:
    """One-line, human-readable report of :func:`missing_system_libraries`' result.

    Names each missing soname with its Debian package and the ``apt-get`` command that
    installs them all; returns ``""`` when ``missing`` is empty. Unknown names are listed
    without a package.
    """
    if not missing:
        return ""
    parts = []
    packages = []
    for name in missing:
        pkg = DEBIAN_PACKAGE_FOR_LIBRARY.get(name)
        parts.append(f"{name} (Debian package {pkg})" if pkg else name)
        if pkg and pkg not in packages:
            packages.append(pkg)
    text = "Mooncake needs shared libraries that cannot be loaded: " + ", ".join(parts)
    if packages:
        text += f"; install with: apt-get install -y {' '.join(packages)}"
    return text


def _site_packages_candidates(prefix: Path) -> list[Path]:
    """``<prefix>/lib/python3*/site-packages/mooncake`` directories (sorted; none without lib/)."""
    lib = prefix / "lib"
    if not lib.is_dir():
        return []
    return sorted(lib.glob("python3*/site-packages/mooncake"))


def find_master_binary(venv: str | os.PathLike[str] | None = None) -> str | None:
    """Path of the ``mooncake_master`` ELF binary, or ``None`` when Mooncake is not installed.

    Looks, in order, in: ``<venv>/lib/python3*/site-packages/mooncake/`` (when ``venv`` is
    given -- the venv that serves vLLM need not be the rig's interpreter); the ``mooncake``
    package of the running interpreter (located with ``importlib.util.find_spec``, which does
    not import it); ``<venv>/bin`` or ``sys.prefix/bin``; then ``PATH``.

    The ELF inside the package is preferred over ``bin/mooncake_master``: the latter is a
    Python console script (``mooncake.cli``) that ``execv``s the ELF, so the PID stays the
    same but the first one avoids a Python start. Only existing, executable regular files are
    returned. It does not check that the binary's libraries load -- see
    :func:`missing_system_libraries`.
    """
    candidates: list[Path] = []
    prefixes = [Path(venv)] if venv is not None else []
    for prefix in prefixes:
        candidates += [d / MASTER_BINARY_NAME for d in _site_packages_candidates(prefix)]
    if venv is None:
        try:
            spec = importlib.util.find_spec("mooncake")
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            candidates += [Path(p) / MASTER_BINARY_NAME for p in spec.submodule_search_locations]
        prefixes = [Path(sys.prefix)]
    candidates += [p / "bin" / MASTER_BINARY_NAME for p in prefixes]
    for cand in candidates:
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    if venv is None:
        found = shutil.which(MASTER_BINARY_NAME)
        if found:
            return found
    return None


def master_binary(cfg: RigConfig) -> str:
    """The ``mooncake_master`` the plan should start (rig.plan.processes.build_plan's
    ``master_binary``): ``mooncake.master_binary``, else the ELF found by
    :func:`find_master_binary`, else the bare name ``mooncake_master`` (resolved on PATH at
    start; :func:`preflight` refuses a run where it cannot be found, so ``pdrig plan`` still
    works on a machine without Mooncake). Looks at the file system; never raises."""
    return cfg.mooncake.master_binary or find_master_binary() or MASTER_BINARY_NAME


def preflight(cfg: RigConfig) -> None:
    """Refuse, before anything starts, a store topology this machine cannot run.

    Raises :class:`rig.config.ConfigError` naming each missing shared library with its Debian
    package and the apt-get line (:func:`describe_missing_libraries`), or the missing
    ``mooncake_master`` with the pip line. Does nothing when no instance uses a store mode.
    """
    if not cfg.uses_store():
        return
    missing = missing_system_libraries()
    if missing:
        raise ConfigError(describe_missing_libraries(missing) +
                          f" (config {cfg.name!r} uses the Mooncake store)")
    binary = master_binary(cfg)
    found = (os.path.isfile(binary) and os.access(binary, os.X_OK)) if os.sep in binary \
        else shutil.which(binary) is not None
    if not found:
        raise ConfigError(f"mooncake_master not found ({binary!r}; mooncake.master_binary); "
                          f"install it with: {PIP_INSTALL_HINT}")
