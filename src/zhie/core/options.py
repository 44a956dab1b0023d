"""Options: a dataclass field that is also a command-line flag, declared once, and the jobs' configuration files.

:func:`option` declares the field with the flag's help, group and argparse settings; :func:`add_flags` makes the flags
of a dataclass's option fields, each defaulting to its field's default; :func:`values_from_flags` reads them back.
Every job's flags are made this way (``zhie train``'s from :class:`zhie.training.RunOptions`,
:class:`zhie.training.TrainConfig` and the task's config, ``zhie distill student``'s, ``pretrain``'s, ``export``'s,
``serve``'s from theirs), so that no default is written twice.

A job's parser is a :class:`Parser` with :func:`add_config_flags`: ``--config FILE`` takes the job's settings from a
TOML file (:mod:`zhie.core.config_file`; flags given on the command line win, wherever they stand) and
``--print-config`` prints them all, with their defaults, as such a file.

Why argparse and not a configuration library (jsonargparse, transformers' ``HfArgumentParser``, confection): zhie's
flags are dashed (``--head-lr``), which jsonargparse cannot make (its flags are the fields' own names); transformers
is not installed with the runtime extra that ``zhie serve`` of an export runs on, and ``HfArgumentParser`` makes every
field a flag and every switch ``--NAME [BOOL]``, which takes the positional argument after it (``zhie export
--per-channel runs/x``); confection reads its own config format and parses no flags. The standard library's argparse
and tomllib, with this module's few lines between them and the dataclasses, do what those would.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import Field, field, fields
from typing import Any

__all__ = ["Parser", "add_config_flags", "add_flags", "check_options", "option", "option_fields", "port_number",
           "positive_int", "values_from_flags"]

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


def add_flags(parser: argparse._ActionsContainer, dataclass_type: type, names: Iterable[str] | None = None,
              defaults: dict[str, Any] | None = None) -> None:
    """The flags of the option fields of ``dataclass_type`` (``names``: those only), into ``parser`` and the groups
    they name: each flag's ``dest`` is its field's name and its default the field's default (shown in the help), or
    the job's own of ``defaults`` (``zhie distill mtmt``'s batch size: a job's default, declared once, there)."""
    groups = {None: parser}
    defaults = defaults or {}
    for f in option_fields(dataclass_type, names):
        default = defaults.get(f.name, f.default)
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
        shown = "" if default in (None, ()) else f" (default: {default})"
        extra = {"nargs": "+"} if kind.startswith("tuple") else {"type": FLAG_TYPES.get(kind, str)}
        groups[group].add_argument(*(meta["flags"] or (f"--{dashed}",)), dest=f.name, default=default,
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


# how a session of a run goes, not what the run is: no settings (pretrain's --overwrite, --resume: deprecated)
SESSION_FLAGS = ("config_file", "print_config", "no_resume", "quiet", "stop_after", "time_limit", "overwrite", "resume")


class Parser(argparse.ArgumentParser):
    """zhie's parser (its commands' parsers are made of its class): a job's (:func:`add_config_flags`) reads the
    settings of ``--config FILE`` as its defaults before it parses the command line, so that a flag given there wins
    wherever it stands, and a flag the file sets is no longer required; with ``--print-config``, none is."""

    job: str | None = None  # the job's name in its configuration files ("train ner"), set by add_config_flags
    tables: dict[str, list[str]] = {}  # settings grouped in a table of the file, by its name (add_config_flags)

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs) -> None:
        # no abbreviations: `zhie distill student --encoder X` is refused, not read as --encoder-layers X
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        if self.job is not None and args is not None:
            args = list(args)
            path = next((a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else None)
                         for i, a in enumerate(args) if a == "--config" or a.startswith("--config=")), None)
            if path is not None:
                self.take_settings(path)
            if "--print-config" in args:
                for action in self._actions:
                    action.required = False
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        """As argparse's, with a flag that the chosen job does not take named as such (argparse would only call it
        unrecognised)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            job = getattr(parsed, "job_parser", None)
            flags = [e for e in extras if e.startswith("-")]
            where = f"; zhie {job.job} does not take {'it' if len(flags) == 1 else 'them'} (zhie {job.job} --help " \
                    f"lists its flags)" if job is not None and flags else ""
            self.error(f"unrecognized arguments: {' '.join(extras)}{where}")
        return parsed

    def settings_actions(self) -> dict[str, argparse.Action]:
        """The job's settings: its flags by ``dest`` (not ``--help``, nor the flags of :data:`SESSION_FLAGS`)."""
        return {a.dest: a for a in self._actions if a.option_strings and a.dest not in (*SESSION_FLAGS, "help")
                and a.default is not argparse.SUPPRESS}

    def take_settings(self, path: str) -> None:
        """The settings of the configuration file ``path`` as this parser's defaults, each checked as its flag's
        value would be (its type, its choices)."""
        from zhie.core import config_file

        command, settings = config_file.read(path)
        if command is not None and command != self.job:
            raise ValueError(f"{path} is the configuration of `zhie {command}`, not of `zhie {self.job}`: run "
                             f"zhie {command} --config {path}")
        actions = self.settings_actions()
        unknown = [key for key in settings if key not in actions]
        if unknown:
            raise ValueError(f"{path}: {', '.join(unknown)}: not a setting of zhie {self.job} (its settings are its "
                             f"flags with underscores; zhie {self.job} --print-config prints them all)")
        for key, value in settings.items():
            action = actions[key]
            values = value if isinstance(value, list) else [value]
            if isinstance(value, list) and action.nargs not in ("+", "*") and action.nargs != 0:
                raise ValueError(f"{path}: {key} = {value!r}: one value, not a list")
            try:
                values = [_setting(action, v) for v in values]
            except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
                raise ValueError(f"{path}: {key} = {value!r}: {err}") from None
            bad = [v for v in values if action.choices is not None and v not in action.choices]
            if bad:
                raise ValueError(f"{path}: {key} = {bad[0]!r}: choose one of {', '.join(map(str, action.choices))}")
            self.set_defaults(**{key: values if isinstance(value, list) else values[0]})
            action.required = False

    def settings(self, args: argparse.Namespace) -> dict[str, Any]:
        """The job's settings in ``args``, by ``dest`` (what ``--print-config`` prints and a run keeps)."""
        return {dest: getattr(args, dest) for dest in self.settings_actions() if hasattr(args, dest)}


def _setting(action: argparse.Action, value: Any) -> Any:
    """A configuration file's ``value`` for the flag ``action``, checked as the flag's would be: a string through the
    flag's type, true or false for a switch, a number for a flag of numbers (kept as it is once the flag's type takes
    it: ``1.5`` is no integer, ``-1`` no positive one); anything else (a number for a flag of text, a table) raises
    ``TypeError``."""
    if action.nargs == 0:
        if not isinstance(value, bool):
            raise TypeError(f"expected true or false, got {type(value).__name__}")
        return value
    if isinstance(value, str):
        return value if action.type is None else action.type(value)
    text = action.type in (None, str)
    if text or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected {'a string' if text else 'a number'}, got {type(value).__name__}")
    action.type(str(value))
    return value


def add_config_flags(parser: Parser, job: str, tables: dict[str, list[str]] | None = None) -> Parser:
    """``--config FILE`` and ``--print-config`` on the parser of the job named ``job`` (``"train ner"``);
    ``tables``: the settings that its configuration files group in a table, by the table's name."""
    parser.job, parser.tables = job, tables or {}
    parser.set_defaults(job_parser=parser)
    group = parser.add_argument_group("configuration")
    group.add_argument("--config", dest="config_file", default=None, metavar="FILE",
                       help="take the settings from FILE (TOML, the flags' names with underscores, as "
                            "--print-config prints them, or a run directory's config.toml); flags given win")
    group.add_argument("--print-config", action="store_true",
                       help="print the job's settings (every flag's value, defaults included) as TOML and stop")
    return parser


def port_number(value: str) -> int:
    """``--port``: a TCP port, 0 to 65535 (0: one the system picks)."""
    port = int(value)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {value}")
    return port


def positive_int(value: str) -> int:
    """A flag's positive whole number."""
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return number
