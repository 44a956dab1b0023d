"""Decoding time per sentence, apart from the encoder (issue 16: decoding off the critical path).

    python benchmarks/decode.py --model runs/bench-issue10/cluener-crf --data ../shared/data/ner/cluener/dev.json

Runs the model once over the texts' windows (as ``zhie predict`` batches them) and keeps its outputs, then times only
the task's ``decode`` over those outputs, ``--repeats`` times, in process CPU seconds (so other jobs on the machine do
not count). Decoding runs on the host whatever the device (one copy of the outputs there), so its µs per sentence is
what a GPU's prediction pays on top of the encoder. Rows go to ``benchmarks/results/decode.jsonl``.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import date

import torch
from common import append_result, machine, machine_lock

import zhie
from zhie.core.text import windows
from zhie.data import read_ner
from zhie.tasks.base import model_inputs, sorted_batches


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, help="NER file whose texts are decoded")
    p.add_argument("--texts", type=int, default=500, help="the file's first N texts")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--label", default="", help="a note for the row (e.g. the commit)")
    args = p.parse_args()
    torch.set_num_threads(1)
    pipe = zhie.load(args.model)
    task, model = pipe.task, pipe.model.eval()
    texts = [e.text for e in read_ner(args.data)][: args.texts]
    tt = task.text_tokenizer
    encodings = [tt(t) for t in texts]
    rows = [tt.model_input(enc.ids[slice(*cut)]) for enc in encodings for cut in windows(len(enc), *task.window)]
    batches = []
    with torch.no_grad():
        for batch_rows in sorted_batches([len(r) for r in rows], args.batch_size, None):
            batch = model_inputs([rows[j] for j in batch_rows], tt.pad_id)
            outputs = model.arrays(batch["input_ids"].numpy(), batch["attention_mask"].numpy())
            batches.append((outputs, batch["attention_mask"].numpy()))
    spans = sum(len(hits) for outputs, mask in batches for hits in task.decode(model, outputs, mask))
    start = time.process_time()
    for _ in range(args.repeats):
        for outputs, mask in batches:
            task.decode(model, outputs, mask)
    seconds = (time.process_time() - start) / args.repeats
    row = {"model": args.model, "data": args.data, "head": task.config.head, "texts": len(texts),
           "windows": len(rows), "hits": spans, "batch_size": args.batch_size, "repeats": args.repeats,
           "decode_us_per_sentence": 1e6 * seconds / len(texts), "label": args.label, "machine": machine(),
           "date": date.today().isoformat(), "command": "python " + " ".join(sys.argv)}
    print(row)
    append_result("decode", row)


if __name__ == "__main__":
    with machine_lock():
        main()
