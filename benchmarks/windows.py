"""What the window rule changes on real long texts: gold entities lost or cut at window edges, old rule against new.

    python benchmarks/windows.py                      # CMeEE dev (NER, overlap 32) and CMeIE dev (GPLinker, 64)
    python benchmarks/windows.py --model runs/bench/cmeee-egp --data ../shared/data/ner/cmeee/dev.json  # trained

Decodes *gold-scored* windows (a perfect model): every window scores exactly the gold entities (triples) it contains
whole; a tagger's window also tags the part of a cut entity that it sees. Then counts what each rule reports:

* old rule (zhie before the task protocol): an entity is reported by the window that owns its start (each overlap
  cut in half); a span head drops it unless that window holds it whole, a tagger reports it cut at the window's edge
  (one false positive, one false negative);
* new rule: :func:`zhie.core.text.reporting_window` (span heads lose an entity only when no window holds it whole; a
  tagger then reports the part in the later window).

For GPLinker the counts are over triple extents (first to last token of the two mentions): with gold scores a triple
is decoded only in a window that holds both mentions whole, under both rules.

Char mode with e5-small's tokenizer (one token per character), max length 256 as the benchmarks use. One JSON line per
dataset in ``benchmarks/results/windows.jsonl``.

With ``--model``: a trained NER model's window predictions on ``--data``, reported under the old and the new rule
(span P/R/F1 of each, and how many predicted entities differ), at the model's max length or ``--max-length``.
"""

from __future__ import annotations

import argparse

from common import DATA, append_result, machine, machine_lock

import zhie
from zhie import encoders
from zhie.core.metrics import span_prf
from zhie.core.text import TextTokenizer, reporting_window, windows
from zhie.data import read_ner
from zhie.data.spo import read_spo


def owns(window: tuple[int, int], start: int, n: int, overlap: int) -> bool:
    """The old rule: the window reports the spans that start between the middles of its two overlaps."""
    a, b = window
    left = a + overlap // 2 if a > 0 else 0
    right = b - overlap + overlap // 2 if b < n else n
    return left <= start < right


def count(spans_per_text: list[tuple[int, list[tuple[int, int]]]], size: int, overlap: int) -> dict:
    """``spans_per_text``: (token count, gold token spans [start, end)) per text -> what each rule reports."""
    out = dict.fromkeys(["texts_over_one_window", "gold", "old_not_whole_in_owner", "new_span_lost",
                         "new_tagger_partial"], 0)
    for n, spans in spans_per_text:
        cuts = windows(n, size, overlap)
        out["texts_over_one_window"] += len(cuts) > 1
        for s, e in spans:
            out["gold"] += 1
            owner = next(w for w in cuts if owns(w, s, n, overlap))
            out["old_not_whole_in_owner"] += not e <= owner[1]  # span heads: lost; taggers: cut (1 FP + 1 FN)
            out["new_span_lost"] += reporting_window(cuts, s, e) is None
            # a tagger reports the later part [a, e) of an entity that no window holds whole
            out["new_tagger_partial"] += reporting_window(cuts, s, e, cut_at_right_edge=True) is None
    return out


def model_run(args) -> None:
    """Both rules on one run of a trained NER model over every window of the data."""
    pipe = zhie.load(args.model)
    task = pipe.task
    if args.max_length:
        task.config.max_length = args.max_length
    size, overlap = task.window
    examples = task.read(args.data)
    new, old = [set() for _ in examples], [set() for _ in examples]
    for i, enc, cuts, w, row in task.window_hits(pipe.model, [ex.text for ex in examples], args.batch_size):
        a = cuts[w][0]
        for hit in row:
            key = (*enc.token_span_to_chars(a + hit.start, a + hit.end), task.config.labels[hit.label])
            if reporting_window(cuts, a + hit.start, a + hit.end, cut_at_right_edge=task.cut_at_right_edge) == w:
                new[i].add(key)
            if owns(cuts[w], a + hit.start, len(enc), overlap):
                old[i].add(key)
    gold = [ex.spans for ex in examples]
    long = sum(len(task.text_tokenizer(ex.text)) > size for ex in examples)
    row = {"model": args.model, "data": args.data, "head": task.config.head, "max_length": task.config.max_length,
           "overlap": overlap, "texts_over_one_window": long}
    for name, pred in (("old", old), ("new", new)):
        metrics = span_prf(gold, [sorted(p) for p in pred])
        row.update({f"{name}_{k}": metrics["micro"][k] for k in ("precision", "recall", "f1")})
        row[f"{name}_n_pred"] = metrics["n_pred"]
    row["entities_differing"] = sum(len(a ^ b) for a, b in zip(old, new))
    row.update({"machine": machine(), "command": "python benchmarks/windows.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None)})
    append_result("windows", row)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-length", type=int, default=None, help="default: 256, or the model's")
    p.add_argument("--model", default=None, help="a trained NER model directory (or run directory)")
    p.add_argument("--data", default=None, help="with --model: the labelled file to predict")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    if args.model:
        return model_run(args)
    args.max_length = args.max_length or 256
    _, tokenizer = encoders.load("e5-small")
    tt = TextTokenizer(tokenizer, "char")
    size = args.max_length - 2

    def token_spans(text, char_spans):
        enc = tt(text)
        located = [enc.char_span_to_tokens(s, e) for s, e in char_spans]
        return len(enc), [t for t in located if t is not None]

    ner = [token_spans(ex.text, [(s.start, s.end) for s in ex.spans]) for ex in read_ner(DATA / "ner/cmeee/dev.json")]
    extents = [token_spans(ex.text, [(min(t.subject.start, t.object.start), max(t.subject.end, t.object.end))
                                     for t in ex.triples if t.located])
               for ex in read_spo(DATA / "re/cmeie/dev.jsonl")]
    for name, data, overlap in (("cmeee/dev", ner, 32), ("cmeie/dev (triple extents)", extents, min(64, size - 1))):
        append_result("windows", {"dataset": name, "max_length": args.max_length, "overlap": overlap,
                                  "texts": len(data), **count(data, size, overlap), "machine": machine(),
                                  "command": f"python benchmarks/windows.py --max-length {args.max_length}"})


if __name__ == "__main__":
    with machine_lock():
        main()
