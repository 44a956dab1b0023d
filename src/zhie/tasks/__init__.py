"""The task registry: every task is one class in one module of this package (or of a package that declares it
under the ``zhie.tasks`` entry-point group), registered with :func:`register`.

The CLI (``zhie train TASK``, ``eval``, ``predict``), :func:`zhie.fit` and :func:`zhie.load` find tasks here by
name; no other file names a task. See :class:`zhie.tasks.base.Task` for what a task declares.

Lazily: :func:`get` imports only the module of the task asked for (:data:`MODULES`, else every module and entry
point), so that loading a model imports one task's code; :func:`all_tasks` imports them all.
"""

from __future__ import annotations

import importlib
import pkgutil

# the modules of zhie's own tasks by task name and alias; a task module not named here is found by the full discovery
MODULES = {"ner": "ner", "cws": "cws", "re": "relation", "similarity": "similarity", "sts": "similarity",
           "multitask": "multitask", "xner-evaluator": "xner"}

# the commands of zhie's own tasks (``Task.add_commands``): command -> (its task, its line in `zhie --help`)
COMMANDS = {"segment": ("cws", "segment text into words with a trained cws model"),
            "embed": ("similarity", "sentence vectors from a trained sentence-embedding model")}

_REGISTRY: dict[str, type] = {}
_ALIASES: dict[str, str] = {}
_discovered = False


def register(cls: type) -> type:
    """Class decorator: make a :class:`~zhie.tasks.base.Task` subclass known under ``cls.name`` and its aliases."""
    for name in (cls.name, *cls.aliases):
        owner = _ALIASES.get(name)
        if owner is not None and _REGISTRY[owner] is not cls:
            raise ValueError(f"task name {name!r} of {cls.__qualname__} is taken by {_REGISTRY[owner].__qualname__}")
        _ALIASES[name] = cls.name
    _REGISTRY[cls.name] = cls
    return cls


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            importlib.import_module(f"{__name__}.{module.name}")
    from importlib.metadata import entry_points  # ~16 ms to import: only where a plugin is looked for

    for entry in entry_points(group="zhie.tasks"):
        entry.load()


def get(name: str) -> type:
    """The task class registered as ``name`` (or one of its aliases)."""
    if name not in _ALIASES and name in MODULES:
        importlib.import_module(f"{__name__}.{MODULES[name]}")
    if name not in _ALIASES:
        _discover()
    if name not in _ALIASES:
        from zhie.data.base import shown  # the name cut short: a config file's string may be long

        raise ValueError(f"unknown task {shown(name)}; zhie knows {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[_ALIASES[name]]


def all_tasks() -> list[type]:
    """Every registered task class, in the order they were registered."""
    _discover()
    return list(_REGISTRY.values())
