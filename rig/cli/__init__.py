"""``pdrig``: the command line.

    pdrig e2e   [--config F] [--set k=v ...] [--scenario NAME ...] [--instances a,b] [--build B]   run a suite
    pdrig plan  [--config F] [--set k=v ...] [--json]               print argv/env/ports, start nothing
    pdrig up    [--config F] [--instances a,b]                      start a P/D pair, warm it up, keep it
    pdrig build-model [--config F]                                  build (or find) the tiny model
    pdrig compose [--config F] [--instances a,b] [--run-dir D]       render docker-compose.yml into D
    pdrig config  [--config F] [--set k=v ...] [--explain [PATH]]     the effective config, or its fields
    pdrig k8s   [--config F] [--run-id ID] [-n NS] [-o FILE]        render Kubernetes manifests
    pdrig wave prefix|pressure [--endpoints F | --prefill URL --decode URL] ...   a manual wave
    pdrig proxy [--endpoints F | --prefill URL ... --decode URL ...] [--port 8000]  OpenAI-compatible P/D front
    pdrig build NAME [--builds-dir D]                               create a vLLM build's env (configs/builds.yaml)
    pdrig matrix --builds a,b [--suite edge,lease] [--resume]       the suites on each build; matrix.md
    pdrig matrix --builds a,b --explore RUN_DIR [--explore ...]      an exploration's minimal failures on each build
    pdrig ps    [--config F]                                        this host's live runs (from the port locks)
    pdrig clean [--config F] [--min-age-s S]                        remove what dead runs left (only the rig's own)
    pdrig explore [--config F] [--seed N] [--actions N] [--replay H] [--build B] seeded exploration, findings as YAML

Where each subcommand lives: a module per group, each command its ``add_<command>(sub)`` parser
and its ``cmd_<command>(args)`` handler that calls the layer doing the work:

- :mod:`rig.cli.args` - what they share: ``--config``/``--set``, ``--build``, argument types that
  refuse a bad port, number, count or output path in one line.
- :mod:`rig.cli.run` - ``e2e``, ``explore``.
- :mod:`rig.cli.deploy` - ``plan``, ``config``, ``build-model``, ``up``, ``compose``, ``k8s``, ``schema``.
- :mod:`rig.cli.host` - ``ps``, ``clean``, ``proxy``.
- elsewhere, registered here: ``wave`` (rig/run/wave_cli.py), ``build`` (rig/cluster/builds.py),
  ``matrix`` (rig/run/matrix.py).

A new subcommand: its ``add_<name>`` and ``cmd_<name>`` in the module of its group, one line in
:func:`build_parser`.

Exit codes (:data:`EXIT_CODES`, the classes of rig.errors): 0 all expectations hold; 1 a scenario
failed (FAIL/XPASS/ERROR); 2 bad input (a ConfigError: config, flag or file refused before
anything starts); 3 the run itself broke (a RigError: a server did not start, a port clash, a
build that failed; or a bug of the rig); 130 interrupted. Every refusal and every break is one
line on stderr (``pdrig: ...``), also with ``--quiet``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from rig.cli.args import OneLineParser
from rig.cli.deploy import add_build_model, add_compose, add_config, add_k8s, add_plan, add_schema, add_up, all_schemas
from rig.cli.host import add_clean, add_proxy, add_ps
from rig.cli.run import (
    add_e2e,
    add_explore,
    attach_overrides,
    cmd_e2e,
    cmd_explore,
    fresh_prompt_seeds,
    up_endpoint_flags,
)
from rig.errors import ClusterError, ConfigError, PdrigError, RigError

# What callers and tests import from rig.cli (the handlers live in the group modules).
__all__ = ["EXIT_CODES", "all_schemas", "attach_overrides", "build_parser", "cmd_e2e", "cmd_explore", "exit_code",
           "fresh_prompt_seeds", "main", "up_endpoint_flags"]

# The one mapping of the exception tree (rig/errors.py) to exit codes; the first class that
# matches wins. Anything else that escapes a command is a bug of the rig: 3 as well.
EXIT_CODES: tuple[tuple[type[PdrigError], int], ...] = ((ConfigError, 2), (RigError, 3))
BUG_EXIT_CODE = 3


def exit_code(error: BaseException) -> int:
    """The exit code of ``error`` (:data:`EXIT_CODES`; 3 for anything else)."""
    return next((code for cls, code in EXIT_CODES if isinstance(error, cls)), BUG_EXIT_CODE)


# Subcommands whose parser lives in the module doing the work (name -> module, its add_ function).
# Those modules import the runner, the report and the builds machinery, a few hundred ms: they are
# imported only when their subcommand (or the full help) is asked for, so refusing a bad flag or
# file of another command stays cheap.
ELSEWHERE = {"wave": ("rig.run.wave_cli", "add_wave_parser"),  # `pdrig wave prefix|pressure`
             "build": ("rig.cluster.builds", "add_build_parser"),  # `pdrig build NAME`
             "matrix": ("rig.run.matrix", "add_matrix_parser")}  # `pdrig matrix --builds a,b`


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The argparse parser of ``pdrig`` (subcommands as in the module docstring; a usage error is
    one line and exit code 2, :class:`rig.cli.args.OneLineParser`). With ``argv`` whose first word
    names a subcommand, the parsers of :data:`ELSEWHERE` other than that one are bare names (their
    modules not imported); without ``argv``, every parser is complete (``--help``, the reference)."""
    ap = OneLineParser(prog="pdrig", description="End-to-end test rig for vLLM P/D serving")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for add in (add_e2e, add_explore, add_plan, add_config, add_build_model, add_up, add_ps, add_clean, add_proxy,
                add_schema, add_compose, add_k8s):
        add(sub)
    chosen = argv[0] if argv and not argv[0].startswith("-") else None
    for name, (module, add_name) in ELSEWHERE.items():
        if chosen is None or chosen == name:
            getattr(importlib.import_module(module), add_name)(sub)
        else:
            sub.add_parser(name)  # only its name: `pdrig NAME` builds the real one
    return ap


def _one_line(error: BaseException) -> str:
    """``error``'s message for stderr: its first line (a ClusterError's log tail stays in the run's
    logs and report), or the class name when it has no message."""
    text = getattr(error, "summary", None) if isinstance(error, ClusterError) else None
    text = text or str(error) or type(error).__name__
    return " ".join(text.splitlines()[0].split()) if text.strip() else type(error).__name__


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pdrig`` console script; returns the exit code (module docstring).
    ``PDRIG_TRACEBACK=1`` also prints the traceback of a rig bug."""
    try:
        argv = sys.argv[1:] if argv is None else argv
        args = build_parser(argv).parse_args(argv)
    except SystemExit as e:  # a usage error (one line already printed, code 2) or --help (0)
        return e.code if isinstance(e.code, int) else 2
    from rig.cluster.signals import install_signal_handlers

    install_signal_handlers()
    try:
        return args.func(args)
    except PdrigError as e:
        print(f"pdrig: {_one_line(e)}", file=sys.stderr)
        return exit_code(e)
    except KeyboardInterrupt:
        print("pdrig: interrupted; every server the rig started has been stopped", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `pdrig config --explain | head`: the reader left; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except Exception as e:  # a bug of the rig: one line that says so (the traceback on request)
        if os.environ.get("PDRIG_TRACEBACK"):
            traceback.print_exc()
        where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        at = f" at {os.path.basename(where.filename)}:{where.lineno}" if where else ""
        print(f"pdrig: the rig broke ({type(e).__name__}{at}: {_one_line(e)}); "
              "PDRIG_TRACEBACK=1 prints the traceback", file=sys.stderr)
        return BUG_EXIT_CODE
