"""Resumable checkpoints (written atomically, see :mod:`zhie.core.files`), the check that a checkpoint belongs to the
run that would resume it (:func:`check_resumable`), random-number-generator states, and the lock of a run directory."""

from __future__ import annotations

import functools
import inspect
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import MISSING, fields
from pathlib import Path

import numpy as np
import torch

from zhie.core.files import atomic_write, atomic_write_text, recover_dir, remove_leftovers, replace_dir

from .config import TrainConfig

__all__ = ["CHECKPOINT_FORMAT", "START_OVER", "atomic_torch_save", "atomic_write", "atomic_write_text",
           "check_resumable", "load_checkpoint", "recover_dir", "replace_dir", "rng_state", "set_rng_state"]

# 3: the model and its loss module under "model" and "loss_fn", the job's data position under "data", each process's
# generators and running loss under "ranks".
# 4: records with a "kind" (step records), the windows of the step records and the evaluations under "ranks".
CHECKPOINT_FORMAT = 4
START_OVER = ("start this run over with --no-resume (resume=False in Python), or give it another output directory "
              "(--out)")


def atomic_torch_save(obj: object, path: Path) -> None:
    """``torch.save`` to a temporary file next to ``path``, then ``os.replace`` it over ``path``."""
    atomic_write(path, lambda f: torch.save(obj, f))


def load_checkpoint(path: Path) -> dict:
    """Load a checkpoint written by the training loop (tensors and plain python only: ``weights_only``)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def check_resumable(saved: dict, current: dict, resumable: frozenset[str], path: Path) -> None:
    """Refuse to resume a checkpoint written by a run that would compute something else: ``saved`` and ``current``
    are the ``meta`` of the checkpoint and of this run (``format``, the :class:`TrainConfig` as a dict under
    ``config``, the job's own settings); ``resumable``: the config fields that may differ."""
    if saved.get("format") != current["format"]:
        raise ValueError(f"{path} has checkpoint format {saved.get('format')!r}, this version writes "
                         f"{current['format']}; {START_OVER}")
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.default is not MISSING}
    old = {**defaults, **saved["config"]}  # a field added since the checkpoint was written had its default then
    changes = [_change(f"config.{key}", old.get(key), value)
               for key, value in current["config"].items() if key not in resumable and old.get(key) != value]
    changes += [_change(key, saved[key], value) if key in saved else f"{key}: not recorded by the run that wrote it"
                for key, value in current.items() if key not in ("config", "format") and saved.get(key) != value]
    if changes:
        raise ValueError(f"{path} was written by a different run; resuming it would mix two runs. What differs:\n  "
                         + "\n  ".join(changes) + f"\nRun with the same settings and data, or {START_OVER}")


def _change(key: str, old, new) -> str:
    """One line of a refused resume: ``key`` was ``old``, is now ``new`` (long values cut; a data file's hash says
    that the file changed)."""
    if key.startswith("data."):
        return f"{key}: the file's contents changed (sha256 {str(old)[:12]}… -> {str(new)[:12]}…)"
    old, new = repr(old), repr(new)
    return f"{key}: {old if len(old) <= 80 else old[:77] + '...'} -> {new if len(new) <= 80 else new[:77] + '...'}"


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


@contextmanager
def claim(out_dir: Path) -> Iterator[None]:
    """Hold the lock of the run directory ``out_dir`` for a training job (the main process's): a second job on the
    same directory is refused at once instead of interleaving its checkpoints with the first's. The lock file lives
    beside the directory (``.NAME.lock``), since a job may replace the directory itself; the system releases the lock
    if the process dies. The file stays when the lock is released: a job that opened it just before would otherwise
    lock the removed file while a third job locks a new one at the same path, and both would hold the directory.

    Holding the lock, it removes the temporary files and directories that a killed job's atomic writes left in the
    directory, and beside it for the directory itself (:func:`zhie.core.files.remove_leftovers`): nobody else writes
    there now."""
    from filelock import FileLock, Timeout

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(out_dir.with_name(f".{out_dir.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise ValueError(f"{out_dir} is in use: another training process holds its lock ({lock.lock_file}); wait "
                         "for it to end, or give this run another --out") from None
    try:
        remove_leftovers(out_dir.parent, out_dir.name)
        remove_leftovers(out_dir)
        yield
    finally:
        lock.release()


def claims_out(job: Callable) -> Callable:
    """A training job (a function with an ``out`` argument, the run directory) that runs holding that directory's
    :func:`claim` on the main process (the others write nothing there)."""
    signature = inspect.signature(job)

    @functools.wraps(job)
    def claimed(*args, **kwargs):
        from zhie.dist import is_main_process

        out = Path(signature.bind(*args, **kwargs).arguments["out"])
        with claim(out) if is_main_process() else nullcontext():
            return job(*args, **kwargs)

    return claimed
