"""Atomic files and directories: every write goes to a temporary name in the same directory and is then
renamed into place, so a crash leaves either the old file or directory or the new one, never half of one.

What lands has the permissions of a plain ``open(path, "w")`` or ``mkdir``: 0o666 (a directory 0o777) less the
process's umask, although the temporary names are made private (``mkstemp``: 0o600, ``mkdtemp``: 0o700) and
safetensors writes its files 0o600. A model directory written by root is then readable by the user a service runs
as."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path


def umask() -> int:
    """The process's umask (Linux: read from ``/proc``; elsewhere set and restored at once)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _publish_modes(path: Path) -> None:
    """Give ``path`` and, for a directory, everything under it the modes that a plain write would have given them:
    0o666 less the umask for a file, 0o777 less the umask for a directory or an executable file."""
    mask = umask()
    path = Path(path)
    paths = [path]
    for root, dirs, names in os.walk(path):  # nothing for a file; symbolic links are not followed
        paths += [Path(root, name) for name in dirs + names]
    for p in paths:
        mode = os.lstat(p).st_mode
        if not stat.S_ISLNK(mode):
            os.chmod(p, (0o777 if stat.S_ISDIR(mode) or mode & 0o111 else 0o666) & ~mask)


def check_file_target(path: Path) -> None:
    """A clear error, before anything is written, when no file can be written at ``path``: its directory does not
    exist, or ``path`` is a directory."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a directory; give the name of a file to write")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path}: the directory {path.parent} does not exist; create it first, or write "
                                "somewhere else")


PARTIAL = ".partial"  # atomic_write(keep_partial=True): PATH.partial, what a failed write leaves


def partial_path(path: Path) -> Path:
    """Where :func:`atomic_write` with ``keep_partial`` writes ``path`` before renaming it: ``PATH.partial``."""
    return Path(path).with_name(Path(path).name + PARTIAL)


def atomic_write(path: Path, write: Callable[[object], None], *, keep_partial: bool = False) -> None:
    """Call ``write(binary_file)`` on a temporary file next to ``path``, fsync, then rename it to ``path``. If ``write``
    raises, ``path`` is as it was and the temporary file is removed; with ``keep_partial`` it is ``PATH.partial``
    (:func:`partial_path`), which is kept, holding what ``write`` wrote before it raised (a long job's output)."""
    path = Path(path)
    check_file_target(path)
    if keep_partial:
        tmp = partial_path(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    else:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~umask())
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if not keep_partial:
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
        _publish_modes(tmp)
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
