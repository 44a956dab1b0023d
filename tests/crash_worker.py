"""Runs ``zhie ARGS`` in this process and kills it with SIGKILL at a chosen moment, or runs it with a file-size limit
(tests/test_crash.py):

    python tests/crash_worker.py MOMENT ARGS...

``MOMENT`` is one of:

- ``none``: no kill;
- ``saved:N``: right after the checkpoint of step N (or the first one after it) was written;
- ``writing:N``: in the middle of the N-th checkpoint of this process: half of a task's ``checkpoint.pt`` written
  under its temporary name, or pre-training's whole new output directory written but not renamed into place;
- ``swap:N``: between the two renames of the N-th replacement of an existing directory in this process (``best/``,
  or pre-training's output directory): the directory is missing and its old self is ``.NAME.old``;
- ``finish``: when the job completes its model's record and card, after its last checkpoint;
- ``fsize:BYTES``: no kill; files are limited to BYTES (``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored, so that a write
  past the limit fails with ``EFBIG`` as on a full disk).

Each process runs one torch thread (``OMP_NUM_THREADS=1`` from the test), so that two runs compute the same bits.
"""

from __future__ import annotations

import importlib
import io
import os
import resource
import signal
import sys
from pathlib import Path


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(moment: str) -> None:
    from zhie.core import files
    from zhie.training import rundir, session

    kind, _, value = moment.partition(":")
    n = int(value or 0)
    count = 0
    if kind == "saved":
        save = session.Session.save

        def saved(self) -> None:
            save(self)
            if self.p.step >= n:
                die()

        session.Session.save = saved
    elif kind == "writing":
        import torch

        save_checkpoint, replace = rundir.atomic_torch_save, rundir.replace_dir

        def half(obj, path) -> None:
            nonlocal count
            count += 1
            if count < n:
                return save_checkpoint(obj, path)
            buffer = io.BytesIO()
            torch.save(obj, buffer)
            data = buffer.getvalue()

            def write(f) -> None:
                f.write(data[:len(data) // 2])
                f.flush()
                die()

            files.atomic_write(path, write)

        def snapshot(target: Path, write) -> None:
            nonlocal count
            if Path(target).name == rundir.BEST:
                return replace(target, write)
            count += 1
            return replace(target, write if count < n else lambda directory: (write(directory), die()))

        rundir.atomic_torch_save, rundir.replace_dir = half, snapshot
    elif kind == "swap":
        rename = os.replace

        def replace(src, dst, *args, **kwargs) -> None:
            nonlocal count
            rename(src, dst, *args, **kwargs)
            if str(dst).endswith(".old") and not Path(src).name.startswith("."):  # not a temporary directory's
                count += 1
                if count == n:
                    die()

        os.replace = replace
    elif kind == "finish":
        for name in ("zhie.training.fit", "zhie.training.students"):
            importlib.import_module(name).finish = lambda *args, **kwargs: die()
    elif kind == "fsize":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))
    elif kind != "none":
        raise SystemExit(f"unknown moment {moment!r}")


if __name__ == "__main__":
    arm(sys.argv[1])
    from zhie.cli import main

    sys.exit(main(sys.argv[2:]))
