"""A job's configuration file: what ``--config FILE`` reads, ``--print-config`` prints, and every run directory keeps
as ``config.toml`` (:data:`RUN_CONFIG`).

The file is TOML (read by the standard library's ``tomllib``, written by ``tomli-w``). Its keys are the job's flags
with underscores (``encoder_layers`` for ``--encoder-layers``), at the top or in tables that only group them for the
reader (``[training]`` for :class:`zhie.training.TrainConfig`'s, ``[ner]`` for a task's): reading flattens them.
``command`` names the job (``"train ner"``, ``"distill student"``); a run's ``[derived]`` table holds what zhie worked
out itself (the learning rates from the encoder's width), for the reader only: it is never read back, so that a rerun
with another ``--encoder`` derives its own. TOML has no null: a setting that is None (unset, or derived) is left
out, which gives it its default again. The file is UTF-8 (a BOM at the start is dropped); one that is not, or is not
TOML, raises ``ValueError`` ``FILE:LINE: reason`` (:func:`load_toml`).
"""

from __future__ import annotations

import os
import re
import reprlib
import textwrap
from typing import Any

__all__ = ["DERIVED", "RUN_CONFIG", "decoded", "dumps", "load_toml", "read"]

RUN_CONFIG = "config.toml"
DERIVED = "derived"


def read(path: str | os.PathLike) -> tuple[str | None, dict[str, Any]]:
    """``(command, settings)`` of the configuration file ``path``: the job it names (None when it names none; an older
    run's ``task = "ner"`` is ``"train ner"``) and every setting by key, its tables flattened and ``[derived]`` left
    out. A key given twice (at the top and in a table, or in two tables) is an error."""
    try:
        data = load_toml(path)
    except FileNotFoundError:
        raise ValueError(f"--config {path}: no such file; give a TOML file of the job's settings (zhie COMMAND "
                         "--print-config prints them all)") from None
    command = data.pop("command", None)
    task = data.pop("task", None)
    if command is None and isinstance(task, str):
        command = f"train {task}"
    data.pop(DERIVED, None)
    settings: dict[str, Any] = {}
    for table, values in [(None, {k: v for k, v in data.items() if not isinstance(v, dict)}),
                          *[(k, v) for k, v in data.items() if isinstance(v, dict)]]:
        for key, value in values.items():
            if key in settings:
                raise ValueError(f"{path}: {key} is set twice{f' (again in [{table}])' if table else ''}; keep one")
            settings[key] = value
    if command is not None and not isinstance(command, str):
        raise ValueError(f'{path}: command must be a string such as "train ner", got {reprlib.repr(command)}')
    return command, settings


def decoded(path: str | os.PathLike, raw: bytes, error: type[ValueError] = ValueError) -> str:
    """``raw``, the bytes of the text file ``path``, decoded: UTF-8, a byte-order mark at the start dropped (CRLF line
    ends are TOML's and YAML's own); bytes that are not UTF-8 raise ``error`` ``path:LINE: not valid UTF-8 ...``."""
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise error(f"{path}:{line}: not valid UTF-8 ({err.reason} at byte {err.start}); save it as UTF-8") from None


def load_toml(path: str | os.PathLike, error: type[ValueError] = ValueError) -> dict[str, Any]:
    """The TOML file ``path`` (:func:`decoded`) as a table; bad TOML raises ``error`` ``path:LINE: not valid TOML:
    reason (column C)``. A missing file raises ``FileNotFoundError``."""
    import tomllib

    with open(path, "rb") as f:
        text = decoded(path, f.read(), error)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:  # "reason (at line L, column C)", or "(at end of document)"
        where = re.search(r" \(at line (\d+), column (\d+)\)$", str(err))
        line, reason = (int(where[1]), f"{str(err)[:where.start()]} (column {where[2]})") if where else \
            (text.count("\n") + 1, str(err).replace(" (at end of document)", " at the end of the file"))
        raise error(f"{path}:{line}: not valid TOML: {reason}") from None
    except ValueError:  # int()'s limit on the digits of a number
        digits = re.search(r"\d{4301}", text)
        line = text.count("\n", 0, digits.start()) + 1 if digits else 1
        raise error(f"{path}:{line}: not valid TOML: a number too long to read (over 4300 digits)") from None
    except RecursionError:  # tomllib's arrays and inline tables, one call deeper each
        raise error(f"{path}: not valid TOML: arrays or tables nested too deeply") from None


def plain(value: Any) -> Any:
    """``value`` as TOML writes it: paths and other objects as strings, tuples as lists, None left out of tables."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool)) else str(value)


def dumps(command: str, settings: dict[str, Any], tables: dict[str, dict[str, Any]] | None = None,
          derived: dict[str, Any] | None = None, header: str = "") -> str:
    """The TOML text of a job's configuration: ``command``, the ``settings`` at the top, then each of ``tables``
    (grouped settings), then ``[derived]`` (what zhie worked out; never read back). Settings that are None are
    listed in a comment, as left at their default."""
    import tomli_w

    unset = [k for k, v in [*settings.items(), *((k, v) for t in (tables or {}).values() for k, v in t.items())]
             if v is None]
    body = {"command": command, **plain(settings), **{name: plain(t) for name, t in (tables or {}).items()}}
    if derived:
        body[DERIVED] = plain(derived)
    text = header + "".join(f"# {line}\n" for line in textwrap.wrap(
        f"unset (their default is none, or derived): {', '.join(unset)}", 116)) if unset else header
    return text + tomli_w.dumps(body)
