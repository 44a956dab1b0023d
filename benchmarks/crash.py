"""Runs killed with SIGKILL at random moments (issue 51): every training job resumes to the weights of the run that
was never interrupted, and a kill never leaves a torn file where zhie would read a real one.

    python benchmarks/crash.py [--kills 20] [--jobs train distill pretrain] [--seed 0] [--work DIR]

For each job, on data written here (``zhie.demo``'s sentences) with tiny models: ``zhie train ner`` (the random
``tiny`` encoder, GlobalPointer), ``zhie distill student`` (a 1-layer cut of the train job's model, which is its
teacher, with unlabelled text) and ``zhie pretrain`` (a 1-layer BERT of width 32), each saving a checkpoint every 2
steps (and ``best/`` at the evaluations that improve, or, for ``pretrain``, its whole directory) so that kills land
mid-save too:

1. the job runs once uninterrupted: the reference weights, and its duration ``D`` (and ``W``, when it first wrote);
2. in a fresh directory the same command runs and is killed (SIGKILL to its process group) after a delay drawn
   uniformly in ``[W, D]`` (``random.Random(--seed)``), then launched again (it resumes), and so on until a launch
   ends by itself; when it ended with fewer than ``--kills`` kills, another round starts in another fresh directory;
3. after every kill each file of the run directory is checked whole: JSON, JSON lines (the last line ended), TOML
   parse, ``.pt`` files load with ``torch.load(weights_only=True)`` (the stored teacher outputs with zhie's own
   loader, which allows their item types), ``.safetensors`` files load, PNGs end with their IEND chunk, ``best/`` has
   every file of the reference's; zhie's temporary names (``.NAME.XXXXXXXX.tmp``, ``.NAME.old``) are counted apart
   (a kill mid-save leaves one, which zhie never reads and removes when the next launch takes the run directory),
   and those still there when a round ends are reported: they would pile up;
4. at the end of each round the weights must be bit-identical to the reference's: every tensor of ``best/`` (for
   ``pretrain``, of the encoder directory), the checkpoint's model, optimizer state and step, and the records of
   ``metrics.jsonl`` and ``training.json`` without their clock times.

Every process runs one torch thread (``OMP_NUM_THREADS=1``), as the reference does; Python's hash seed is left random,
so a resume that depended on it would show. Rows (``results/crash.jsonl``), one per job: kills, launches, resumes
(launches that found a checkpoint), rounds, whether every round was identical, the torn files found, the kills that
left a temporary file (mid-save), the most temporary files seen at once and those left when a round ended.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from common import append_result, machine_lock

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ZHIE = [sys.executable, "-c", "from zhie.cli import main; raise SystemExit(main())"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
       "TOKENIZERS_PARALLELISM": "false"}
TEMPORARY = re.compile(r"^\..+\.(tmp|old)$")  # zhie.core.files: mkstemp/mkdtemp names, a replaced directory's old self
CLOCK = ("elapsed_s", "tokens_per_s", "saved", "finished")  # what differs between two runs of the same computation
BERT = "new:bert:layers=1,hidden=32,heads=2,intermediate=64"


# ---------------------------------------------------------------------------------------------------------- the jobs
def write_data(work: Path) -> None:
    """The jobs' inputs in ``work``: NER train and dev sets, unlabelled sentences, a corpus of paragraphs."""
    from zhie import demo
    from zhie.data import write_ner_jsonl

    write_ner_jsonl(demo.make_corpus(96, seed=1), work / "train.jsonl")
    write_ner_jsonl(demo.make_corpus(16, seed=2), work / "dev.jsonl")
    (work / "unlabelled.txt").write_text("".join(ex.text + "\n" for ex in demo.make_corpus(64, seed=3)),
                                         encoding="utf-8")
    sentences = [ex.text for ex in demo.make_corpus(1200, seed=6)]
    (work / "corpus.txt").write_text("".join("".join(sentences[i:i + 6]) + "\n" for i in range(0, 1200, 6)),
                                     encoding="utf-8")


def command(job: str, work: Path, out: Path) -> list[str]:
    """The ``zhie`` command line of ``job`` writing into ``out`` (the distillation's teacher: the train job's
    reference model)."""
    common = ["--save-every", "2", "--seed", "0", "--quiet", "--out", str(out)]
    if job == "train":
        return [*ZHIE, "train", "ner", "--train", str(work / "train.jsonl"), "--dev", str(work / "dev.jsonl"),
                "--encoder", "tiny", "--head", "gp", "--max-length", "32", "--epochs", "3", "--batch-size", "8",
                "--eval-every", "6", "--log-every", "4", *common]
    if job == "distill":
        return [*ZHIE, "distill", "student", "--teacher", str(teacher(work)), "--train", str(work / "train.jsonl"),
                "--dev", str(work / "dev.jsonl"), "--unlabelled", str(work / "unlabelled.txt"), "--encoder-layers",
                "1", "--epochs", "2", "--batch-size", "8", "--lr", "2e-3", "--eval-every", "6", "--log-every", "4",
                *common]
    return [*ZHIE, "pretrain", "--corpus", str(work / "corpus.txt"), "--encoder", BERT, "--steps", "24",
            "--batch-size", "4", "--max-length", "64", "--heldout", "20", "--shuffle-buffer", "16", "--lr", "1e-3",
            "--eval-every", "6", "--log-every", "4", *common]


def teacher(work: Path) -> Path:
    return work / "train" / "reference" / "run" / "best"


def run_dir(job: str, round_dir: Path) -> Path:
    return round_dir / ("encoder" if job == "pretrain" else "run")


def reference(job: str, work: Path) -> dict:
    """Run ``job`` uninterrupted into ``work/JOB/reference``: its duration and when it first wrote into its output."""
    out = run_dir(job, work / job / "reference")
    if job == "distill" and not teacher(work).exists():
        reference("train", work)
    if (out.parent / "timing.json").exists():  # an earlier session of this benchmark ran it
        return json.loads((out.parent / "timing.json").read_text())
    shutil.rmtree(out.parent, ignore_errors=True)
    out.parent.mkdir(parents=True)
    start = time.perf_counter()
    proc = launch(job, work, out)
    first = None
    while proc.poll() is None:
        if first is None and out.exists():
            first = time.perf_counter() - start
        time.sleep(0.02)
    if proc.returncode != 0:
        raise SystemExit(f"the reference {job} run failed (exit {proc.returncode}); see {out.parent / 'stderr.txt'}")
    timing = {"duration_s": time.perf_counter() - start, "first_write_s": first or 0.0}
    (out.parent / "timing.json").write_text(json.dumps(timing))
    return timing


def launch(job: str, work: Path, out: Path) -> subprocess.Popen:
    with open(out.parent / "stderr.txt", "a") as err:
        return subprocess.Popen(command(job, work, out), cwd=work, env=ENV, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)


# ----------------------------------------------------------------------------------------------------- the checks
def leftovers(root: Path) -> list[str]:
    """zhie's temporary names under ``root`` (not inside one another)."""
    found = []
    for path, dirs, names in os.walk(root):
        for name in names + dirs:
            if TEMPORARY.match(name):
                found.append(str(Path(path, name).relative_to(root)))
        dirs[:] = [d for d in dirs if not TEMPORARY.match(d)]
    return sorted(found)


def torn(root: Path, best_files: set[str], item_types: tuple) -> list[str]:
    """What is not whole among the real files under ``root`` (zhie's temporary names are left out)."""
    from safetensors.torch import load_file

    from zhie.training.teachers import load_lessons

    problems = []
    for path, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not TEMPORARY.match(d)]
        for name in names:
            if TEMPORARY.match(name) or name.endswith(".lock"):
                continue
            file = Path(path, name)
            try:
                check_file(file, load_file, lambda p: load_lessons(p, item_types))
            except Exception as err:  # noqa: BLE001 - anything that does not load is what this looks for
                problems.append(f"{file.relative_to(root)}: {type(err).__name__}: {str(err)[:200]}")
    for best in [root / "run" / "best"] if best_files else []:
        if not best.is_dir():
            if (root / "run" / ".best.old").is_dir():
                continue  # killed between replace_dir's two renames: the next launch puts the old one back
            if (root / "run" / "checkpoint.pt").exists():
                problems.append("run/best: missing although a checkpoint exists")
            continue
        missing = best_files - {p.name for p in best.iterdir()}
        if missing:
            problems.append(f"run/best: lacks {sorted(missing)}")
    return problems


def check_file(file: Path, load_safetensors, load_lessons) -> None:
    suffix = file.suffix
    if suffix == ".json":
        json.loads(file.read_text(encoding="utf-8"))
    elif suffix == ".jsonl":
        text = file.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):
            raise ValueError("the last line is not ended")
        for line in text.splitlines():
            json.loads(line)
    elif suffix == ".toml":
        tomllib.loads(file.read_text(encoding="utf-8"))
    elif suffix == ".pt":
        if file.parent.name == "teacher":
            load_lessons(file)
        else:
            torch.load(file, map_location="cpu", weights_only=True)
    elif suffix == ".safetensors":
        load_safetensors(str(file))
    elif suffix == ".png":
        data = file.read_bytes()
        if not (data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(b"IEND\xaeB`\x82")):
            raise ValueError("not a whole PNG")
    elif suffix in (".md", ".txt"):
        file.read_text(encoding="utf-8")


# -------------------------------------------------------------------------------------------------- the comparison
def untimed(value):
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k not in CLOCK}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def tensors(out: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the saved model (``best/``, or pre-training's encoder directory) by file and name."""
    from safetensors.torch import load_file

    model = out / "best" if (out / "best").is_dir() else out
    return {f"{f.name}:{k}": v for f in sorted(model.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def flat(state, prefix: str = "") -> dict:
    """The tensors and plain values of a nested state (an optimizer's), by path."""
    if isinstance(state, dict):
        return {k: v for key, value in state.items() for k, v in flat(value, f"{prefix}{key}.").items()}
    if isinstance(state, (list, tuple)):
        return {k: v for i, value in enumerate(state) for k, v in flat(value, f"{prefix}{i}.").items()}
    return {prefix[:-1]: state}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and \
            a.shape == b.shape and torch.equal(a, b)
    return a == b


def differences(ref: Path, out: Path) -> list[str]:
    """How the run in ``out`` differs from the reference run in ``ref`` (nothing: bit-identical)."""
    diffs = []
    a, b = tensors(ref), tensors(out)
    if not a:
        diffs.append("the reference saved no model")
    diffs += [f"model {k}" for k in sorted(a.keys() | b.keys()) if k not in a or k not in b or not same(a[k], b[k])]
    ca, cb = (torch.load(d / "checkpoint.pt", map_location="cpu", weights_only=True) for d in (ref, out))
    if ca["progress"]["step"] != cb["progress"]["step"]:
        diffs.append(f"checkpoint step {ca['progress']['step']} != {cb['progress']['step']}")
    for part in ("model", "loss_fn", "optimizer", "scheduler", "ema", "data"):
        fa, fb = flat(ca[part]), flat(cb[part])
        diffs += [f"checkpoint {part}.{k}" for k in sorted(fa.keys() | fb.keys())
                  if k not in fa or k not in fb or not same(fa[k], fb[k])]
    if untimed(ca["progress"]) != untimed(cb["progress"]):
        diffs.append("checkpoint progress (records, best score)")
    if untimed(ca["ranks"][0]["window"]) != untimed(cb["ranks"][0]["window"]):
        diffs.append("checkpoint window")
    records = [untimed([json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()])
               for d in (ref, out)]
    if records[0] != records[1]:
        diffs.append("metrics.jsonl")
    for name in ("best/training.json", "pretrain.json", "best/zhie.json", "data_stats.json"):
        if (ref / name).exists():
            texts = [(d / name).read_text(encoding="utf-8").replace(str(d), "OUT") for d in (ref, out)]
            if untimed(json.loads(texts[0])) != untimed(json.loads(texts[1])):
                diffs.append(name)
    return diffs


# ------------------------------------------------------------------------------------------------------- a job
def crash(job: str, work: Path, kills: int, rng: random.Random) -> dict:
    """Rounds of kills and resumes of ``job`` until ``kills`` kills have been made (module docstring)."""
    from zhie import tasks

    timing = reference(job, work)
    ref = run_dir(job, work / job / "reference")
    best_files = {p.name for p in (ref / "best").iterdir()} if job != "pretrain" else set()
    item_types = tasks.get("ner").item_types
    made = launches = resumes = rounds = mid_save = 0
    torn_files, identical, most_left, left_at_end, rounds_diffs = [], True, 0, [], []
    start = time.perf_counter()
    while made < kills:
        rounds += 1
        round_dir = work / job / f"round{rounds}"
        shutil.rmtree(round_dir, ignore_errors=True)
        round_dir.mkdir(parents=True)
        out = run_dir(job, round_dir)
        while True:
            resumes += (out / "checkpoint.pt").exists()
            launches += 1
            proc = launch(job, work, out)
            delay = rng.uniform(timing["first_write_s"], timing["duration_s"])
            try:
                code = proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                made += 1
                left = leftovers(round_dir)
                mid_save += bool(left)
                most_left = max(most_left, len(left))
                found = torn(round_dir, best_files, item_types)
                torn_files += [f"round {rounds}, kill {made}: {p}" for p in found]
                continue
            if code != 0:
                raise SystemExit(f"{job}: a launch failed (exit {code}); see {round_dir / 'stderr.txt'}")
            break
        left = leftovers(round_dir)
        left_at_end += [f"round {rounds}: {name}" for name in left]
        diffs = differences(ref, out)
        identical &= not diffs
        rounds_diffs.append(diffs[:10])
        if not diffs:
            shutil.rmtree(round_dir)  # keep only what differs, to look at
    return {"job": job, "kills": made, "launches": launches, "resumes": resumes, "rounds": rounds,
            "identical": identical, "torn_files": torn_files, "mid_save_kills": mid_save,
            "most_temporary_files": most_left, "temporary_files_left": left_at_end,
            "differences": [d for d in rounds_diffs if d], "reference_s": round(timing["duration_s"], 1),
            "first_write_s": round(timing["first_write_s"], 1), "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs per job, at least (default 20)")
    p.add_argument("--jobs", nargs="+", default=["train", "distill", "pretrain"],
                   choices=["train", "distill", "pretrain"])
    p.add_argument("--seed", type=int, default=0, help="seeds the kills' delays")
    p.add_argument("--work", default=None, help="working directory (default: a temporary one, removed at the end)")
    args = p.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="zhie-crash-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    try:
        write_data(work)
        for job in args.jobs:
            row = crash(job, work, args.kills, rng)
            print(f"{job}: {row['kills']} kills, {row['resumes']} resumes over {row['rounds']} rounds, identical: "
                  f"{'yes' if row['identical'] else 'NO'}, torn files: {len(row['torn_files'])}, mid-save kills: "
                  f"{row['mid_save_kills']}, temporary files left: {len(row['temporary_files_left'])}",
                  file=sys.stderr, flush=True)
            append_result("crash", {**row, "kills_asked": args.kills, "seed": args.seed,
                                    "command": shlex_join(command(job, Path("WORK"), Path("OUT"))),
                                    "load_avg": os.getloadavg()[0], "machine": f"{os.cpu_count()} CPUs, 1 thread",
                                    "date": str(date.today())})
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


def shlex_join(argv: list[str]) -> str:
    import shlex

    return shlex.join(["zhie", *argv[len(ZHIE):]])


if __name__ == "__main__":
    with machine_lock():
        main()
