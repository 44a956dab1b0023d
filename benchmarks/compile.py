"""Does ``torch.compile`` pay off for prediction (issue 16)? Eager against the encoder compiled with dynamic shapes.

    python benchmarks/compile.py --model runs/bench-issue10/cluener-crf --texts 300

Predicts the first ``--texts`` CLUENER dev texts eagerly, then with ``pipe.model.encoder`` replaced by
``torch.compile(encoder, dynamic=True)``: the first compiled call (compilation included) and a second one. Times are
process CPU seconds (other jobs on the machine do not count) and wall seconds; the row also says how many texts got
different entities (scores aside). Rows go to ``benchmarks/results/compile.jsonl``.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import date

import torch
from common import DATA, append_result, machine, machine_lock

import zhie
from zhie.data import read_ner


def timed(pipe, texts: list[str], batch_size: int) -> tuple[list, float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    out = pipe.predict(texts, batch_size=batch_size)
    return out, time.process_time() - cpu, time.perf_counter() - wall


def spans(entities: list) -> list[tuple]:
    """An NER prediction without its scores (they differ in the last float bits between eager and compiled)."""
    return [(e.start, e.end, e.label) for e in entities]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--texts", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    pipe = zhie.load(args.model)
    texts = [e.text for e in read_ner(DATA / "ner/cluener/dev.json")][: args.texts]
    pipe.predict(texts[: args.batch_size], batch_size=args.batch_size)  # warm-up
    eager, eager_cpu, eager_wall = timed(pipe, texts, args.batch_size)
    pipe.model.encoder = torch.compile(pipe.model.encoder, dynamic=True)
    _, first_cpu, first_wall = timed(pipe, texts, args.batch_size)
    compiled, cpu, wall = timed(pipe, texts, args.batch_size)
    row = {"model": args.model, "texts": len(texts), "batch_size": args.batch_size, "threads": args.threads,
           "eager_cpu_s": eager_cpu, "eager_wall_s": eager_wall, "first_compiled_cpu_s": first_cpu,
           "first_compiled_wall_s": first_wall, "compiled_cpu_s": cpu, "compiled_wall_s": wall,
           "texts_with_other_entities": sum(spans(a) != spans(b) for a, b in zip(eager, compiled)),
           "torch": torch.__version__,
           "machine": machine(), "date": date.today().isoformat(), "command": "python " + " ".join(sys.argv)}
    print(row)
    append_result("compile", row)


if __name__ == "__main__":
    with machine_lock():
        main()
