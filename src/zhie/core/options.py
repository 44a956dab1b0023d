"""Options: a dataclass field that is also a command-line flag, declared once.

:func:`option` declares the field with the flag's help, group and argparse settings; :func:`add_flags` makes the flags
of a dataclass's option fields, each defaulting to its field's default; :func:`values_from_flags` reads them back.
``zhie train``'s training flags (:class:`zhie.training.TrainConfig`) and every task's own flags (its config's fields,
:meth:`zhie.tasks.base.Task.add_arguments`) are made this way, so that no default is written twice.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import Field, field, fields
from typing import Any

__all__ = ["add_flags", "check_options", "option", "option_fields", "values_from_flags"]

FLAG_TYPES = {"int": int, "float": float}  # a field's type -> the flag's (any other: str; bool: a switch)


def option(default: Any, help: str, group: str | None = None, *, flags: tuple[str, ...] = (), **settings) -> Any:
    """A dataclass field that is also a flag: ``--max-length`` for ``max_length``; for a bool field a switch,
    ``--NAME`` when its default is False and ``--no-NAME`` when it is True (``help`` then says what the switch does);
    ``flags``: other names (the first the flag's own, the rest its aliases). ``group``: the flag group it is listed in;
    ``settings``: argparse's (``choices``, ``metavar``)."""
    return field(default=default, metadata={"help": help, "group": group, "flags": flags, "settings": settings})


def option_fields(dataclass_type: type, names: Iterable[str] | None = None) -> list[Field]:
    """The fields of ``dataclass_type`` declared with :func:`option` (``names``: those, in that order)."""
    declared = {f.name: f for f in fields(dataclass_type) if "help" in f.metadata}
    if names is None:
        return list(declared.values())
    missing = [name for name in names if name not in declared]
    if missing:
        raise ValueError(f"{', '.join(missing)}: not an option of {dataclass_type.__name__}")
    return [declared[name] for name in names]


def add_flags(parser: argparse._ActionsContainer, dataclass_type: type, names: Iterable[str] | None = None) -> None:
    """The flags of the option fields of ``dataclass_type`` (``names``: those only), into ``parser`` and the groups
    they name: each flag's ``dest`` is its field's name and its default the field's default (shown in the help)."""
    groups = {None: parser}
    for f in option_fields(dataclass_type, names):
        group, meta = f.metadata["group"], f.metadata
        if group not in groups:
            groups[group] = parser.add_argument_group(group)
        kind = (f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))).split(" |")[0]
        dashed = f.name.replace("_", "-")
        if kind == "bool":
            switch = meta["flags"] or (f"--no-{dashed}" if f.default else f"--{dashed}",)
            groups[group].add_argument(*switch, dest=f.name, action="store_false" if f.default else "store_true",
                                       help=meta["help"], **meta["settings"])
            continue
        shown = "" if f.default in (None, ()) else f" (default: {f.default})"
        extra = {"nargs": "+"} if kind.startswith("tuple") else {"type": FLAG_TYPES.get(kind, str)}
        groups[group].add_argument(*(meta["flags"] or (f"--{dashed}",)), dest=f.name, default=f.default,
                                   help=meta["help"] + shown, **{**extra, **meta["settings"]})


def values_from_flags(args: argparse.Namespace, dataclass_type: type,
                      names: Iterable[str] | None = None) -> dict[str, Any]:
    """The values of :func:`add_flags`' flags in ``args``, by field name (those ``args`` has)."""
    return {f.name: getattr(args, f.name) for f in option_fields(dataclass_type, names) if hasattr(args, f.name)}


def check_options(dataclass_type: type, options: dict[str, Any], names: Iterable[str] | None = None) -> dict[str, Any]:
    """``options`` (keywords) if each is an option field of ``dataclass_type`` (``names``: one of those), else a
    TypeError that names the others, as for an unexpected keyword."""
    known = [f.name for f in option_fields(dataclass_type, names)]
    unknown = [name for name in options if name not in known]
    if unknown:
        raise TypeError(f"{', '.join(unknown)}: not an option of {dataclass_type.__name__}; its options are "
                        f"{', '.join(known) or 'none'}")
    return options
