"""How often an entity boundary falls inside one of the encoder's own tokens (issue 17, item 4).

    python benchmarks/boundaries.py --encoder e5-small

In ``--mode subword`` a span head can only predict spans that start at a token's first character and end at a token's
last one; an entity whose start or end lies inside a multi-character piece (e5's XLM-R vocabulary holds many
multi-character Chinese pieces) cannot be predicted exactly. This counts such entities per dataset and split, with
zhie's own tokenisation (:class:`zhie.core.text.TextTokenizer`, offsets trimmed of whitespace), before any training: the
fraction is a ceiling on subword-mode recall's loss. Char mode (one token per character) has none by construction.
One JSON line per dataset/split in ``benchmarks/results/boundaries.jsonl``.
"""

from __future__ import annotations

import argparse
import sys
from datetime import date

from common import DATA, append_result, machine, machine_lock

from zhie import encoders
from zhie.core.text import TextTokenizer
from zhie.data import read_ner

FILES = {
    "cluener": ["ner/cluener/train.json", "ner/cluener/dev.json"],
    "cmeee": ["ner/cmeee/train.json", "ner/cmeee/dev.json"],
    "peoples_daily": ["ner/peoples_daily/example.dev"],
}


def count(examples, tokenizer: TextTokenizer) -> dict:
    entities = inside = inside_start = inside_end = 0
    pieces = chars = 0
    for ex in examples:
        enc = tokenizer(ex.text)
        starts, ends = set(enc.starts), set(enc.ends)
        pieces += len(enc)
        chars += sum(e - s for s, e in zip(enc.starts, enc.ends))
        for span in ex.spans:
            bad_start, bad_end = span.start not in starts, span.end not in ends
            entities += 1
            inside += bad_start or bad_end
            inside_start += bad_start
            inside_end += bad_end
    return {"entities": entities, "inside_piece": inside, "inside_share": inside / max(entities, 1),
            "start_inside": inside_start, "end_inside": inside_end, "chars_per_piece": chars / max(pieces, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--encoder", default="e5-small")
    p.add_argument("--datasets", nargs="*", default=sorted(FILES))
    args = p.parse_args()
    _, tokenizer = encoders.load(args.encoder)
    subword = TextTokenizer(tokenizer, "subword")
    for name in args.datasets:
        for file in FILES[name]:
            row = {"dataset": name, "file": file, "encoder": args.encoder, "mode": "subword",
                   **count(read_ner(DATA / file), subword), "machine": machine(), "date": date.today().isoformat(),
                   "command": "python " + " ".join(sys.argv)}
            append_result("boundaries", row)
            print(f"{name:14} {file:32} entities {row['entities']:6d}  inside a piece {row['inside_piece']:6d} "
                  f"({100 * row['inside_share']:.1f} %)  chars/piece {row['chars_per_piece']:.2f}", flush=True)


if __name__ == "__main__":
    with machine_lock():
        main()
