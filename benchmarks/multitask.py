"""Multi-task benchmark (issue 13): every weighting scheme against the single-task models at the same total steps.

    python benchmarks/multitask.py --suite three --schemes equal real-time mgda --single
    python benchmarks/multitask.py --suite medical --schemes main-auxiliary equal --single

Suites (datasets from ../shared/data, subsampled with a fixed seed-0 shuffle to ``--train-size`` / ``--dev-size``):

* ``three``: CLUENER NER (EGP) + SXU CWS (CRF) + ATEC sentence similarity (CoSENT) — losses of very different scales
  (EGP's multilabel CE over all cells, the CRF's sentence NLL, CoSENT's log-sum-exp over pairs);
* ``medical``: CMeEE NER (EGP; the main task under ``main-auxiliary``) + CMeIE relations (GPLinker) as auxiliary.

``keep_tokens="data"`` prunes the encoder's vocabulary to the tokens of the runs' texts: the characters of the char-mode
members and the sub-word pieces of the similarity member (rows written before 2026-11-23 kept e5's 250k-row embedding
in every run with a similarity member, whose dense AdamW update made those CPU steps slower). A run whose directory
holds ``done.json`` is not run again (its row is printed again); an interrupted run resumes from its checkpoint.

Every run trains ``--steps`` steps (a multi-task step draws one batch of every member) and evaluates once at the end;
single-task runs (``--single``) train each member alone for the same number of steps with the same batch size. Each
run appends one JSON line to ``benchmarks/results/multitask.jsonl``: every member's dev metric, seconds per step (wall
and process CPU), the loss weights the scheme applied (mean over the run, and at the last step), and the command.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import date
from pathlib import Path

from common import DATA, append_result, machine, machine_lock, once, peak_memory_mb

import zhie
from zhie.core.files import atomic_write_text
from zhie.data import read_ner, write_ner_jsonl
from zhie.data.cws import read_segmented, write_segmented
from zhie.training import TrainConfig
from zhie.training.report import read_metrics

SUITES = {
    "three": [
        {"name": "ner", "task": "ner", "options": {"head": "egp"}, "metric": "f1"},
        {"name": "cws", "task": "cws", "options": {"head": "crf"}, "metric": "f1"},
        {"name": "sts", "task": "similarity", "options": {"loss": "cosent"}, "metric": "spearman"},
    ],
    "medical": [
        {"name": "cmeee", "task": "ner", "options": {"head": "egp"}, "metric": "f1"},
        {"name": "cmeie", "task": "re", "options": {"head": "gp"}, "metric": "f1"},
    ],
}


def _sample(items: list, n: int) -> list:
    order = list(range(len(items)))
    random.Random(0).shuffle(order)
    return [items[i] for i in sorted(order[:n])]


def write_data(member: dict, out: Path, train_size: int, dev_size: int) -> tuple[Path, Path]:
    """The member's subsampled train and dev files under ``out`` (dev: the dataset's own dev/test split); written
    atomically, since every run of a suite writes them again while another run may be reading them."""
    name = member["name"]
    train, dev = out / f"{name}.train", out / f"{name}.dev"
    if name in ("ner", "cmeee"):
        source = DATA / "ner" / ("cluener" if name == "ner" else "cmeee")
        write_ner_jsonl(_sample(read_ner(source / "train.json"), train_size), train)
        write_ner_jsonl(_sample(read_ner(source / "dev.json"), dev_size), dev)
    elif name == "cws":
        write_segmented(_sample(read_segmented(DATA / "cws/sxu/train.txt"), train_size), train)
        write_segmented(_sample(read_segmented(DATA / "cws/sxu/test.txt"), dev_size), dev)
    elif name == "sts":
        for split, file, n in ((train, "train.data", train_size), (dev, "valid.data", dev_size)):
            lines = (DATA / "sts/atec" / file).read_text(encoding="utf-8").splitlines()
            atomic_write_text(split, "\n".join(_sample(lines, n)) + "\n")
    elif name == "cmeie":
        for split, file, n in ((train, "train.jsonl", train_size), (dev, "dev.jsonl", dev_size)):
            lines = (DATA / "re/cmeie" / file).read_text(encoding="utf-8").splitlines()
            atomic_write_text(split, "\n".join(_sample(lines, n)) + "\n")
        member["options"] = {**member["options"], "schema": str(DATA / "re/cmeie/schema.json")}
    return train, dev


def _toml(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def write_config(members: list[dict], files: dict, path: Path, args) -> None:
    lines = ["[weighting]", f"main = {_toml(members[0]['name'])}", f"gamma = {args.gamma}", ""]
    for m in members:
        options = {**m["options"], "max_length": args.max_length}
        lines += ["[[tasks]]", f"name = {_toml(m['name'])}", f"task = {_toml(m['task'])}",
                  f"train = {_toml(str(files[m['name']][0]))}", f"dev = {_toml(str(files[m['name']][1]))}",
                  f"batch_size = {args.batch_size}", f"options = {_toml(options)}", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def train(task: str, out: Path, args, train_file=None, dev_file=None, **options) -> dict:
    config = TrainConfig(epochs=1000, max_steps=args.steps, eval_every=args.steps, batch_size=args.batch_size,
                         lr=args.lr, head_lr=args.head_lr, seed=args.seed, warmup=0.1, save_every=args.save_every)
    cpu, wall = time.process_time(), time.perf_counter()
    result = zhie.fit(task, train_file, dev_file, out=out, encoder=args.encoder, encoder_layers=args.encoder_layers,
                      keep_tokens="data", config=config, resume=True, progress=not args.quiet, **options)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    records = read_metrics(out / "metrics.jsonl")
    last = records[-1]
    return {"best": result["best"], "steps": result["steps"], "train_s_per_step": last["elapsed_s"] / args.steps,
            "run_wall_s": round(wall, 1), "run_cpu_s": round(cpu, 1), "record": last}


def row_base(args, suite: str) -> dict:
    return {"suite": suite, "encoder": args.encoder, "encoder_layers": args.encoder_layers or "all",
            "steps": args.steps, "batch_size": args.batch_size, "train_size": args.train_size,
            "dev_size": args.dev_size, "max_length": args.max_length, "lr": args.lr, "head_lr": args.head_lr,
            "seed": args.seed}


def finish(row: dict) -> dict:
    return {**row, "peak_memory_mb": peak_memory_mb(), "machine": machine(), "date": date.today().isoformat(),
            "command": "python " + " ".join(sys.argv)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="three", choices=sorted(SUITES))
    p.add_argument("--schemes", nargs="*", default=["equal", "real-time", "mgda"])
    p.add_argument("--single", action="store_true", help="also train every member alone")
    p.add_argument("--encoder", default="e5-small")
    p.add_argument("--encoder-layers", type=int, default=None)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16, help="per member and step")
    p.add_argument("--train-size", type=int, default=4000)
    p.add_argument("--dev-size", type=int, default=500)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--head-lr", type=float, default=2e-3)
    p.add_argument("--gamma", type=float, default=0.5, help="generalised-mean's exponent")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default="runs/mt-bench")
    p.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (a stopped run resumes)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    out = Path(args.out) / args.suite
    out.mkdir(parents=True, exist_ok=True)
    members = [dict(m) for m in SUITES[args.suite]]
    files = {m["name"]: write_data(m, out.resolve(), args.train_size, args.dev_size) for m in members}
    config = out / "multitask.toml"
    write_config(members, files, config, args)
    for scheme in args.schemes:
        row = once(out / f"mt-{scheme}", scheme_row, scheme, members, config, args)
        append_result("multitask", finish(row))
    if args.single:
        for m in members:
            row = once(out / f"single-{m['name']}", single_row, m, files[m["name"]], args)
            append_result("multitask", finish(row))


def scheme_row(scheme: str, members: list[dict], config: Path, args) -> dict:
    run = train("multitask", Path(args.out) / args.suite / f"mt-{scheme}", args, tasks_file=str(config),
                weighting=scheme)
    best, record = run["best"], run["record"]
    return {**row_base(args, args.suite), "run": scheme,
            "dev": {m["name"]: best.get(f"{m['name']}/{m['metric']}") for m in members},
            "score": best.get("score"), "mean_weights": record.get("task_weights", {}),
            "final_weights": record["per_batch"][-1]["weights"], "mean_losses": record.get("task_losses", {}),
            **{k: run[k] for k in ("train_s_per_step", "run_wall_s", "run_cpu_s")}}


def single_row(m: dict, files: tuple[Path, Path], args) -> dict:
    run = train(m["task"], Path(args.out) / args.suite / f"single-{m['name']}", args, *files,
                **{**m["options"], "max_length": args.max_length})
    return {**row_base(args, args.suite), "run": f"single:{m['name']}",
            "dev": {m["name"]: run["best"].get(m["metric"])},
            **{k: run[k] for k in ("train_s_per_step", "run_wall_s", "run_cpu_s")}}

if __name__ == "__main__":
    with machine_lock():
        main()
