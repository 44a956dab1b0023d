"""Streaming input and output for ``zhie predict``, ``zhie segment`` and ``zhie embed``: memory that does not grow
with the input.

Texts are read lazily (:class:`TextReader`) and cut into chunks of ``--chunk-lines`` texts (:func:`chunks`); each
chunk is predicted (sorted by length inside the chunk for batching) and its results are written in input order as
soon as it is done (:func:`write_lines`, :func:`write_npy`). Standard output is flushed after each chunk; an
``--output`` file is written to a temporary name and renamed when the whole input is done, so a bad line or a crash
leaves no half-written file.
"""

from __future__ import annotations

import io
import itertools
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np

from zhie.core.files import atomic_write, check_file_target
from zhie.data import DataError
from zhie.data.base import decode_line, text_of_line

__all__ = ["TextReader", "chunks", "write_lines", "write_npy"]

T = TypeVar("T")
STDIN = "-"


class TextReader:
    """The ``texts`` given on the command line, then those of each file of ``paths`` line by line (``-``: stdin), read
    as :func:`zhie.data.base.read_texts` reads them (blank lines skipped), lazily.

    A bad line raises :class:`DataError` (``FILE:LINE: what; what to do``); with ``skip_bad_lines`` it is skipped and
    counted in ``skipped``. No text at all is an error that names ``command``.
    """

    def __init__(self, texts: Iterable[str], paths: Iterable[str], *, skip_bad_lines: bool = False,
                 command: str = "predict") -> None:
        self.texts, self.paths = list(texts), list(paths)
        self.skip_bad_lines, self.command = skip_bad_lines, command
        self.skipped = 0

    def __iter__(self) -> Iterator[str]:
        count = 0
        for text in itertools.chain(self.texts, *map(self._file_texts, self.paths)):
            count += 1
            yield text
        if not count:
            raise ValueError(f"nothing to {self.command}: give texts as arguments or --input FILE"
                             + (f" ({self.skipped} bad lines skipped)" if self.skipped else ""))

    def _file_texts(self, path: str) -> Iterator[str]:
        return (text for _, text in self.numbered(path))

    def numbered(self, path: str, start: int = 0, end: int | None = None, first: int = 1
                 ) -> Iterator[tuple[int, str]]:
        """``(line number, text)`` of each text of the file ``path`` (``-``: stdin), or of its bytes ``start`` to
        ``end`` (whole lines), the first of which is line ``first``."""
        name = "<stdin>" if path == STDIN else path
        with (open(sys.stdin.fileno(), "rb", closefd=False) if path == STDIN else open(path, "rb")) as f:
            if end is not None:
                f.seek(start)
            lines = f if end is None else io.BytesIO(f.read(end - start))
            for lineno, raw in enumerate(lines, first):
                try:
                    text = text_of_line(name, lineno, decode_line(name, lineno, raw))
                except DataError as err:
                    if not self.skip_bad_lines:
                        raise DataError(err.path, err.line, f"{err.reason}; fix or remove the line, or pass "
                                        "--skip-bad-lines to skip such lines") from None
                    self.skipped += 1
                    continue
                if text is not None:
                    yield lineno, text

    def report(self) -> None:
        """Say on stderr how many bad lines were skipped (nothing when none was)."""
        if self.skipped:
            print(f"zhie: skipped {self.skipped} bad line(s) of {', '.join(self.paths)}", file=sys.stderr)


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last one shorter), read lazily."""
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def write_lines(path: str | None, chunks_of_lines: Iterable[list[str]]) -> None:
    """Write each chunk's lines as it comes: to stdout (flushed after each chunk) or, with ``path``, to a temporary
    file renamed to ``path`` once every chunk is written (removed if one raises)."""

    def write(f, encode: Callable[[str], object]) -> None:
        for lines in chunks_of_lines:
            f.write(encode("".join(line + "\n" for line in lines)))
            f.flush()

    if path is None:
        write(sys.stdout, str)
    else:
        atomic_write(Path(path), lambda f: write(f, str.encode))


def write_npy(path: str, blocks: Iterable[np.ndarray]) -> tuple[int, int]:
    """Write the rows of the 2-d ``blocks`` as one float32 ``.npy`` file without holding them all (the header needs the
    row count: the rows go to a temporary file first); atomically. Returns the array's shape."""
    path = Path(path)
    check_file_target(path)
    rows, width = 0, 0
    with tempfile.TemporaryFile(dir=path.parent) as raw:
        for block in blocks:
            block = np.ascontiguousarray(block, dtype=np.float32)
            rows, width = rows + block.shape[0], block.shape[1]
            raw.write(block.tobytes())
        raw.seek(0)

        def write(f) -> None:
            header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False,
                      "shape": (rows, width)}
            np.lib.format.write_array_header_1_0(f, header)
            shutil.copyfileobj(raw, f)

        atomic_write(path, write)
    return rows, width

