"""What every data reader shares: :class:`DataError` and line-by-line input with line numbers."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

PathLike = str | os.PathLike


class DataError(ValueError):
    """Bad input in a data file: ``str(err) == f"{path}:{line}: {reason}"`` (line is 1-based)."""

    def __init__(self, path: PathLike, line: int, reason: str):
        super().__init__(str(path), line, reason)
        self.path = str(path)
        self.line = line
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


def iter_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line without its newline), decoding UTF-8 line by line.

    A byte-order mark at the start is dropped; undecodable bytes raise :class:`DataError`.
    """
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            yield lineno, decode_line(path, lineno, raw)


def decode_line(path: PathLike, lineno: int, raw: bytes) -> str:
    """Line ``lineno`` of ``path`` as read in binary, decoded, without its newline (and BOM on line 1)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(path, lineno, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if lineno == 1:
        line = line.removeprefix("\ufeff")
    return line.rstrip("\r\n")


def json_line(path: PathLike, lineno: int, line: str) -> dict:
    """Parse one JSON-lines record, which must be an object."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(path, lineno, f"malformed JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(record, dict):
        raise DataError(path, lineno, f"expected a JSON object, got {type(record).__name__}")
    return record


def read_texts(path: PathLike) -> list[str]:
    """One text per line, or JSON lines with a string field "text" (blank lines skipped); bad lines raise
    :class:`DataError`."""
    return [text for lineno, line in iter_lines(path) if (text := text_of_line(path, lineno, line)) is not None]


def text_of_line(path: PathLike, lineno: int, line: str) -> str | None:
    """The text of one line of :func:`read_texts`' input: the line, or its JSON object's string field "text"; None
    for a blank line."""
    if not line.strip():
        return None
    if not line.lstrip().startswith("{"):
        return line
    record = json_line(path, lineno, line)
    if not isinstance(record.get("text"), str):
        raise DataError(path, lineno, "a JSON line needs a string field 'text'")
    return record["text"]
