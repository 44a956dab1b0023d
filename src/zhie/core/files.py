"""Atomic files and directories: every write goes to a temporary name in the same directory and is then
renamed into place, so a crash leaves either the old file or directory or the new one, never half of one (and
perhaps the temporary name, which :func:`remove_leftovers` clears). A write that fails for want of room (a full disk,
a quota, the file-size limit) raises :class:`NoRoom`, naming what was being written.

What lands has the permissions of a plain ``open(path, "w")`` or ``mkdir``: 0o666 (a directory 0o777) less the
process's umask, although the temporary names are made private (``mkstemp``: 0o600, ``mkdtemp``: 0o700) and
safetensors writes its files 0o600. A model directory written by root is then readable by the user a service runs
as."""

from __future__ import annotations

import errno
import os
import re
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
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o666 & ~umask())
                write(f)
                f.flush()
                os.fsync(f.fileno())
        except NoRoom:  # a nested write's, which names its own file
            raise
        except Exception as err:
            _raise_no_room(err, path, [Path(tmp)])
            raise
        os.replace(tmp, path)
    except BaseException:
        if not keep_partial:
            with suppress(FileNotFoundError):
                os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def append_whole(path: Path, data: bytes) -> None:
    """Append ``data`` (a record's line) to ``path`` whole or not at all: what a failed write (a full disk) put there is
    cut off again, so the file never ends in part of a line. A crash in the middle of the one ``write`` is the one
    case left."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError as err:
            os.ftruncate(fd, size)
            _raise_no_room(err, path, [])
            raise
    finally:
        os.close(fd)


def replace_dir(target: Path, write: Callable[[Path], None]) -> None:
    """Let ``write(tmp_dir)`` fill a fresh temporary directory, then move it to ``target``.

    A directory cannot be renamed over a non-empty one, so an existing ``target`` is first renamed to
    ``.<name>.old`` and deleted after the swap; :func:`recover_dir` puts it back if a crash happened between
    the two renames. If ``write`` raises, ``target`` is untouched and the temporary directory removed.
    """
    target = Path(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        try:
            write(tmp)
            _publish_modes(tmp)
        except Exception as err:
            _raise_no_room(err, target, [Path(root, name) for root, _, names in os.walk(tmp) for name in names])
            raise
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
    """Undo a :func:`replace_dir` interrupted between its two renames, or finish one interrupted after them (the old
    directory, half deleted, is removed)."""
    target = Path(target)
    old = target.with_name(f".{target.name}.old")
    if old.exists() and not target.exists():
        os.replace(old, target)
    elif old.exists():
        shutil.rmtree(old)


# the temporary names of atomic_write and replace_dir: ".NAME." + mkstemp's 8 characters + ".tmp"; ".NAME.old"
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")
_OLD = re.compile(r"^\.(?P<name>.+)\.old$")


def leftover_of(name: str) -> str | None:
    """The name of what the entry ``name`` was being written as, if it is one of :func:`atomic_write`'s and
    :func:`replace_dir`'s temporary names: ``.X.abcd1234.tmp`` is ``X``'s; so are the temporary names and old self
    (``.Y.old``) of a temporary directory ``Y`` of ``X``'s replaced in its turn (a model saved atomically into the
    temporary directory of ``best/``). None for anything else, ``.X.old`` included (:func:`recover_dir` knows whether
    to put it back)."""
    match = _TEMPORARY.match(name)
    if match:
        return leftover_of(match["name"]) or match["name"]
    match = _OLD.match(name)
    if match and _TEMPORARY.match(match["name"]):
        return leftover_of(match["name"])
    return None


def remove_leftovers(directory: Path, name: str | None = None) -> list[Path]:
    """Remove what :func:`atomic_write` and :func:`replace_dir` left in ``directory`` (not below it) when a crash
    (a SIGKILL, a power cut) stopped them before their rename: their temporary files and directories
    (:func:`leftover_of`), of the target ``name`` only when given. Each may be as large as what was being written (a
    checkpoint, a whole model directory), and a run killed again and again would pile them up. Call it only on a
    directory that no other process writes in at the same time (a run directory whose lock the caller holds:
    :func:`zhie.training.checkpoint.claim`); returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for entry in directory.iterdir():
        target = leftover_of(entry.name)
        if target is None or (name is not None and target != name):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with suppress(FileNotFoundError):
                entry.unlink()
        removed.append(entry)
    return removed


# ------------------------------------------------------------------------------------------------ a full disk
NO_ROOM = {errno.ENOSPC: "no space left on the device", errno.EFBIG: "a file would exceed the file-size limit "
           "(ulimit -f)", getattr(errno, "EDQUOT", 122): "the disk quota is exceeded"}


class NoRoom(OSError):
    """A write that failed for want of room (:data:`NO_ROOM`): ``filename`` is what was being written, which is as it
    was before; ``strerror`` says why and what to do (the ``zhie`` command prints ``FILENAME: STRERROR``)."""


def _raise_no_room(err: Exception, path: Path, written: list[Path]) -> None:
    """Raise ``err``, raised while writing ``path`` (into the temporary files ``written``), as a :class:`NoRoom` naming
    ``path`` if it came from a full disk, a quota or the file-size limit; return otherwise. An ``OSError`` with such an
    errno may be anywhere in its chain; safetensors says ``(os error 28)``; torch's writer only ``unexpected pos``, so
    the file system and the limit are looked at too."""
    if isinstance(err, NoRoom):  # a write inside a directory being replaced: the directory is what was not written
        raise NoRoom(err.errno, err.strerror, str(path)) from err
    code = _room_errno(err)
    if code is None and isinstance(err, (OSError, RuntimeError)):  # not a bug's TypeError on a nearly full disk
        code = _room_now(Path(path).parent, written)
    if code is not None:
        raise NoRoom(code, f"not written: {NO_ROOM[code]}; what was there before is kept. Free some space (or raise "
                           "the limit) and run the command again", str(path)) from err


def _room_errno(err: BaseException) -> int | None:
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in NO_ROOM:
            return err.errno
        match = re.search(r"os error (\d+)", str(err))  # a Rust library's io::Error (safetensors, tokenizers)
        if match and int(match[1]) in NO_ROOM:
            return int(match[1])
        err = err.__cause__ or err.__context__
    return None


def _room_now(directory: Path, written: list[Path]) -> int | None:
    """ENOSPC when ``directory``'s file system has less than 1 MiB left, EFBIG when a file of ``written`` has reached
    the process's file-size limit; None otherwise."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):  # not POSIX
        limit = None
    if limit is not None and limit != resource.RLIM_INFINITY:
        with suppress(OSError):
            if any(p.stat().st_size >= limit for p in written):
                return errno.EFBIG
    with suppress(OSError, AttributeError):
        fs = os.statvfs(directory)
        if fs.f_bavail * fs.f_frsize < 1 << 20:
            return errno.ENOSPC
    return None
