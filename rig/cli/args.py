"""What every subcommand shares: ``--config`` / ``--set``, ``--build``, and argument types that
refuse a bad value in one line before anything starts (exit code 2): :func:`port`,
:func:`finite`, :func:`count`, :func:`output_file`, :func:`output_dir`.

argparse calls a ``type=`` function on the string given and reports its ValueError /
ArgumentTypeError as ``argument --x: <message>``; :class:`OneLineParser` prints that as one line
(not the usage block) so every refusal of the command line reads the same.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from rig.config.files import folder_problem
from rig.config.help import DEFAULT_CONFIG, config_path
from rig.errors import ConfigError

if TYPE_CHECKING:
    from rig.config import RigConfig

PORT_RANGE = (1, 65535)  # TCP ports; 0 would mean "any port" to bind(), which a flag never asks for


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, exit code 2 (argparse's own
    code for them, the rig's for bad input): ``pdrig e2e: argument --minutes: ...; see pdrig e2e -h``."""

    def error(self, message: str) -> NoReturn:
        text = re.sub(r"^argument (\S+?)(/\S+)?: ", r"\1 ", " ".join(message.split()))
        print(f"{self.prog}: {text}; see `{self.prog} -h`", file=sys.stderr)
        sys.exit(2)


def port(text: str) -> int:
    """``type=`` of a TCP port flag: an integer in 1..65535 (a larger one would be taken modulo
    65536 by nothing in the rig, so it is refused, not wrapped)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number; give 1-65535") from None
    if not PORT_RANGE[0] <= value <= PORT_RANGE[1]:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port; give 1-65535")
    return value


def finite(low: float = -math.inf, high: float = math.inf, what: str = "a number") -> Callable[[str], float]:
    """``type=`` of a float flag: a finite number in ``[low, high]`` (NaN passes every comparison,
    so ``--minutes nan`` would otherwise mean "no bound" by accident)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give {what}")
        if not low <= value <= high:
            bound = f">= {low:g}" if high == math.inf else f"<= {high:g}" if low == -math.inf \
                else f"between {low:g} and {high:g}"
            raise argparse.ArgumentTypeError(f"{value:g} is out of range; give {what} {bound}")
        return value
    parse.__name__ = "number"  # argparse names the type in "invalid <name> value"
    return parse


def count(low: int = 0, high: int = 1_000_000, why: str = "") -> Callable[[str], int]:
    """``type=`` of an integer flag bounded by what the rig can do (``why`` names the bound's reason)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range; give {low}..{high:,}"
                                             + (f" ({why})" if why else ""))
        return value
    parse.__name__ = "count"
    return parse


def output_file(path: str, flag: str) -> Path:
    """``path`` as a file the command may write; raises ConfigError naming ``flag`` when it is a
    folder, or its folder does not exist or is not writable. Creates nothing."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; give a file name (e.g. {p / 'out.yaml'})")
    if not p.parent.is_dir():
        raise ConfigError(f"{flag} {path}: folder {p.parent} does not exist; create it or give another path")
    problem = folder_problem(p.parent)
    if problem:
        raise ConfigError(f"{flag} {path}: cannot write there ({problem}); give another path")
    return p


def write_output(path: str | Path, text: str, flag: str, config: str | None = None) -> None:
    """Write ``text`` to ``path`` (given by ``flag``); raises ConfigError naming ``flag`` when
    ``path`` is the ``config`` file the command read (it would be overwritten by its own output) or
    the write fails (``/dev/full``, a read-only file of /proc, a full disk)."""
    p = Path(path)
    try:
        same = config is not None and p.exists() and p.samefile(config)
    except OSError:
        same = False
    if same:
        raise ConfigError(f"{flag} {path}: that is the config this command reads; give another file name")
    try:
        p.write_text(text)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write it ({e.strerror or e}); give another path") from None


def output_dir(path: str | Path, flag: str) -> Path:
    """``path`` as a folder the command may create or write into; raises ConfigError naming
    ``flag`` when it is a file or cannot be created or written (rig.config.files.folder_problem).
    Creates nothing."""
    problem = folder_problem(path)
    if problem:
        raise ConfigError(f"{flag} {path}: {problem}; give a writable folder")
    return Path(path)


def config_args(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` and repeatable ``--set PATH=VALUE``."""
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, type=config_path,
                   help=f"rig config YAML (default {DEFAULT_CONFIG})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="override a config field, e.g. --set timeouts.stall_window_s=5 (repeatable)")


def build_args(p: argparse.ArgumentParser) -> None:
    """``--build NAME``, ``--builds-file``, ``--builds-dir``."""
    p.add_argument("--build", metavar="NAME",
                   help="run on this vLLM build of the builds file (configs/builds.yaml): its env's interpreter "
                        "starts the servers (created first when missing, as `pdrig build NAME`) and its fixes apply")
    p.add_argument("--builds-file", default=None, help="with --build: the builds file (default configs/builds.yaml)")
    p.add_argument("--builds-dir",
                   help="with --build: where build envs live (default $PDRIG_BUILDS_DIR or .cache/builds)")


def on_build(cfg: RigConfig, args: argparse.Namespace) -> RigConfig:
    """``cfg`` on ``--build`` (rig.run.matrix.config_on_build), or ``cfg`` itself without one.
    Raises ConfigError for an unknown build or one whose env cannot be created."""
    if not args.build:
        if args.builds_file or args.builds_dir:
            raise ConfigError("--builds-file / --builds-dir choose where --build comes from: add --build NAME")
        return cfg
    from rig.cluster.builds import DEFAULT_BUILDS_FILE, BuildError
    from rig.run.matrix import config_on_build

    try:
        return config_on_build(cfg, args.build, args.builds_file or DEFAULT_BUILDS_FILE, args.builds_dir)
    except BuildError as e:
        raise ConfigError(f"--build {args.build}: {e}") from None


def check_folders(cfg: RigConfig) -> RigConfig:
    """``cfg`` when its ``run_root``, ``cache_dir`` and ``ports.lock_dir`` are (or can become)
    writable folders; raises ConfigError naming the field otherwise, before any command creates a
    run directory, builds a model or takes a port (rig.config.files.folder_problem). Returns ``cfg``."""
    for field, path in (("run_root", cfg.run_root), ("cache_dir", cfg.cache_dir),
                        ("ports.lock_dir", cfg.ports.lock_dir)):
        problem = folder_problem(path)
        if problem:
            raise ConfigError(f"{field}: {path}: {problem}; set it to a writable folder (--set {field}=DIR)")
    return cfg
