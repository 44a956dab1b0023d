"""The config file of a multi-task run (``zhie train multitask --tasks FILE``), read and checked into a
:class:`MultitaskFile` by :func:`read`.

The file (TOML; YAML too when PyYAML is installed) lists the member tasks and the weighting scheme::

    [weighting]
    scheme = "real-time"        # `--weighting` overrides it
    main = "ner"                # main-auxiliary: the main task
    gamma = 0.5                 # generalised-mean: the exponent γ

    [[tasks]]
    name = "ner"                # unique: the head's name, the key of its predictions, `zhie eval --task NAME`
    task = "ner"                # any registered task: ner, cws, re, similarity
    train = "cluener/train.json"   # relative to the config file
    dev = "cluener/dev.json"
    batch_size = 16             # optional; default --batch-size
    options = {head = "egp", max_length = 128}   # the task's own `zhie train TASK` flags (paths: relative to the file)
    sampling_weight = 2.0       # optional; sampled steps only (:mod:`zhie.tasks.multitask`)

    [sampling]                  # optional
    mode = "all"                # all (default) | proportional | temperature
    temperature = 2.0           # temperature: p_i ∝ s_i^(1/T)

The keys of each table are the fields of :class:`MemberSpec`, :class:`Weighting` and :class:`Sampling`. A bad file
raises :class:`ConfigError` naming the file, the member and the key: ``FILE: task 'ner': options.head: expected one
of crf, ...``; one that is not UTF-8 or not TOML, the file and the line: ``FILE:3: not valid TOML: ...`` (a BOM at
the start is dropped). A member's ``options`` are checked against its task's own flags, so :func:`read` is given the
task registry's lookup (``tasks.get``: this package sits below the tasks and imports none).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from zhie.core import config_file
from zhie.data.base import shown

SCHEMES = ("equal", "initial", "prior", "real-time", "generalised-mean", "grad-normalise", "mgda", "main-auxiliary",
           "uncertainty")
SAMPLING = ("all", "proportional", "temperature")
SAMPLED_SCHEMES = ("equal", "prior", "real-time", "uncertainty")  # a weight from the member's own loss alone
GRADIENT_SPACES = ("parameters", "encoder-output")
PATH_OPTIONS = {"re": ("schema",)}  # member options that name files: relative to the config file
NAME = re.compile(r"[A-Za-z0-9_-]+")


class ConfigError(ValueError):
    """A bad multi-task config: the message names the file, the member and the key."""


@dataclass
class MemberSpec:
    """One ``[[tasks]]`` entry of the config, checked (paths relative to the current directory)."""

    name: str
    task: str
    train: str
    dev: str
    format: str = "auto"
    batch_size: int | None = None
    sampling_weight: float | None = None
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Weighting:
    """The ``[weighting]`` table: None where the file leaves a key out (the task's config has the defaults)."""

    scheme: str | None = None
    main: str | None = None
    gamma: float | None = None
    initial_batches: int | None = None
    gradients: str | None = None


@dataclass(frozen=True)
class Sampling:
    """The ``[sampling]`` table: None where the file leaves a key out."""

    mode: str | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class MultitaskFile:
    """A multi-task config file, read and checked."""

    path: Path
    members: tuple[MemberSpec, ...]
    weighting: Weighting
    sampling: Sampling


MEMBER_KEYS = tuple(f.name for f in fields(MemberSpec))
WEIGHTING_KEYS = tuple(f.name for f in fields(Weighting))
SAMPLING_KEYS = tuple(f.name for f in fields(Sampling))


def read(path: str | os.PathLike, task_class: Callable[[str], type]) -> MultitaskFile:
    """The config file ``path``, checked (``task_class``: the task registry's lookup, ``zhie.tasks.get``); its paths
    (``train``, ``dev``, file options such as ``re``'s ``schema``) are made relative to the current directory. Raises
    :class:`ConfigError` naming the file, the member and the key.

    Read once per run: :func:`zhie.fit` asks for the file three times (its data, its configuration, its files), and
    an unchanged file (the same size and modification time) in the same directory is not read again."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return _read(path, task_class)  # no such file: the error
    return _read_once(path, os.getcwd(), (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns), task_class)


@functools.lru_cache(maxsize=8)
def _read_once(path: Path, cwd: str, stamp: tuple[int, ...], task_class: Callable[[str], type]) -> MultitaskFile:
    """:func:`_read`, once per file ``stamp`` and directory (an error is not kept: it is raised again)."""
    return _read(path, task_class)


def _read(path: Path, task_class: Callable[[str], type]) -> MultitaskFile:
    data = load_file(path)
    for key in data:
        if key not in ("tasks", "weighting", "sampling"):
            raise ConfigError(f"{path}: {key}: not a key of a multi-task config; it has [[tasks]], [weighting] and "
                              "[sampling]")
    entries = data.get("tasks")
    if not isinstance(entries, list) or len(entries) < 2:
        raise ConfigError(f"{path}: tasks: a multi-task config needs at least two [[tasks]] entries "
                          "(train a single task with `zhie train TASK`)")
    specs: list[MemberSpec] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: tasks[{i}]: expected a table, got {shown(entry)}")
        name = entry.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ConfigError(f"{path}: tasks[{i}]: name: expected a name of letters, digits, _ or -, got "
                              f"{shown(name)}")
        where = f"{path}: task {shown(name)}"
        if any(s.name == name for s in specs):
            raise ConfigError(f"{where}: name: two tasks are named {shown(name)}; names must be unique")
        for key in entry:
            if key not in MEMBER_KEYS:
                raise ConfigError(f"{where}: {key}: not a key of a task; use {', '.join(MEMBER_KEYS)}")
        for key in ("task", "train", "dev"):
            if not isinstance(entry.get(key), str):
                raise ConfigError(f"{where}: {key}: missing (expected a string)")
        try:
            cls = task_class(entry["task"])
        except ValueError as err:
            raise ConfigError(f"{where}: task: {err}") from None
        if not cls.data_flags:
            raise ConfigError(f"{where}: task: a {cls.name} task cannot be a member")
        files = {}
        for key in ("train", "dev"):
            file = path.parent / entry[key]
            if not _exists(file):
                raise ConfigError(f"{where}: {key}: {shown(str(file))[1:-1]} does not exist")
            files[key] = str(file)
        batch_size = entry.get("batch_size")
        if batch_size is not None and not _positive(batch_size, integer=True):
            raise ConfigError(f"{where}: batch_size: expected a positive integer, got {shown(batch_size)}")
        sampling_weight = entry.get("sampling_weight")
        if sampling_weight is not None and not _positive(sampling_weight):
            raise ConfigError(f"{where}: sampling_weight: expected a positive number, got {shown(sampling_weight)}")
        fmt = entry.get("format", "auto")
        if not isinstance(fmt, str):
            raise ConfigError(f"{where}: format: expected a string, got {shown(fmt)}")
        options = _check_options(where, cls, entry.get("options", {}))
        for key in PATH_OPTIONS.get(cls.name, ()):
            if options.get(key) is not None:
                file = path.parent / options[key]
                if not _exists(file):
                    raise ConfigError(f"{where}: options.{key}: {shown(str(file))[1:-1]} does not exist")
                options[key] = str(file)
        specs.append(MemberSpec(name, cls.name, files["train"], files["dev"], fmt, batch_size, sampling_weight,
                                options))
    weighting = _table(path, data, "weighting", WEIGHTING_KEYS)
    for key, value in weighting.items():
        if key == "scheme" and value not in SCHEMES:
            raise ConfigError(f"{path}: weighting.scheme: {shown(value)} is not one of {', '.join(SCHEMES)}")
        if key == "main" and value not in [s.name for s in specs]:
            raise ConfigError(f"{path}: weighting.main: {shown(value)} is not the name of a task")
        if key == "gamma" and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise ConfigError(f"{path}: weighting.gamma: expected a number, got {shown(value)}")
        if key == "initial_batches" and not _positive(value, integer=True):
            raise ConfigError(f"{path}: weighting.initial_batches: expected a positive integer, got {shown(value)}")
        if key == "gradients" and value not in GRADIENT_SPACES:
            raise ConfigError(f"{path}: weighting.gradients: {shown(value)} is not one of {', '.join(GRADIENT_SPACES)}")
    sampling = _table(path, data, "sampling", SAMPLING_KEYS)
    for key, value in sampling.items():
        if key == "mode" and value not in SAMPLING:
            raise ConfigError(f"{path}: sampling.mode: {shown(value)} is not one of {', '.join(SAMPLING)}")
        if key == "temperature" and not _positive(value):
            raise ConfigError(f"{path}: sampling.temperature: expected a positive number, got {shown(value)}")
    return MultitaskFile(path, tuple(specs), Weighting(**weighting), Sampling(**sampling))


def load_file(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigError(f"{path}: YAML configs need PyYAML, which is not installed; write the config in TOML "
                              "(a .toml file), or pip install pyyaml") from None
        try:
            data = yaml.safe_load(config_file.decoded(path, path.read_bytes(), ConfigError))
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
    elif path.suffix == ".toml":
        data = config_file.load_toml(path, ConfigError)
    else:
        raise ConfigError(f"{path}: a multi-task config is a .toml file (or .yaml with PyYAML installed)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table with [[tasks]] entries, got {type(data).__name__}")
    return data


def _check_options(where: str, cls: type, options: object) -> dict:
    """``options`` against the task's own ``zhie train TASK`` flags (their names with ``_`` or ``-``, their types
    and choices); returns them as ``configure`` keywords."""
    if not isinstance(options, dict):
        raise ConfigError(f"{where}: options: expected a table of the {cls.name} task's options")
    parser = argparse.ArgumentParser(add_help=False)
    cls.add_arguments(parser)
    actions = {a.dest: a for a in parser._actions}
    out = {}
    for key, value in options.items():
        dest = str(key).replace("-", "_")
        action = actions.get(dest)
        if action is None:
            raise ConfigError(f"{where}: options.{key}: not an option of the {cls.name} task; it has "
                              f"{', '.join(sorted(actions)) or 'none'}")
        if isinstance(action, argparse._StoreTrueAction):
            ok, expected = isinstance(value, bool), "true or false"
        elif action.choices is not None:
            ok, expected = value in action.choices, f"one of {', '.join(map(str, action.choices))}"
        elif action.type in (int, float):
            ok = isinstance(value, (int, float) if action.type is float else int) and not isinstance(value, bool)
            expected = "an integer" if action.type is int else "a number"
        else:
            ok, expected = isinstance(value, str), "a string"
        if not ok:
            raise ConfigError(f"{where}: options.{key}: expected {expected}, got {shown(value)}")
        out[dest] = value
    return out


def _exists(file: Path) -> bool:
    """Whether ``file`` exists; a name the system cannot take (too long, a NUL in it) names no file."""
    try:
        return file.exists()
    except (OSError, ValueError):
        return False


def _positive(value: object, integer: bool = False) -> bool:
    kinds = int if integer else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool) and value > 0


def _table(path: Path, data: dict, name: str, keys: tuple[str, ...]) -> dict:
    """The config's optional ``[name]`` table, checked to be a table of ``keys`` only."""
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {name}: expected a table with {', '.join(keys)}")
    for key in table:
        if key not in keys:
            raise ConfigError(f"{path}: {name}.{key}: not a key of [{name}]; use {', '.join(keys)}")
    return table
