"""Where the time of ``zhie predict MODEL --input F --output G`` goes, stage by stage, for the whole process (issue 53).

    python benchmarks/predict_stages.py --model RUNS/s__cluener__student-conv-.../student/best --data cluener
    python benchmarks/predict_stages.py --model EXPORT_DIR --data cluener --sentences 10000 --runs 5

The texts are :func:`tradeoff.dataset`'s (CLUENER: its 2,688 dev + test texts), the first ``--sentences`` of them (the
list repeated when it asks for more), one per line of F. Each of ``--runs`` runs is two fresh processes, one after the
other, both with the command's defaults (or ``--batch-size``, ``--chunk-lines``, ``--max-tokens``) and the machine's
threads as ``zhie predict`` leaves them:

1. **staged**: this file run as a child (``--child``), which does what ``zhie predict`` does, each step a call of zhie's
   own functions in the order the command makes them, with a timer around each stage:

   - ``import``: ``from zhie.cli import main``, what the ``zhie`` script imports first;
   - ``load``: :func:`zhie.load` (torch and transformers, or onnxruntime and tokenizers, are imported here) and the
     weights;
   - ``read``: the input lines (:class:`zhie.deploy.stream.TextReader`, as :func:`zhie.cli.write_outputs` reads them);
   - per chunk of ``--chunk-lines`` lines, as :meth:`zhie.tasks.base.WindowedTask.window_hits` and
     :meth:`~zhie.tasks.base.WindowedTask.predict` run them: ``tokenise`` (the task's text tokenizer on every text, its
     windows), ``batch`` (:func:`zhie.tasks.batching.sorted_batches`, each window's ids with the special tokens,
     :func:`~zhie.tasks.batching.input_arrays`' padding), ``graph`` (``model.each_arrays``: the torch forward or the
     onnxruntime run, with their array conversions; an export's next batches run while the one before is decoded, so
     this is the time spent waiting for the graph, not the graph's own), ``decode`` (the task's ``decode`` of each
     batch, then ``reported`` and ``from_hits``: token spans to character spans), ``json``
     (:func:`zhie.deploy.outputs.output_line` per line);
   - ``write``: :func:`zhie.deploy.stream.write_lines` to G (its ``.partial``, renamed);
   - ``process``: the process's wall time (from a launcher, :func:`common.run_measured`) less the child's own total:
     the interpreter's start and exit, and this file's few standard-library imports;
   - ``other``: the child's total less its stages (the loops around them, and this file's counting of what
     the texts made).

   The whole path runs with the garbage collector paused, as ``zhie predict`` runs it
   (:func:`zhie.deploy.stream.collector_paused`);
2. **the command**: ``zhie predict MODEL --input F --output G`` (``python -c "from zhie.cli import main; ..."``, the
   ``zhie`` script's code) timed whole by the same launcher, for comparison: ``cli_s`` against the staged process's
   ``staged_s``. The two outputs must be the same bytes (``same_output``): the staged steps did the command's work.

Why calling the steps rather than profiling the real command: cProfile adds its cost to every Python call it counts,
which swells exactly the Python stages (tokenising, decoding, JSON: hundreds of thousands of small calls) against the
graph (one C call a batch), and its per-function times would have to be mapped to stages afterwards (a function like
``model_input`` belongs to batching, ``Encoding`` offsets to decoding). Timers around zhie's own functions cost a
few microseconds a chunk or a batch. The price is that the child repeats the order of the steps of
``WindowedTask.window_hits`` (about ten lines, no logic of its own): a change of zhie's path that it misses shows as
``same_output: false``, or as ``staged_s`` far from ``cli_s``. Only the span tasks (NER, word segmentation, relations)
predict through that path; another task is refused.

One JSON line per call (``results/predict_stages.jsonl``): per stage the median seconds over the runs and its share of
the staged process's median wall time, the median ``staged_s`` and ``cli_s`` and each run's, sentences/s of both, the
command's peak resident memory, what the texts made (characters, windows, batches, the share of padded cells that
hold a token), the runtime (torch or onnxruntime), the settings, the load average before and after, the machine.
zhie's modules are compiled to bytecode first (:func:`common.compile_zhie`), as ``tradeoff.py`` does.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

# What the child imports before its clock starts: the standard library only (the parent's imports, torch among them
# through common.py, are made in main()).
STAGES = ("process", "import", "load", "read", "tokenise", "batch", "graph", "decode", "json", "write", "other")
ZHIE = [sys.executable, "-c", "from zhie.cli import main; raise SystemExit(main())"]


def child(result: str, model: str, input_path: str, output: str, batch_size: str, chunk_lines: str,
          max_tokens: str) -> None:
    """The staged ``zhie predict`` (see the module's docstring); writes ``{"stages", "total_s", ...}`` to ``result``."""
    start = time.perf_counter()
    seconds = dict.fromkeys(STAGES[1:-1], 0.0)
    last = start

    def lap(stage: str) -> None:
        nonlocal last
        now = time.perf_counter()
        seconds[stage] += now - last
        last = now

    import zhie.cli  # noqa: F401  (what the `zhie` script imports)

    lap("import")
    import zhie
    from zhie.core.text import windows
    from zhie.deploy import stream
    from zhie.deploy.outputs import output_line
    from zhie.tasks.base import WindowedTask
    from zhie.tasks.batching import chunks, input_arrays, sorted_batches

    pipe = zhie.load(model)
    task, net = pipe.task, pipe.model
    if not isinstance(task, WindowedTask) or type(task).predict is not WindowedTask.predict:
        raise SystemExit(f"{model} is a {task.name} model: only the span tasks' path is staged here")
    batch_size, chunk_lines = int(batch_size), int(chunk_lines)
    max_tokens = int(max_tokens) if max_tokens != "none" else None
    lap("load")
    made = {"characters": 0, "windows": 0, "batches": 0, "tokens": 0, "cells": 0}
    with stream.collector_paused():
        reader = stream.TextReader([], [input_path])
        lines = list(reader)
        lap("read")
        out: list[str] = []
        size, overlap = task.window
        tt = task.text_tokenizer
        for chunk in chunks(lines, chunk_lines):
            texts = [line.text if line.text.strip() else "" for line in chunk]  # stream_predictions' blank texts
            with pipe.autocast():
                encodings = [tt(t) for t in texts]
                cuts = [windows(len(enc), size, overlap) if len(enc) else [] for enc in encodings]
                jobs = [(i, w) for i, wins in enumerate(cuts) for w in range(len(wins))]
                specials = len(tt.model_input([]))
                lengths = [cuts[i][w][1] - cuts[i][w][0] + specials for i, w in jobs]
                lap("tokenise")
                batches = []
                for batch_jobs in sorted_batches(lengths, batch_size, max_tokens):
                    rows = [tt.model_input(encodings[i].ids[slice(*cuts[i][w])])
                            for i, w in (jobs[j] for j in batch_jobs)]
                    batches.append((batch_jobs, input_arrays(rows, tt.pad_id)))
                lap("batch")
                hits = []
                results = net.each_arrays(batch for _, batch in batches)
                for batch_jobs, _ in batches:
                    batch, outputs = next(results)
                    mask = batch["attention_mask"]
                    lap("graph")
                    for j, row in zip(batch_jobs, task.decode(net, outputs, mask)):
                        i, w = jobs[j]
                        hits.append((i, encodings[i], cuts[i], w, row))
                    lap("decode")
                predictions = task.from_hits(texts, task.reported(hits))
                lap("decode")
            out.extend(output_line(task, line, p) for line, p in zip(chunk, predictions))
            lap("json")
            made["characters"] += sum(map(len, texts))
            made["windows"] += len(jobs)
            made["batches"] += len(batches)
            made["tokens"] += sum(lengths)
            made["cells"] += sum(b["input_ids"].size for _, b in batches)
            last = time.perf_counter()  # the counting above is no stage of zhie predict's
        stream.write_lines(output, out, chunk_lines)
        lap("write")
    reader.report()
    total = time.perf_counter() - start
    Path(result).write_text(json.dumps({"seconds": seconds, "total_s": total, "sentences": len(lines),
                                        "runtime": getattr(net, "runtime", "torch"), **made}))


def median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def main() -> None:
    import argparse
    import os
    import tempfile
    from datetime import date

    # the parent's imports (torch comes with common.py): never in the child, whose imports are timed
    from common import append_result, compile_zhie, machine, machine_lock, run_measured
    from tradeoff import DATASETS, dataset

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model or export directory (a NER, segmentation or relation model)")
    p.add_argument("--data", default="cluener", choices=DATASETS, help="whose texts (tradeoff.py's dataset())")
    p.add_argument("--sentences", type=int, help="the first N texts, repeated past the end (default: all)")
    p.add_argument("--all-texts", action="store_true", help="CLUENER: its train texts too (tradeoff.py --all-texts)")
    p.add_argument("--runs", type=int, default=3, help="staged and whole-command processes, alternated")
    p.add_argument("--batch-size", type=int, default=32, help="zhie predict's (its default)")
    p.add_argument("--chunk-lines", type=int, default=4096, help="zhie predict's (its default)")
    p.add_argument("--max-tokens", type=int, default=None, help="zhie predict's (default: none)")
    args = p.parse_args()
    with machine_lock(), tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _, _, texts = dataset(args.data, tmp, args.all_texts)
        n = args.sentences or len(texts)
        texts = [texts[i % len(texts)] for i in range(n)]
        source = tmp / "texts.txt"
        source.write_text("\n".join(texts) + "\n", encoding="utf-8")
        compile_zhie()
        flags = ["--batch-size", str(args.batch_size), "--chunk-lines", str(args.chunk_lines),
                 *(["--max-tokens", str(args.max_tokens)] if args.max_tokens else [])]
        load_before = os.getloadavg()[0]
        staged, cli, peaks, same = [], [], [], True
        for run in range(args.runs):
            result = tmp / f"stages-{run}.json"
            wall, _ = run_measured([sys.executable, __file__, "--child", str(result), args.model, str(source),
                                    str(tmp / "staged.jsonl"), str(args.batch_size), str(args.chunk_lines),
                                    str(args.max_tokens or "none")])
            record = json.loads(result.read_text())
            record["seconds"] = {"process": wall - record["total_s"], **record["seconds"],
                                 "other": record["total_s"] - sum(record["seconds"].values())}
            staged.append((wall, record))
            wall, peak = run_measured([*ZHIE, "predict", args.model, "--input", str(source), "--output",
                                       str(tmp / "cli.jsonl"), *flags])
            cli.append(wall)
            peaks.append(peak)
            same &= (tmp / "staged.jsonl").read_bytes() == (tmp / "cli.jsonl").read_bytes()
            print(f"run {run + 1}: staged {staged[-1][0]:.3f} s, zhie predict {wall:.3f} s", file=sys.stderr)
        staged_s = median([wall for wall, _ in staged])
        stages = {}
        for stage in STAGES:
            s = median([r["seconds"][stage] for _, r in staged])
            stages[stage] = {"s": round(s, 4), "share": round(s / staged_s, 4)}
        first = staged[0][1]
        row = {"model": Path(args.model).name, "model_path": args.model, "runtime": first["runtime"],
               "data": args.data, "sentences": first["sentences"], "stages": stages,
               "staged_s": round(staged_s, 4), "cli_s": round(median(cli), 4),
               "staged_runs_s": [round(w, 4) for w, _ in staged], "cli_runs_s": [round(w, 4) for w in cli],
               "staged_sentences_per_s": round(first["sentences"] / staged_s, 1),
               "cli_sentences_per_s": round(first["sentences"] / median(cli), 1),
               "cli_peak_mb": round(max(peaks), 1), "same_output": same,
               **{k: first[k] for k in ("characters", "windows", "batches")},
               "padding_fill": round(first["tokens"] / max(1, first["cells"]), 4),
               "batch_size": args.batch_size, "chunk_lines": args.chunk_lines, "max_tokens": args.max_tokens,
               "runs": args.runs, "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
               "machine": machine(), "date": str(date.today())}
    for stage, v in stages.items():
        print(f"{stage:>9} {v['s']:8.3f} s {100 * v['share']:5.1f} %", file=sys.stderr)
    append_result("predict_stages", row)
    if not same:
        raise SystemExit("the staged output differs from zhie predict's: the stages no longer follow its path")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(*sys.argv[2:])
    else:
        main()
