"""What every data reader shares: :class:`DataError`, line-by-line input with line numbers, and :func:`shown` for the
values an error quotes.

Every reader either reads a file or raises :class:`DataError` (``file:line: reason``; a JSON list's record: the line
where it starts): invalid UTF-8, malformed or too deeply nested JSON, a number too long to read, a field of the wrong
type, an offset outside the text are each such an error, never a ``KeyError``, ``TypeError`` or
``UnicodeDecodeError``. A byte-order mark at the start of a file is dropped and a line's CRLF end is read as LF; lines
end at LF alone (a CR, U+2028 or U+0085 inside a line is part of it). A line is read whole, however long (its memory
is a few times its size), and an error quotes a value of it cut short (:func:`shown`), never the whole line.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import reprlib
from collections.abc import Iterable, Iterator
from pathlib import Path

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


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 80


def shown(value: object) -> str:
    """``repr(value)`` for an error message, cut to about 80 characters (a long string in its middle, a long list
    after a few items): a bad value may be a whole line of a hundred megabytes."""
    return _SHORT.repr(value)


def json_problem(err: ValueError | RecursionError) -> str:
    """The reason why :mod:`json` could not read a text: its own message, or what its other errors mean."""
    if isinstance(err, json.JSONDecodeError):
        return f"malformed JSON: {err.msg} (column {err.colno})"
    if isinstance(err, RecursionError):
        return "malformed JSON: nested too deeply"
    return "malformed JSON: a number too long to read (over 4300 digits)"  # int()'s limit on a string's digits


def iter_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line without its newline), decoding UTF-8 line by line.

    A byte-order mark at the start is dropped; undecodable bytes raise :class:`DataError`.
    """
    with open(path, "rb") as f:
        lineno = 0
        for raw in f:  # not enumerate(f), whose tuple would hold each line's bytes while its text is read
            lineno += 1
            line = decode_line(path, lineno, raw)
            del raw
            yield lineno, line


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
    except (ValueError, RecursionError) as e:
        raise DataError(path, lineno, json_problem(e)) from None
    if not isinstance(record, dict):
        raise DataError(path, lineno, f"expected a JSON object, got {type(record).__name__}")
    return record


def iter_json_list(path: PathLike) -> Iterator[tuple[int, object]]:
    """``(line where it starts, element)`` of each element of the JSON list in the file ``path``, decoded one at a
    time; a file that is not a JSON list, or bad JSON, raises :class:`DataError` at its line."""
    raw = Path(path).read_bytes()
    try:
        s = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise DataError(path, raw.count(b"\n", 0, e.start) + 1, f"not valid UTF-8 ({e.reason})") from None
    del raw  # the text alone is held while the records are decoded
    decoder, ws = json.JSONDecoder(), re.compile(r"\s*")

    def line_at(pos: int) -> int:
        return s.count("\n", 0, pos) + 1

    pos = ws.match(s).end()
    if pos == len(s):
        raise DataError(path, 1, "empty file: no records")
    if s[pos] != "[":
        raise DataError(path, line_at(pos), "expected a JSON list of records ('[' ...)")
    pos = ws.match(s, pos + 1).end()
    lineno, counted = 1, 0  # newlines counted incrementally: line_at() per record would be quadratic
    if s.startswith("]", pos):
        pos += 1
    else:
        while True:
            lineno += s.count("\n", counted, pos)
            counted = pos
            try:
                record, pos = decoder.raw_decode(s, pos)
            except (ValueError, RecursionError) as e:
                raise DataError(path, getattr(e, "lineno", lineno), json_problem(e)) from None
            yield lineno, record
            pos = ws.match(s, pos).end()
            if s.startswith(",", pos):
                pos = ws.match(s, pos + 1).end()
            elif s.startswith("]", pos):
                pos += 1
                break
            else:
                raise DataError(path, line_at(pos), "malformed JSON: expected ',' or ']' after a record")
    pos = ws.match(s, pos).end()
    if pos != len(s):
        raise DataError(path, line_at(pos), "malformed JSON: extra data after the list")


TEXT_FORMATS = ("auto", "text", "jsonl")  # --input-format: how a file of texts is read


def text_format(path: PathLike, raw_lines: Iterable[bytes], format: str = "auto") -> tuple[str, Iterator[bytes]]:
    """How the file ``path``, whose lines (bytes, as read in binary) are ``raw_lines``, holds its texts, decided once
    for the whole file: ``"text"`` (one text per line) or ``"jsonl"`` (a JSON object with a string field "text" per
    line); and the lines, none consumed. ``format`` ``"text"`` or ``"jsonl"`` decides; ``"auto"``: JSON lines for a name
    ending in .jsonl or .json, or else when the first non-blank line starts with "{" (the lines before it are held and
    given back), one text per line otherwise."""
    if format not in TEXT_FORMATS:
        raise ValueError(f"unknown input format {format!r}; use one of {', '.join(TEXT_FORMATS)}")
    lines = iter(raw_lines)
    if format != "auto":
        return format, lines
    if str(path).lower().endswith((".jsonl", ".json")):
        return "jsonl", lines
    head = []
    for raw in lines:
        head.append(raw)
        first = raw.decode("utf-8", "replace").lstrip("\ufeff").strip()
        if first:
            return ("jsonl" if first.startswith("{") else "text"), itertools.chain(head, lines)
    return "text", iter(head)


def iter_texts(path: PathLike, format: str = "auto") -> Iterator[tuple[int, str | None]]:
    """``(line number, text)`` of each line of a file of texts (:func:`text_format`; None for a blank line), read
    lazily; a bad line raises :class:`DataError`."""
    with open(path, "rb") as f:
        format, lines = text_format(path, f, format)
        for lineno, raw in enumerate(lines, 1):
            yield lineno, text_of_line(path, lineno, decode_line(path, lineno, raw), format)


def read_texts(path: PathLike, format: str = "auto") -> list[str]:
    """The texts of a file: one per line, or JSON lines with a string field "text" (:func:`text_format`, for the whole
    file); blank lines skipped, bad lines raise :class:`DataError`."""
    return [text for _, text in iter_texts(path, format) if text is not None]


def text_of_line(path: PathLike, lineno: int, line: str, format: str) -> str | None:
    """The text of one line of a file of texts in ``format`` (:func:`text_format`): the line itself (``"text"``), or
    its JSON object's string field "text" (``"jsonl"``); None for a blank line."""
    if not line.strip():
        return None
    if format == "text":
        return line
    record = json_line(path, lineno, line)
    if not isinstance(record.get("text"), str):
        raise DataError(path, lineno, "a JSON line needs a string field 'text'")
    return record["text"]
