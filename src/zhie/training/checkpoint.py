"""Atomic files and directories, resumable checkpoints and random-number-generator states.

Every write goes to a temporary name in the same directory and is then renamed into place, so a crash
leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import numpy as np
import torch

__all__ = ["atomic_torch_save", "atomic_write", "atomic_write_text", "load_checkpoint", "recover_dir",
           "replace_dir", "rng_state", "set_rng_state"]


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


def atomic_torch_save(obj: object, path: Path) -> None:
    """``torch.save`` to a temporary file next to ``path``, then ``os.replace`` it over ``path``."""
    atomic_write(path, lambda f: torch.save(obj, f))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def load_checkpoint(path: Path) -> dict:
    """Load a checkpoint written by the training loop (tensors and plain python only: ``weights_only``)."""
    return torch.load(path, map_location="cpu", weights_only=True)


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


def rng_state() -> dict:
    """States of python's, numpy's and torch's global generators as tensors and plain python, so that a
    checkpoint holding them loads with ``torch.load(weights_only=True)``."""
    py_version, py_internal, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": {"version": py_version, "internal": torch.tensor(py_internal, dtype=torch.int64),
                   "gauss_next": py_gauss},
        "numpy": {"name": np_name, "keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "cached_gaussian": float(np_gauss)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def set_rng_state(state: dict) -> None:
    """Inverse of :func:`rng_state`."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"].tolist()), py["gauss_next"]))
    npy = state["numpy"]
    np.random.set_state((npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
