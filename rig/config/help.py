"""Help for people writing configs: nearest valid names, field listings, where suites are.

A leaf module (imports only the file reader rig.config.files): :mod:`rig.config.loading` uses it to word its errors,
``pdrig config --explain`` to list fields. Every function takes the pydantic model class to
inspect, so the models stay in their own modules of :mod:`rig.config`.

- :func:`nearest` - the did-you-mean of every error (difflib's ratio, cutoff 0.6).
- :func:`model_at` - the model class a dotted location points into (lists and optionals unwrapped).
- :func:`explain` - lines "path  type  default  description" from the models' ``Field``\\ s.
- :func:`suite_candidates` / :func:`scenarios_by_suite` - where a ``suite:`` is looked for and
  which scenario names every suite file in a directory defines.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from rig.config.files import load_yaml
from rig.errors import ConfigError

# The repository's own profiles: a copied profile whose relative ``suite:`` is not next to it
# falls back to the suite of the same name here (a clone or an editable install has it).
REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # rig/config/help.py -> repo root
DEFAULT_CONFIG = "configs/cpu-tiny.yaml"  # the CPU default, relative to the repository


def config_path(value: str) -> str:
    """``--config`` as given, except the default: that one names the repository's own
    ``configs/cpu-tiny.yaml`` when the working directory has no ``configs/`` of its own (a user
    running ``.venv/bin/pdrig`` from another directory). Any other missing path stays as given, so
    :func:`rig.config.load_config` names it in its error."""
    if value == DEFAULT_CONFIG and not Path(value).is_file() and (REPO_CONFIGS.parent / value).is_file():
        return str(REPO_CONFIGS.parent / value)
    return value


def nearest(name: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``name`` (difflib ratio >= 0.6), or None when none is close.

    A choice that starts with ``name`` (``kv_lease`` -> ``kv_lease_duration``) wins over the ratio.
    """
    options = sorted(set(choices))
    prefixed = [c for c in options if name and c.startswith(name)]
    if len(prefixed) == 1:
        return prefixed[0]
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the nearest choice, or ``""``."""
    best = nearest(name, choices)
    return f"; did you mean {best!r}?" if best else ""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic model classes inside a field annotation (``X | None``, ``list[X]``, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models_in(arg)
    return out


def model_at(root: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model class whose fields live at ``loc`` below ``root`` (list indices skipped);
    None when ``loc`` leaves the models (a dict, a plain value, an unknown field)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int) or (isinstance(part, str) and part.isdigit()):
            continue
        if model is None or part not in model.model_fields:
            return None
        inner = _models_in(model.model_fields[part].annotation)
        model = inner[0] if inner else None
    return model


def _type_name(annotation: Any) -> str:
    """``int | None``, ``'cpu' | 'cuda'``, ``list[InstanceConfig]`` for a field annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def _default_text(field: Any) -> str:
    if field.default is not PydanticUndefined:
        return repr(field.default)
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:  # factories that take the validated data
            return "(computed)"
        return "(defaults below)" if isinstance(value, BaseModel) else repr(value)
    return "(required)"


def explain(root: type[BaseModel], path: str = "") -> list[str]:
    """Lines describing every field at and below dotted ``path`` of ``root`` (all when ""):
    ``path: type = default`` then the description, indented. Sub-models are expanded in place.

    Raises KeyError naming the unknown part of ``path`` with the nearest valid field.
    """
    given = [p for p in path.split(".") if p] if path else []
    # A list item named as in --set (decode.decode-6blk.cpus, scenarios.0.wave) means the list's
    # item model: the name or index is dropped.
    parts = [p for i, p in enumerate(given)
             if not (i and _is_list_field(root, given[:i]) and (p.isdigit() or i < len(given) - 1)
                     and p not in (model_at(root, given[:i]) or BaseModel).model_fields)]
    path = ".".join(parts)
    model: type[BaseModel] | None = root
    for i, part in enumerate(parts):
        if model is None or part not in model.model_fields:
            fields = list(model.model_fields) if model else []
            raise KeyError(f"{'.'.join(parts[:i + 1])}: no such field{did_you_mean(part, fields)} "
                           f"(fields here: {', '.join(fields) or 'none, it is a value'})")
        if i == len(parts) - 1:
            return _field_lines(path, model.model_fields[part])
        inner = _models_in(model.model_fields[part].annotation)
        model = inner[0] if inner else None
    return ["# list items are addressed by name or index: --set decode.decode-6blk.port=8300",
            *_model_lines(root, "")]


def _is_list_field(root: type[BaseModel], loc: Sequence[str]) -> bool:
    """True when dotted ``loc`` below ``root`` is a field holding a list of models."""
    owner = model_at(root, loc[:-1]) if loc else None
    field = owner.model_fields.get(loc[-1]) if owner else None
    return field is not None and typing.get_origin(field.annotation) is list and bool(_models_in(field.annotation))


def _field_lines(dotted: str, field: Any) -> list[str]:
    lines = [f"{dotted}: {_type_name(field.annotation)} = {_default_text(field)}"]
    if field.description:
        lines.append(f"    {field.description}")
    for sub in _models_in(field.annotation):
        lines += _model_lines(sub, dotted + (".<item>" if typing.get_origin(field.annotation) is list
                                             or list in typing.get_args(field.annotation) else ""))
    return lines


def _model_lines(model: type[BaseModel], prefix: str) -> list[str]:
    lines: list[str] = []
    for name, field in model.model_fields.items():
        lines += _field_lines(f"{prefix}.{name}" if prefix else name, field)
    return lines


def suite_candidates(config_path: Path, suite: str) -> list[Path]:
    """Where ``suite:`` value ``suite`` is looked for, in order: as given when absolute, else
    next to the config file, then in the repository's ``configs/`` (for a copied profile)."""
    s = Path(suite).expanduser()
    if s.is_absolute():
        return [s]
    out = [config_path.parent / s]
    if (REPO_CONFIGS / s).resolve() != out[0].resolve():
        out.append(REPO_CONFIGS / s)
    return out


def scenarios_by_suite(dirs: Iterable[Path]) -> dict[str, list[str]]:
    """``{scenario name: [suite files defining it]}`` over every ``*.yaml`` in ``dirs`` (files
    that do not parse as a list of scenarios are skipped)."""
    out: dict[str, list[str]] = {}
    for d in dirs:
        for f in sorted(Path(d).glob("*.yaml")):
            try:
                items = load_yaml(f, "suite", "", list)
            except ConfigError:  # not a suite (or not readable): it defines no scenario
                continue
            for item in items:
                if isinstance(item, dict) and isinstance(item.get("name"), str):
                    out.setdefault(item["name"], []).append(str(f))
    return out


def unknown_scenarios_message(unknown: list[str], known: Sequence[str], suite_dirs: Iterable[Path]) -> str:
    """The ``--scenario`` error: per unknown name the suite file that has it (with the ``--set
    suite=`` that selects it) or the nearest name in this config, then this config's names."""
    elsewhere = scenarios_by_suite(suite_dirs)
    hints = []
    for name in unknown:
        if name in elsewhere:
            f = Path(elsewhere[name][0])
            hints.append(f"{name!r} is in {f}: add --set suite={f.parent.name}/{f.name}")
        else:
            hints.append(f"{name!r} is in no suite{did_you_mean(name, known)}")
    return (f"--scenario: {'; '.join(hints)}; this config's scenarios: {', '.join(known) or 'none'}")



def _md(text: str) -> str:
    """One Markdown table cell: pipes escaped, newlines folded."""
    return " ".join(str(text).replace("|", "\\|").split())


def reference_rows(root: type[BaseModel], prefix: str = "") -> list[str]:
    """Markdown table rows ``| `path` | type | default | description |`` for every field at and
    below ``root`` (sub-models expanded in place, list items as ``<item>``): the generated
    reference pages (docs/reference/) are these rows, so they cannot drift from the models."""
    rows: list[str] = []
    for name, field in root.model_fields.items():
        dotted = f"{prefix}.{name}" if prefix else name
        rows.append(f"| `{dotted}` | {_md(_type_name(field.annotation))} | {_md(_default_text(field))} | "
                    f"{_md(field.description or '')} |")
        for sub in _models_in(field.annotation):
            listed = typing.get_origin(field.annotation) is list or list in typing.get_args(field.annotation)
            rows += reference_rows(sub, dotted + (".<item>" if listed else ""))
    return rows
