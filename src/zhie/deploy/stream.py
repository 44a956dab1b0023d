"""Streaming input and output for ``zhie predict``, ``zhie segment`` and ``zhie embed``: one output per input line, in
order, with memory that does not grow with the input.

Input lines are read lazily (:class:`TextReader`): each is a :class:`Line`, its text ("" for a blank line) or, for a
bad line skipped with ``--skip-bad-lines``, why it was skipped. The pipeline's ``stream``
(:meth:`zhie.tasks.pipeline.Pipeline.stream`) predicts their texts chunk by chunk (:func:`predicted`), and each line's
output is written as it comes (:func:`write_lines`, :func:`write_npy`): standard output is flushed after each chunk;
an ``--output`` file is written as ``FILE.partial`` and renamed to ``FILE`` when the whole input is done, so that a
failure late in a long run leaves ``FILE`` as it was and the outputs done so far in ``FILE.partial`` (whose line
count is printed).
"""

from __future__ import annotations

import contextlib
import gc
import io
import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zhie.core.files import atomic_write, partial_path
from zhie.data import DataError
from zhie.data.base import decode_line, text_format, text_of_line
from zhie.tasks.batching import chunks

__all__ = ["Line", "TextReader", "mask_path", "predicted", "write_lines", "write_npy"]

STDIN = "-"
SHOWN_BAD_LINES = 5  # bad lines named on stderr by TextReader.report


@dataclass(frozen=True)
class Line:
    """One input of a streamed command: its ``text`` ("" for a blank line), where it comes from (``path`` and the
    1-based line ``number``; a text given as an argument: ``path`` None and its position), and ``error``: why a bad
    line was skipped (``--skip-bad-lines``; its ``text`` is then "")."""

    path: str | None
    number: int
    text: str
    error: str | None = None


class TextReader:
    """The ``texts`` given on the command line, then each line of each file of ``paths`` (``-``: stdin) as a
    :class:`Line`, lazily: one per line, blank lines included. A file holds one text per line or JSON lines with a
    string field "text" (``input_format``: ``text``, ``jsonl``, or ``auto``: decided once per file by
    :func:`zhie.data.base.text_format`).

    A bad line raises :class:`DataError` (``FILE:LINE: what; what to do``); with ``skip_bad_lines`` it is a line with
    its ``error``, counted in ``skipped`` (the first few kept in ``bad_lines``). No input line at all is an error that
    names ``command``.
    """

    def __init__(self, texts: Iterable[str], paths: Iterable[str], *, skip_bad_lines: bool = False,
                 input_format: str = "auto", command: str = "predict") -> None:
        self.texts, self.paths = list(texts), list(paths)
        self.skip_bad_lines, self.input_format, self.command = skip_bad_lines, input_format, command
        self.skipped, self.bad_lines = 0, []

    def __iter__(self) -> Iterator[Line]:
        count = 0
        given = (Line(None, i, text) for i, text in enumerate(self.texts, 1))
        for line in itertools.chain(given, *map(self.numbered, self.paths)):
            count += 1
            yield line
        if not count and len(self.paths) == 1:
            raise DataError("<stdin>" if self.paths[0] == STDIN else self.paths[0], 1,
                            f"empty file: nothing to {self.command} (a file with a text per line)")
        if not count:
            raise ValueError(f"nothing to {self.command}: give texts as arguments or --input FILE (a file with lines)")

    def numbered(self, path: str, start: int = 0, end: int | None = None, first: int = 1,
                 input_format: str | None = None) -> Iterator[Line]:
        """The lines of the file ``path`` (``-``: stdin), or of its bytes ``start`` to ``end`` (whole lines), the first
        of which is line ``first``; ``input_format``: the file's, when already decided (default: this reader's)."""
        name = "<stdin>" if path == STDIN else path
        with (open(sys.stdin.fileno(), "rb", closefd=False) if path == STDIN else open(path, "rb")) as f:
            if end is not None:
                f.seek(start)
            format, raws = text_format(name, f if end is None else io.BytesIO(f.read(end - start)),
                                       input_format or self.input_format)
            for lineno, raw in enumerate(raws, first):
                try:
                    text = text_of_line(name, lineno, decode_line(name, lineno, raw), format)
                except DataError as err:
                    if not self.skip_bad_lines:
                        raise DataError(err.path, err.line, f"{err.reason}; fix or remove the line, or pass "
                                        "--skip-bad-lines to go on past such lines") from None
                    self.skipped += 1
                    line = Line(name, lineno, "", err.reason)
                    if len(self.bad_lines) < SHOWN_BAD_LINES:
                        self.bad_lines.append(line)
                    yield line
                    continue
                yield Line(name, lineno, "" if text is None else text)

    def report(self) -> None:
        """Say on stderr how many bad lines were skipped, and which (nothing when none was)."""
        if self.skipped:
            shown = "".join(f"\n  {line.path}:{line.number}: {line.error}" for line in self.bad_lines)
            more = self.skipped - len(self.bad_lines)
            print(f"zhie: skipped {self.skipped} bad line(s) of {', '.join(self.paths)} (each still has its "
                  f"output line, which in JSON lines says why):{shown}" + (f"\n  and {more} more" if more > 0 else ""),
                  file=sys.stderr)


def predicted(lines: Iterable[Line], stream: Callable[[Iterable[str]], Iterator]) -> Iterator[tuple[Line, Any]]:
    """Each of ``lines`` with its prediction, in order: ``stream`` (a pipeline's ``stream`` with its options) predicts
    their texts (a skipped line's is "", whose empty prediction is not used); the lines of one chunk are held."""
    ahead, behind = itertools.tee(lines)
    return zip(behind, stream(line.text for line in ahead))


def _stopped(done: int, paths: list[Path]) -> None:
    print(f"zhie: stopped after {done} input line(s); their output is kept in {' and '.join(map(str, paths))}",
          file=sys.stderr)


def write_lines(path: str | None, lines: Iterable[str], flush_every: int) -> int:
    """Write each of ``lines`` as it comes, to stdout (flushed every ``flush_every`` lines: each chunk) or, with
    ``path``, to ``PATH.partial``, renamed to ``path`` once every line is written; if one raises, ``PATH.partial`` is
    kept with the lines before it, and stderr says how many. Returns the number of lines."""
    done = 0

    def write(f, encode: Callable[[str], object]) -> None:
        nonlocal done
        for line in lines:
            f.write(encode(line + "\n"))
            done += 1
            if done % flush_every == 0:
                f.flush()
        f.flush()

    if path is None:
        write(sys.stdout, str)
        return done
    try:
        atomic_write(Path(path), lambda f: write(f, str.encode), keep_partial=True)
    except BaseException:
        _stopped(done, [partial_path(Path(path))])
        raise
    return done


def mask_path(path: str | Path) -> Path:
    """The mask written next to ``zhie embed --output PATH``: ``vectors.npy`` -> ``vectors.mask.npy``."""
    path = Path(path)
    return path.with_name(path.name.removesuffix(".npy") + ".mask.npy")


class NpyRows:
    """A ``.npy`` array written into a binary file block by block, its header rewritten after each block, so that the
    file is a whole array of the rows so far at any time (numpy leaves room in a header for the row count to grow:
    ``numpy.lib.format.GROWTH_AXIS_MAX_DIGITS``)."""

    def __init__(self, dtype: type) -> None:
        self.dtype, self.shape, self.header = np.dtype(dtype), (0,), 0

    def append(self, f, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block, dtype=self.dtype)
        if not self.header:
            self.shape = (0, *block.shape[1:])
            self.header = self._write_header(f)
        f.write(block.tobytes())
        self.shape = (self.shape[0] + len(block), *self.shape[1:])
        f.seek(0)
        if self._write_header(f) != self.header:  # numpy before 1.24 had no room for the count to grow
            raise RuntimeError(f"the .npy header grew with its row count; upgrade numpy ({np.__version__})")
        f.seek(0, io.SEEK_END)
        f.flush()

    def close(self, f, width: tuple[int, ...] = ()) -> None:
        """Give an array that got no row its header (shape ``(0, *width)``)."""
        if not self.header:
            self.shape = (0, *width)
            self.header = self._write_header(f)

    def _write_header(self, f) -> int:
        start = f.tell()
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                 "fortran_order": False, "shape": self.shape})
        return f.tell() - start


def write_npy(path: str, rows: Iterable[tuple[np.ndarray, bool]], block_rows: int) -> tuple[int, ...]:
    """Write the vectors of ``rows`` (``(vector, holds a text)``, one per input line) as one float32 ``[n, width]``
    ``.npy`` file ``path``, and whether each holds a text as the ``[n]`` bool array of :func:`mask_path`, ``block_rows``
    rows at a time, without holding them all: each to ``PATH.partial`` (a whole array after each block), renamed at
    the end, the mask first; if a row raises, the ``.partial`` files are kept with the rows before it, and stderr says
    how many. Returns the array's shape."""
    path = Path(path)
    mask = mask_path(path)
    vectors, holds = NpyRows(np.float32), NpyRows(np.bool_)

    def write(f, m) -> None:
        for block in chunks(rows, block_rows):
            vectors.append(f, np.stack([vector for vector, _ in block]))
            holds.append(m, np.array([text for _, text in block], dtype=np.bool_))
        vectors.close(f, (0,))
        holds.close(m)

    try:
        atomic_write(path, lambda f: atomic_write(mask, lambda m: write(f, m), keep_partial=True), keep_partial=True)
    except BaseException:
        _stopped(vectors.shape[0], [partial_path(path), partial_path(mask)])
        raise
    return vectors.shape


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (where it was running) while a command of one process (``zhie predict``,
    ``segment``, ``embed``, ``eval``) streams its texts, and restored after. The predictions make a few small objects
    per entity or word (hits, spans, their tuples), none in a reference cycle: the collector's passes over them took
    ~10 % of ``zhie predict``'s time for a word segmenter (SXU's 3,654 sentences, 113,746 words). Reference counting
    still frees every object. Never in a library call or the service, whose other threads (the event loop) the
    pause would reach too."""
    running = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if running:
            gc.enable()
