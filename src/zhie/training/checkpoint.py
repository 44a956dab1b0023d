"""Resumable checkpoints (written atomically, see :mod:`zhie.core.files`) and random-number-generator states."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from zhie.core.files import atomic_write, atomic_write_text, recover_dir, replace_dir

__all__ = ["atomic_torch_save", "atomic_write", "atomic_write_text", "load_checkpoint", "recover_dir",
           "replace_dir", "rng_state", "set_rng_state"]


def atomic_torch_save(obj: object, path: Path) -> None:
    """``torch.save`` to a temporary file next to ``path``, then ``os.replace`` it over ``path``."""
    atomic_write(path, lambda f: torch.save(obj, f))


def load_checkpoint(path: Path) -> dict:
    """Load a checkpoint written by the training loop (tensors and plain python only: ``weights_only``)."""
    return torch.load(path, map_location="cpu", weights_only=True)


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
