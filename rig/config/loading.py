"""Reading a config: the YAML file, its ``suite:`` files, ``--set dotted.path=value`` overrides
(list items by index or by ``name``: ``decode.decode-6blk.port=8300``) and validation into a
:class:`~rig.config.topology.RigConfig`. Every problem becomes one
:class:`~rig.config.base.ConfigError` on one line that names the field and the fix (worded with
rig.config.help). Files are read through :mod:`rig.config.files` (size, UTF-8, duplicate keys,
alias bombs).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rig.config.base import NAME_PATTERN, NAME_RULE, SERVED_NAME_PATTERN, ConfigError
from rig.config.files import MAX_DEPTH, InputFileError, cut, load_yaml, parse_yaml, short
from rig.config.help import did_you_mean, model_at, suite_candidates
from rig.config.topology import RigConfig


def _set_path(data: Any, path: list[str], value: Any, full: str) -> None:
    """Set ``value`` at dotted ``path`` inside nested dicts/lists (lists by index or name)."""
    key = path[0]
    if isinstance(data, list):
        idx = None
        if re.fullmatch(r"\d+", key):
            idx = int(key)
        else:
            idx = next((i for i, x in enumerate(data) if isinstance(x, dict) and x.get("name") == key), None)
        if idx is None or idx >= len(data):
            names = [x["name"] for x in data if isinstance(x, dict) and isinstance(x.get("name"), str)]
            parts = full.split("=", 1)[0].split(".")
            where = ".".join(parts[:parts.index(key)]) if key in parts else "the list"
            raise ConfigError(
                f"--set {full}: {where} has no item {key!r}{did_you_mean(key, names)} "
                f"(items: {', '.join(names) or 'none'}; or an index 0..{len(data) - 1})")
        if len(path) == 1:
            data[idx] = value
        else:
            _set_path(data[idx], path[1:], value, full)
        return
    if not isinstance(data, dict):
        raise ConfigError(f"--set {full}: {key!r} is inside a value that is not a section")
    if len(path) == 1:
        data[key] = value
    else:
        data.setdefault(key, {})
        _set_path(data[key], path[1:], value, full)


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``dotted.path=value`` strings to raw config ``data`` (values parsed as YAML).

    Raises ConfigError for an override without ``=``.
    """
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"--set {ov!r}: expected dotted.path=value, e.g. timeouts.stall_window_s=5")
        path, raw = ov.split("=", 1)
        if path.count(".") >= MAX_DEPTH:
            raise ConfigError(f"--set {short(path)}=...: more than {MAX_DEPTH} levels deep; no rig field is nested "
                              "that deep (pdrig config --explain lists the fields)")
        if not all(part.strip() for part in path.split(".")):
            raise ConfigError(f"--set {ov!r}: {path.strip()!r} is not a dotted field path; "
                              "e.g. --set timeouts.stall_window_s=5")
        try:
            value = parse_yaml(raw, f"--set {cut(ov)}", lines=False)
        except InputFileError as e:
            raise ConfigError(f"{e}; the value is YAML: quote it to give a string, "
                              "e.g. --set 'name=\"a: b\"'") from None
        _set_path(data, path.strip().split("."), value, ov)
    return data


def _format_validation_error(source: str, err: ValidationError, data: dict,
                             overrides: list[str] | None = None) -> str:
    """One line per problem: ``field.path: message (got <value>)`` with list items named where
    possible; a problem in a field a ``--set`` override wrote is attributed to that override."""
    lines = []
    for e in err.errors():
        parts: list[str] = []
        node: Any = data
        for loc in e["loc"]:
            if isinstance(loc, int) and isinstance(node, list) and loc < len(node):
                item = node[loc]
                label = f"[{loc}]" + (f"({cut(str(item['name']), 40)})" if isinstance(item, dict) and "name" in item
                                      else "")
                parts.append(label)
                node = item
            else:
                parts.append(("." if parts else "") + str(loc))
                node = node.get(loc) if isinstance(node, dict) else None
        where = "".join(parts) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        value = e.get("input")
        unknown_key = e["type"] == "extra_forbidden"
        if unknown_key:
            model = model_at(RigConfig, e["loc"][:-1])
            fields = list(model.model_fields) if model else []
            section = ".".join(str(x) for x in e["loc"][:-1] if not isinstance(x, int))
            msg = (f"unknown field {str(e['loc'][-1])!r}{did_you_mean(str(e['loc'][-1]), fields)} "
                   f"(fields of {section or 'the top level'}: {', '.join(fields)}; "
                   f"`pdrig config --explain{' ' + section if section else ''}` describes them)")
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "string_pattern_mismatch":  # the rule in words, not the regular expression
            msg = {NAME_PATTERN: NAME_RULE, SERVED_NAME_PATTERN: "a served model name is 1-200 letters, digits and "
                   "._/:@+- starting with a letter or digit"}.get(str((e.get("ctx") or {}).get("pattern")), msg)
        if isinstance(value, (str, int, float, bool)) and e["type"] not in ("extra_forbidden", "missing"):
            msg += f" (got {short(value)})"
        if e["type"] in ("list_type", "tuple_type") and isinstance(value, (str, int, float)):
            # --set values are YAML: a list is written in brackets, e.g. cpus=[1] or cpus=[0,1]
            msg += f"; write a YAML list, e.g. [{str(value)[:30]}]"
        field_name = str(e["loc"][-1]) if e["loc"] else ""
        origin = next((ov for ov in overrides or [] if ov.split("=", 1)[0].strip().split(".")[-1] == field_name), None)
        if origin is not None:
            advice = "fix the path (the part before =)" if unknown_key else "fix the value or drop that --set"
            lines.append(f"--set {cut(origin)} ({where}): {msg}; {advice}")
        else:
            lines.append(f"{where}: {msg}")
    if len(lines) == 1:
        return f"{source}: invalid config: {lines[0]}"
    return f"{source}: invalid config, {len(lines)} problems: " + "; ".join(lines)


def read_yaml_mapping(p: Path, missing: str, what: str = "config file",
                      fix: str = "give a YAML mapping of fields, as the profiles in configs/") -> dict:
    """The YAML mapping in file ``p`` (configs, builds files), read by
    :func:`rig.config.files.load_yaml`; raises ConfigError with ``missing`` when there is no such
    path, and InputFileError naming the file (``what``) and ``fix`` when it cannot be used."""
    try:
        p.stat()
    except FileNotFoundError:
        raise ConfigError(missing) from None
    except OSError:
        pass  # a name too long, a symlink loop, no permission: load_yaml names the reason
    return load_yaml(p, what, fix, dict)


def _suite_names(p: Path, suites: Any) -> list[str]:
    """The ``suite:`` value as a list of file names; raises ConfigError unless it is a string or a
    list of strings."""
    names = [suites] if isinstance(suites, str) else suites if isinstance(suites, list) else None
    if names is None or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{p}: suite: {short(suites)} is not a suite file; give a path (suite: suites/edge.yaml) "
                          "or a list of paths")
    return names


def load_config(path: str | Path, overrides: list[str] | None = None) -> RigConfig:
    """Read a YAML config, apply ``--set`` overrides, validate.

    Raises ConfigError (file missing, bad YAML, invalid field) with a message naming the field.
    """
    p = Path(path)
    data = read_yaml_mapping(p, f"config file {str(p)!r} not found; the profiles are in configs/ "
                                "(e.g. configs/cpu-tiny.yaml)")
    overrides = overrides or []
    # Overrides of scenarios apply after the suite is read (so they can name its scenarios);
    # all others before (so --set suite=... picks the suite).
    apply_overrides(data, [o for o in overrides if not o.startswith("scenarios.")])
    loaded_all: list = []
    for name in _suite_names(p, data.get("suite") or []):
        candidates = suite_candidates(p, str(name))
        suite = next((c for c in candidates if c.is_file()), None)
        if suite is None:
            raise ConfigError(
                f"{p}: suite: {str(name)!r} not found; looked at {' and '.join(map(str, candidates))}. "
                "suite: is relative to the config file: copy the suite next to your config, give an "
                "absolute path, or override it: --set suite=/path/to/suite.yaml")
        loaded_all += load_yaml(suite, "suite", "a suite file is a YAML list of scenarios "
                                "(as configs/suites/edge.yaml)", list)
    if loaded_all:
        own = data.get("scenarios") or []
        if not isinstance(own, list):
            raise ConfigError(f"{p}: scenarios: {short(own)} is not a list of scenarios; give a YAML list")
        data["scenarios"] = loaded_all + own
    apply_overrides(data, [o for o in overrides if o.startswith("scenarios.")])
    try:
        return RigConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(str(p), e, data, overrides)) from None
