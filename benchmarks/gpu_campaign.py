"""The campaign's rows (benchmarks/campaign.py) on a GPU machine, many at a time on the one GPU (CUDA MPS).

    python benchmarks/device_pack.py --campaign e/ b/                       # here: .gpu-pack/ (rows, code, data)
    python3 benchmarks/gpu_campaign.py --parallel 16 --seconds 540 --stagger 20 --save-every 300
                                            # there (copy .gpu-pack there); again while rows are left
    python benchmarks/campaign.py import DIR/gpu_rows.jsonl     # here, with the last call's file

Runs the rows of ``.gpu-pack/rows.txt`` (key, then the command as ``campaign.device_command`` gives it) from
``.gpu-pack/tree`` (the code of the plan's commit), with e5-small's pruned copy as ``--encoder`` (students.py: as
zhie's e5-small), ``--parallel`` at a time, for at most ``--seconds``, once every module of ``.gpu-pack/requires.txt``
(zhie's training dependencies) imports; a row that reads another's directory (a student, its teachers) waits for it
and fails with it; rows that write into one shared directory (``--out {runs}/...``) start
``--stagger`` seconds apart, and MTMT's rows of one seed, active learning's of one strategy, run one after another
(MTMT's ablations reuse the seed's teachers if they were trained on this machine; otherwise they train their own, so
keep an ablation row and the systems it is compared with in one row or on one machine). Then every finished row goes to
``$OUT/gpu_rows.jsonl`` (its results and per-evaluation metrics) and the logs to ``$OUT/logs.tar.gz``. Rows run
without checkpoints: a row cut by the time limit starts again at the next call (MTMT keeps its finished stages),
unless ``--save-every N`` is given: then every row checkpoints every N steps (and at each epoch end) and a cut row
resumes from its checkpoint at the next call on the same machine, for rows longer than one call; rows finished in an
earlier call on the same machine are not run again. Every device call replaces the carried
``.gpu-pack``, so what the rows write stays outside the repository (``--runs``, default ~/zhie-campaign-runs).
Standard library only: it runs under the machine's own python3.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import lzma
import os
import shlex
import shutil
import subprocess
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CARRY = Path(__file__).resolve().parents[1] / ".gpu-pack"
# The scripts that take ``--encoder`` (e5-small's pruned copy); the others find that copy as zhie's e5-small, in the
# ZHIE_CACHE that main() sets.
ENCODER_SCRIPTS = ("benchmarks/ner.py", "benchmarks/mtmt.py", "benchmarks/multitask.py")
# Scripts whose rows write into one shared ``--out`` directory: the option whose value makes the rows of one chain.
CHAINED_BY = {"benchmarks/mtmt.py": ("--seed", "--seeds"), "benchmarks/active_learning.py": ("--strategy",)}


def rows(path: Path) -> list[tuple[str, str]]:
    """(key, command) per line of rows.txt."""
    return [tuple(line.split(" ", 1)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def reads(command: str, keys: list[str]) -> list[str]:
    """The rows of ``keys`` whose directory ``command`` reads (``{runs}/KEY/``, ``/`` in KEY as ``__``)."""
    return [k for k in keys if "{runs}/" + k.replace("/", "__") + "/" in command]


def wait_for(keys: list[str], runs: Path, deadline: float) -> bool:
    """Wait until the rows ``keys`` (run in other chains) are done; False if one failed or time ran out first."""
    while time.time() < deadline:
        done = [runs / k.replace("/", "__") / "done.json" for k in keys]
        if all(d.exists() for d in done):
            return all(json.loads(d.read_text())["rc"] == 0 for d in done)
        time.sleep(min(5.0, max(0.0, deadline - time.time())))
    return False


def chains(rows_: list[tuple[str, str]], stagger: float) -> list[tuple[float, list[tuple[str, str]]]]:
    """The rows as chains that run side by side, each with the seconds it waits before it starts. A row that reads
    an earlier row's directory (``{runs}/KEY``: a student's teacher, the outputs it reuses) runs after it, in its
    chain, when that row is the chain's last so far, else in a chain of its own (the rows that read one model, the
    extensions of one old model, run side by side); either way it waits for the rows it reads.
    Rows that write into one directory outside ``{run_dir}`` share what the first one prepares there (the data
    samples, MTMT's pruned encoder; each rewrites the samples), and each further chain on that directory starts
    ``stagger`` seconds after the one before. Of those, the rows of one :data:`CHAINED_BY` value form one chain:
    MTMT's of a seed (its ablations reuse the seed's teachers), active learning's of a strategy (a longer curve
    continues the shorter one's rounds; the strategies of a seed share only the seed round, which the first to reach
    it trains while the others wait)."""
    groups: dict[tuple[str, str, str], list[tuple[str, str]]] = {}  # (shared directory or "", chain, its value)
    group_of: dict[str, tuple[str, str, str]] = {}
    for key, command in rows_:
        words = shlex.split(command)
        out = words[words.index("--out") + 1] if "--out" in words else "{run_dir}"
        shared = "" if out == "{run_dir}" else out
        option = CHAINED_BY.get(words[0]) if shared else None
        value = next((words[i + 1] for i, w in enumerate(words[:-1]) if w in option), "") if option else ""
        last = [group_of[k] for k in reads(command, list(group_of)) if groups[group_of[k]][-1][0] == k]
        group = last[-1] if last else (shared, shared if option else key, value)
        group_of[key] = group
        groups.setdefault(group, []).append((key, command))
    started: dict[str, int] = {}
    timed = []
    for (shared, _, _), chain in groups.items():
        n = started.get(shared, 0) if shared else 0
        started[shared] = n + 1
        timed.append((n * stagger, chain))
    return timed


def run_row(key: str, command: str, runs: Path, encoder: Path, commit: str, parallel: int, deadline: float,
            save_every: int | None = None) -> None:
    out = runs / key.replace("/", "__")
    done = out / "done.json"
    if done.exists() and json.loads(done.read_text())["rc"] == 0 or time.time() >= deadline:
        return
    if save_every is None or done.exists():  # a failed row starts afresh; a cut one resumes when it checkpoints
        shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out / "results", ignore_errors=True)  # a resumed benchmark writes its finished runs' lines again
    (out / "results").mkdir(parents=True)
    resume = [] if save_every is None else ["--save-every", str(save_every)]
    words = [w.replace("{run_dir}", str(out)).replace("{runs}", str(runs)).replace("{data}", os.environ["ZHIE_DATA"])
             for w in shlex.split(command)] + resume
    cut = out / "cut_s"  # the seconds this row ran in earlier calls, cut by their time limit
    start = time.time() - (float(cut.read_text()) if cut.exists() else 0.0)
    with (out / "log").open("a") as log:  # a resumed row adds to its log
        try:
            extra = ["--encoder", str(encoder)] if words[0] in ENCODER_SCRIPTS else []
            rc = subprocess.run(["python3", *words, *extra], cwd=CARRY / "tree", stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, "ZHIE_RESULTS": str(out / "results")},
                                timeout=max(1.0, deadline - time.time())).returncode
        except subprocess.TimeoutExpired:  # no done.json: the next call runs it again
            cut.write_text(f"{time.time() - start:.0f}")
            return
    if rc == 0:  # as campaign.py does: a finished row keeps no resumable state (a student that finds its teacher's
        for checkpoint in out.rglob("checkpoint.pt"):  # checkpoint.pt takes the teacher as unfinished and trains it)
            checkpoint.unlink()
    done.write_text(json.dumps({"key": key, "commit": commit, "rc": rc, "wall_s": round(time.time() - start),
                                "parallel": parallel, "command": command}))


def collect(runs: Path, out: Path) -> None:
    with (out / "gpu_rows.jsonl").open("w") as f:
        for done in sorted(runs.glob("*/done.json")):
            line = json.loads(done.read_text())
            line["runs"] = str(runs)  # campaign.py import names its directories RUNS/ as the CPU rows do
            line["results"] = [json.loads(text) for p in sorted((done.parent / "results").glob("*.jsonl"))
                               for text in p.read_text().splitlines() if text.strip()]
            line["metrics"] = [json.loads(text) for p in sorted(done.parent.rglob("metrics.jsonl"))
                               for text in p.read_text().splitlines() if text.strip()]
            f.write(json.dumps(line) + "\n")
            print(line["key"], "exit", line["rc"], f"{line['wall_s']} s",
                  " ".join(f"{m['dev']['f1']:.4f}" for m in line["metrics"] if "f1" in m.get("dev", {})), flush=True)
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        for path in sorted(runs.rglob("*")):  # logs, metrics, results: no weights, no model directories
            parts = path.relative_to(runs).parts
            if path.is_file() and path.suffix in (".json", ".jsonl", ".log", ".txt", ".toml", ".png", "") \
                    and not {"best", "last", "e5-small-pruned", "encoder", "cache"} & set(parts):
                tar.add(path, arcname="/".join(parts))


def run_chain(delay: float, chain: list[tuple[str, str]], keys: list[str], runs: Path, encoder: Path, commit: str,
              parallel: int, deadline: float, save_every: int | None) -> None:
    """The rows of ``chain`` one after another, after ``delay`` seconds; each waits for the rows of ``keys`` that it
    reads. A row that reads a failed one is marked failed (``rc`` -1) without running, and so the rows that read it."""
    time.sleep(min(delay, max(0.0, deadline - time.time())))
    for key, command in chain:
        if wait_for(reads(command, keys), runs, deadline):
            run_row(key, command, runs, encoder, commit, parallel, deadline, save_every)
        elif time.time() < deadline:
            done = runs / key.replace("/", "__") / "done.json"
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(json.dumps({"key": key, "commit": commit, "rc": -1, "wall_s": 0, "command": command,
                                        "skipped": "a row it reads failed"}))


def missing_modules(names: list[str]) -> list[str]:
    """The modules of ``names`` (``.gpu-pack/requires.txt``: what zhie's training needs) that this Python lacks."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parallel", type=int, default=16, help="rows (chains) at once")
    p.add_argument("--seconds", type=float, default=540, help="stop the rows still running after this long")
    p.add_argument("--stagger", type=float, default=90, help="seconds between rows sharing an --out directory")
    p.add_argument("--runs", type=Path, default=Path.home() / "zhie-campaign-runs")
    p.add_argument("--save-every", type=int, default=None,
                   help="checkpoint every N steps; a row cut by --seconds resumes at the next call")
    args = p.parse_args()
    missing = missing_modules((CARRY / "requires.txt").read_text().split())
    if missing:  # before a row starts: each would fail at its first use of the module (README of benchmarks/)
        raise SystemExit(f"error: this Python lacks {', '.join(missing)}, which zhie's training needs; carry them as "
                         "wheels and install them first")
    deadline = time.time() + args.seconds
    encoder = args.runs / "e5-small-pruned"
    if not (encoder / "model.safetensors").exists():
        encoder.mkdir(parents=True, exist_ok=True)
        for f in (CARRY / "e5-small-pruned").glob("*.json"):
            shutil.copy(f, encoder)
        with lzma.open(CARRY / "e5-small-pruned" / "model.safetensors.xz") as src, \
                (encoder / "model.safetensors").open("wb") as dst:
            shutil.copyfileobj(src, dst)
    cache = args.runs / "cache"  # zhie's e5-small is the pruned copy (encoders/e5.py: a converted directory)
    cache.mkdir(exist_ok=True)
    if not (cache / "e5-small").exists():
        (cache / "e5-small").symlink_to(encoder.resolve())
    os.environ.update(PYTHONPATH="src:benchmarks", ZHIE_DATA=str(CARRY / "data"), OMP_NUM_THREADS="1",
                      ZHIE_CACHE=str(cache), PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
                      ZHIE_MACHINE_LOCK_HELD="1")
    if shutil.which("nvidia-cuda-mps-control"):  # one GPU shared by many processes
        subprocess.run(["nvidia-cuda-mps-control", "-d"], stderr=subprocess.DEVNULL, check=False)
    commit = (CARRY / "tree" / "COMMIT").read_text().strip()

    keys = [key for key, _ in rows(CARRY / "rows.txt")]
    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(lambda timed: run_chain(*timed, keys, args.runs, encoder, commit, args.parallel, deadline,
                                              args.save_every), chains(rows(CARRY / "rows.txt"), args.stagger)))
    collect(args.runs, Path(os.environ.get("OUT", ".")))


if __name__ == "__main__":
    main()
