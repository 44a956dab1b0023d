"""Atomic files and directories: every write goes to a temporary name in the same directory and is then
renamed into place, so a crash leaves either the old file or directory or the new one, never half of one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


def atomic_write(path: Path, write: Callable[[object], None]) -> None:
    """Call ``write(binary_file)`` on a temporary file next to ``path``, fsync, then rename it to ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def replace_dir(target: Path, write: Callable[[Path], None]) -> None:
    """Let ``write(tmp_dir)`` fill a fresh temporary directory, then move it to ``target``.

    A directory cannot be renamed over a non-empty one, so an existing ``target`` is first renamed to
    ``.<name>.old`` and deleted after the swap; :func:`recover_dir` puts it back if a crash happened between
    the two renames. If ``write`` raises, ``target`` is untouched and the temporary directory removed.
    """
    target = Path(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = target.with_name(f".{target.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def recover_dir(target: Path) -> None:
    """Undo a :func:`replace_dir` interrupted between its two renames."""
    target = Path(target)
    old = target.with_name(f".{target.name}.old")
    if old.exists() and not target.exists():
        os.replace(old, target)


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block: the processes, or threads, that
    take the lock on the same path run their blocks one at a time. The system releases it if the process dies."""
    import fcntl  # POSIX only: imported here so that the rest of this module also works elsewhere

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
