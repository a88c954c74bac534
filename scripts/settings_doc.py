"""Print ``docs/settings.md``, generated from the settings' models (``service.settings``): one table per group in
``Settings``' order (the variable, its command-line flag where ``python -m service`` has one, the default, the values
it takes and the field's description), then the deprecated names and what replaced them.

    python scripts/settings_doc.py > docs/settings.md
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from service.cli import build_parser
from service.settings import Settings
from service.settings_env import PREFIX, REMOVED, RENAMED, env_name, replacement

COMMAND = "python scripts/settings_doc.py > docs/settings.md"

INTRO = f"""# Service settings

<!-- generated from service/settings.py by `{COMMAND}`: edit the field descriptions, not this page -->

Every setting is an environment variable. The server's own (its address, ports, models, device, processes and
logging) are top-level, `CALIB_<NAME>`; every other setting belongs to a group by concern,
`CALIB_<GROUP>__<NAME>` (a double underscore), and a whole group can also be given as a JSON object in
`CALIB_<GROUP>`. The flags of `python -m service` (shown in brackets) override the environment. Invalid settings
stop the service before it loads anything: it prints the fields at fault and exits with status 2. The names of the
previous release are still accepted, with a warning, until the next one ([deprecated names](#deprecated-names)).
"""


def _flags() -> dict[str, str]:
    """The command-line flag of each top-level field that ``python -m service`` has one for."""
    return {
        action.dest: action.option_strings[0]
        for action in build_parser()._actions
        if action.dest in Settings.model_fields and action.option_strings
    }


def _cell(text: str) -> str:
    """Text for a table cell: code in single backticks, links to the other docs, no unescaped ``|``."""
    text = re.sub(r"\s+", " ", text.replace("``", "`")).strip().replace("|", "\\|")
    return re.sub(r"\bdocs/([\w/.-]+\.md)\b", r"[\1](\1)", text)


def _code(text: str) -> str:
    """``text`` with its dotted names of modules and constants as code."""
    return re.sub(r"\b(service(?:\.\w+)+)", r"`\1`", text)


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _bounds(metadata: list[Any], kind: str) -> str:
    low = high = ""
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            low = f"[{item.ge}"
        elif isinstance(item, annotated_types.Gt):
            low = f"({item.gt}"
        elif isinstance(item, annotated_types.Le):
            high = f"{item.le}]"
        elif isinstance(item, annotated_types.Lt):
            high = f"{item.lt})"
    if low and high:
        return f"{kind} in {low}, {high}"
    if low:
        return f"{kind} {'≥' if low[0] == '[' else '>'} {low[1:]}"
    if high:
        return f"{kind} {'≤' if high[-1] == ']' else '<'} {high[:-1]}"
    return kind


def _values(annotation: Any, metadata: list[Any]) -> str:
    """The values a field takes: its choices, or its kind with its bounds."""
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *more = get_args(annotation)
        return _values(inner, [*metadata, *(m for item in more for m in getattr(item, "metadata", [item]))])
    if origin in (Union, types.UnionType):
        shown = [_values(arg, metadata) for arg in get_args(annotation) if arg is not type(None)]
        return ", ".join(shown)
    if origin is Literal:
        return ", ".join(f"`{choice}`" for choice in get_args(annotation))
    kinds = {bool: "`true`, `false`", int: "integer", float: "number", str: "text", Path: "path"}
    if annotation is SecretStr:
        return "`name:token,...` (secret)"
    return _bounds(metadata, kinds.get(annotation, getattr(annotation, "__name__", str(annotation))))


def _attributes(cls: type) -> dict[str, str]:
    """The ``Attributes:`` section of a dataclass's docstring, by attribute."""
    found: dict[str, str] = {}
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    start = lines.index("Attributes:") + 1 if "Attributes:" in lines else len(lines)
    name = None
    for line in lines[start:]:
        if match := re.match(r"^ {4}(\w+): (.*)$", line):
            name = match.group(1)
            found[name] = match.group(2)
        elif name is not None and line.startswith(" " * 8):
            found[name] += " " + line.strip()
        else:
            name = None
    return found


def _rows(model: type, path: str, flags: dict[str, str]) -> list[str]:
    """One table row per field of ``model`` (a pydantic model or a dataclass) at ``path``."""
    rows = []
    fields: list[tuple[str, Any, list[Any], Any, str]]
    if dataclasses.is_dataclass(model):
        described, hints = _attributes(model), inspect.get_annotations(model, eval_str=True)
        fields = [(f.name, hints[f.name], [], f.default, described.get(f.name, "")) for f in dataclasses.fields(model)]
    else:
        assert issubclass(model, BaseModel)
        items: dict[str, FieldInfo] = model.model_fields
        fields = [
            (name, info.annotation, info.metadata, info.get_default(), info.description or "")
            for name, info in items.items()
            if not (isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel))
            and not dataclasses.is_dataclass(info.annotation)
        ]
    for name, annotation, metadata, default, text in fields:
        variable = f"`{env_name(f'{path}.{name}' if path else name)}`"
        if not path and name in flags:
            variable += f" (`{flags[name]}`)"
        meaning = _cell(text).removesuffix(".")
        rows.append(f"| {variable} | {_default(default)} | {_cell(_values(annotation, metadata))} | {meaning} |")
    return rows


def _table(rows: list[str]) -> list[str]:
    return ["| variable | default | values | meaning |", "| --- | --- | --- | --- |", *rows]


def render() -> str:
    """The text of docs/settings.md."""
    flags = _flags()
    parts = [INTRO, "## Server", "", *_table(_rows(Settings, "", flags)), ""]
    for group, info in Settings.model_fields.items():
        model = info.annotation
        if not (isinstance(model, type) and (issubclass(model, BaseModel) or dataclasses.is_dataclass(model))):
            continue
        intro = inspect.cleandoc(model.__doc__ or "").split("\n\n")[0]
        parts += [f"## {group}", "", _cell(intro), "", *_table(_rows(model, group, flags)), ""]
    parts += [
        "## Deprecated names",
        "",
        "Accepted until the next release, each with a `FutureWarning` that names its replacement; where both are "
        "set, the new name wins and the old one is ignored. In code, `Settings(...)` takes the new names only.",
        "",
        "| old | new |",
        "| --- | --- |",
        *(f"| `{PREFIX}{old.upper()}` | `{replacement(old)}` |" for old in RENAMED),
        *(
            f"| `{PREFIX}{old.upper()}` | no longer a setting, ignored; fixed: {_code(fixed)} |"
            for old, fixed in REMOVED.items()
        ),
        "",
    ]
    return "\n".join(parts)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print(render(), end="")
