"""What the benchmark scripts share: where the data is, where results go, and how a run describes its machine."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from filelock import FileLock, Timeout

ROOT = Path(__file__).resolve().parents[1]
# The datasets of ../shared/data; ZHIE_DATA points elsewhere (e.g. a copy carried to a GPU machine).
DATA = Path(os.environ.get("ZHIE_DATA") or ROOT.parent / "shared" / "data")
RESULTS = Path(os.environ.get("ZHIE_RESULTS") or ROOT / "benchmarks" / "results")
# The campaign's run directories, worktrees and the machine lock (benchmarks/campaign.py), outside the repository.
CAMPAIGN_DIR = Path(os.environ.get("ZHIE_CAMPAIGN_DIR") or ROOT.parent / "campaign")
LOCK_HELD_ENV = "ZHIE_MACHINE_LOCK_HELD"  # set by machine_lock while it holds the lock


@contextmanager
def machine_lock(directory: Path = CAMPAIGN_DIR):
    """Hold the machine for one benchmark: a second benchmark (or the campaign runner's next row) waits until this
    one ends, so that two never share the cores. While held, ``LOCK_HELD_ENV`` is set in this process's environment,
    so what the holder starts passes instead of waiting forever for its own parent: the campaign runner's rows, and
    ``students.py`` training its teacher by ``ner.py``. ``--help`` passes too (it measures nothing)."""
    if os.environ.get(LOCK_HELD_ENV) or {"-h", "--help"} & set(sys.argv[1:]):
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    lock = FileLock(directory / "machine.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"waiting for another benchmark to finish (lock {directory / 'machine.lock'}; "
              f"`python benchmarks/campaign.py status` says which)", file=sys.stderr, flush=True)
        lock.acquire()
    os.environ[LOCK_HELD_ENV] = "1"
    try:
        yield
    finally:
        del os.environ[LOCK_HELD_ENV]
        lock.release()


# Runs a command and prints ``[wall seconds, peak resident KiB, exit code]``. A child's ``ru_maxrss`` is at least its
# parent's resident size at the fork (Linux's exec keeps the old image's high-water mark), so a benchmark that has
# imported torch (~300 MB) saw every command it ran as that large; this small process forks the command instead.
LAUNCHER = """import json, os, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps([time.perf_counter() - start, usage.ru_maxrss, os.waitstatus_to_exitcode(status)]))"""


def run_measured(argv: list[str]) -> tuple[float, float]:
    """``(wall seconds, peak resident MiB)`` of one process running ``argv`` to its end (its output discarded), measured
    from a small launcher (:data:`LAUNCHER`): the command's own peak, not the benchmark's. Exits with the command's
    error output if it fails."""
    done = subprocess.run([sys.executable, "-c", LAUNCHER, *argv], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"{' '.join(argv)}: the launcher failed: {done.stderr[-2000:]}")
    wall, kib, code = json.loads(done.stdout)
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} failed (exit {code}): {done.stderr[-2000:]}")
    return wall, kib / 1024


def compile_zhie() -> None:
    """Write the bytecode of zhie's modules, as installing a wheel does, before whole processes are timed. An editable
    install leaves that to the first import, and an environment with ``PYTHONDONTWRITEBYTECODE`` set (as this
    project's machines are) never writes it: every timed ``zhie`` process would compile its ~30 modules again
    (~0.04 s here), while the peers, installed by pip, come compiled."""
    import compileall

    import zhie

    compileall.compile_dir(Path(zhie.__file__).parent, quiet=1)


def peak_memory_mb() -> float:
    """Peak GPU memory allocated by torch on CUDA, else the process's peak resident set size."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads"


def portable_paths(text: str, runs: Path | str = CAMPAIGN_DIR / "runs", tree: Path | str | None = ROOT,
                   beside: bool = True) -> str:
    """``text`` without a machine's paths, the one place where they are rewritten: the run directories under ``runs``
    as ``RUNS/`` (as RESULTS.md names them; this machine's campaign's by default, or a GPU machine's), the datasets
    (:data:`DATA`, wherever ``ZHIE_DATA`` put them) as ``../shared/data/``, the files of the repository ``tree``
    relative to it (this one, or a campaign's worktree; None: left as they are), and, with ``beside``, what lies beside
    the tree as ``../`` (``../shared``, a peers' environment)."""
    text = text.replace(f"{runs}/", "RUNS/").replace(f"{DATA}/", "../shared/data/")
    if tree is None:
        return text
    text = text.replace(f"{tree}/", "")
    return text.replace(f"{Path(tree).parent}/", "../") if beside and Path(tree).parent.name else text


def append_result(name: str, row: dict) -> None:
    """Append one JSON line to ``RESULTS/name.jsonl`` (its paths as :func:`portable_paths` writes them) and print
    it."""
    line = portable_paths(json.dumps(row, ensure_ascii=False))
    RESULTS.mkdir(parents=True, exist_ok=True)
    with (RESULTS / f"{name}.jsonl").open("a", encoding="utf-8") as f:
        f.write(line + "\n")
    print(line)


def once(directory: Path, fn, *args, **kwargs) -> dict:
    """``fn(*args, **kwargs)`` (a dict) unless ``directory/done.json`` holds it from an earlier session; kept there
    with the seconds it took. With trainings that resume from their checkpoint, a benchmark of several runs then
    continues where a stopped session left it (benchmarks/campaign.py) and prints the same rows."""
    marker = directory / "done.json"
    if marker.exists():
        return json.loads(marker.read_text())
    start = time.perf_counter()
    result = {**(fn(*args, **kwargs) or {}), "seconds": round(time.perf_counter() - start, 1)}
    directory.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(result, ensure_ascii=False))
    return result


def trained_with(out: Path) -> dict:
    """The batch size and learning rates the run trained with (zhie's defaults resolved), from its training.json."""
    config = json.loads((out / "best" / "training.json").read_text(encoding="utf-8"))["train_config"]
    return {k: config[k] for k in ("batch_size", "lr", "head_lr")}
