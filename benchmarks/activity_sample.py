"""How many items must rank the units a narrowed cut student keeps (``zhie distill --ffn-width/--attention-heads``)?

    python benchmarks/activity_sample.py --teacher RUNS/s__cluener__teacher-gp__s1/cluener-gp/best \\
        --targets-from RUNS/s__cluener__student-conv-scaled-128x4-egp-wiki20k__s1/student --layers 4 \\
        --ffn-width 768 --attention-heads 6 --sizes 1000 2000 4000 16000

``zhie distill`` ranks the feed-forward neurons (:func:`zhie.encoders.ffn_importance`) and the attention heads
(:class:`zhie.encoders.student_bert.HeadActivity`) of the layers it keeps on the first
:data:`zhie.training.teachers.ACTIVITY_ITEMS` (4,000) items, training windows first. Here the same measures
(:func:`zhie.training.teachers.unit_activity`) run over the first N items of a distillation's stored items
(``--targets-from``: its ``teacher/targets.pt``) for each N of ``--sizes``, through the teacher's encoder cut to its
first ``--layers`` layers (which computes those layers' outputs exactly); each row says, per layer, what share of the
units kept at N is also kept at the largest N. One JSON line per N in ``results/activity_sample.jsonl``.
"""

from __future__ import annotations

import argparse
import time
from datetime import date
from pathlib import Path

import torch
from common import append_result, machine, machine_lock

import zhie
from zhie.encoders import FfnActivity, ffn_importance, truncate_layers
from zhie.encoders.student_bert import HeadActivity
from zhie.training.teachers import TARGETS, unit_activity


def kept(scores: list, k: int) -> list[set]:
    return [set(torch.topk(s, k).indices.tolist()) for s in scores]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", required=True, help="the teacher's model directory")
    p.add_argument("--targets-from", required=True, help="a zhie distill run directory (its stored items)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--ffn-width", type=int, default=768)
    p.add_argument("--attention-heads", type=int, default=6)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 4000, 16000])
    args = p.parse_args()
    with machine_lock():
        teacher = zhie.load(args.teacher)
        encoder = truncate_layers(teacher.model.encoder, args.layers).eval()
        lessons = torch.load(Path(args.targets_from) / TARGETS, weights_only=False)["lessons"]
        items = [lesson.item for lesson in lessons]
        sizes = sorted(args.sizes)
        results = {}
        for n in sizes:
            start = time.perf_counter()
            activity = unit_activity(encoder, teacher.task, items, {"ffn": FfnActivity, "heads": HeadActivity},
                                     torch.device("cpu"), limit=n)
            results[n] = (kept(ffn_importance(encoder, activity["ffn"]), args.ffn_width),
                          kept(activity["heads"], args.attention_heads), time.perf_counter() - start)
        ffn_ref, heads_ref, _ = results[sizes[-1]]
        for n in sizes:
            ffn_kept, heads_kept, seconds = results[n]
            row = {"teacher": args.teacher, "items": min(n, len(items)), "reference_items": min(sizes[-1], len(items)),
                   "layers": args.layers, "ffn_width": args.ffn_width, "attention_heads": args.attention_heads,
                   "ffn_shared": [round(len(a & b) / args.ffn_width, 4) for a, b in zip(ffn_kept, ffn_ref)],
                   "heads_shared": [len(a & b) for a, b in zip(heads_kept, heads_ref)], "seconds": round(seconds, 1),
                   "machine": machine(), "date": date.today().isoformat(),
                   "command": "python benchmarks/activity_sample.py " + " ".join(
                       f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                       for k, v in vars(args).items())}
            append_result("activity_sample", row)


if __name__ == "__main__":
    main()
