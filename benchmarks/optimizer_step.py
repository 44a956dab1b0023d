"""Seconds per AdamW step on this CPU, torch's default loop against ``foreach`` and ``fused`` (what
``zhie.training.optim.build_optimizer`` uses), over the parameters of CLUENER's 128-wide convolutional student with a
65,536-row bigram table (8.4 M of its 10 M weights) and over a 12-layer e5-small teacher's (its vocabulary pruned to
8,266 tokens), random gradients.

    python benchmarks/optimizer_step.py --steps 20

Each variant runs in turn, twice, after 3 warm-up steps; one JSON line per model with the mean milliseconds per step
of each variant goes to ``benchmarks/results/optimizer_step.jsonl``.
"""

from __future__ import annotations

import argparse
import time
from datetime import date

import torch
from common import append_result, machine, machine_lock

SHAPES = {  # the parameters' shapes
    "conv-128x4-bigrams": [(65536, 128), (8266, 384), (128, 384)] + [(128, 128, 3)] * 4 + [(128,)] * 16,
    "e5-small-12-pruned": [(8266, 384), (512, 384)] + [(384, 384)] * 48 + [(1536, 384), (384, 1536)] * 12
    + [(384,)] * 100 + [(1536,)] * 12,
}
VARIANTS = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def ms_per_step(shapes: list[tuple[int, ...]], options: dict, steps: int) -> float:
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **options)
    for _ in range(3):
        opt.step()
    start = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - start) / steps * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    torch.manual_seed(0)
    with machine_lock():  # waits for a campaign row to end: timings of a shared CPU mean nothing
        run(args.steps)


def run(steps: int) -> None:
    for model, shapes in SHAPES.items():
        times = {name: [] for name in VARIANTS}
        for _ in range(2):
            for name, options in VARIANTS.items():
                times[name].append(ms_per_step(shapes, options, steps))
        row = {"model": model, "parameters": sum(torch.Size(s).numel() for s in shapes), "steps": steps,
               **{f"{name}_ms": round(min(t), 1) for name, t in times.items()}, "threads": torch.get_num_threads(),
               "machine": machine(), "date": date.today().isoformat(),
               "command": f"python benchmarks/optimizer_step.py --steps {steps}"}
        append_result("optimizer_step", row)


if __name__ == "__main__":
    main()
