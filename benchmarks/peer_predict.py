"""An offline peer's NER over a text file, written as ``zhie predict --output`` writes it, so that
``benchmarks/tradeoff.py --peer`` times the peer the way it times zhie: as a whole process, start included.

    PEER_PYTHON benchmarks/peer_predict.py jiagu --input texts.txt --output out.jsonl

It imports nothing of zhie: it runs in the peer's own environment (``python -m venv peers && peers/bin/pip install
jiagu``). One JSON line per input line: ``{"text", "entities": [{"start", "end", "label"}]}`` (character offsets,
end exclusive).

Peers: ``jiagu`` (Jiagu 0.2.3, its models inside the PyPI package, as its README runs NER: ``jiagu.seg`` cuts the
sentence into words, ``jiagu.ner`` tags the words with BIO tags of PER, LOC and ORG; the spans are the tagged words'
characters).
"""

from __future__ import annotations

import argparse
import json


def bio_spans(tags: list[str]) -> list[dict]:
    """Spans (token offsets) of a BIO tag sequence: ``B-X`` starts one, ``I-X`` continues one of ``X`` (else starts one)."""
    spans, start, label = [], None, None
    for k, tag in enumerate(tags + ["O"]):
        inside = tag.startswith("I-") and label == tag[2:]
        if start is not None and not inside:
            spans.append({"start": start, "end": k, "label": label})
            start = label = None
        if tag[:2] in ("B-", "I-") and not inside:
            start, label = k, tag[2:]
    return spans


def jiagu_ner():
    import jiagu

    def ner(text: str) -> list[dict]:
        if not text:
            return []
        words = jiagu.seg(text)
        starts = [0]
        for word in words:
            starts.append(starts[-1] + len(word))
        return [{**span, "start": starts[span["start"]], "end": starts[span["end"]]}
                for span in bio_spans(jiagu.ner(words))]

    return ner


PEERS = {"jiagu": jiagu_ner}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("peer", choices=sorted(PEERS))
    p.add_argument("--input", required=True, help="one text per line")
    p.add_argument("--output", required=True, help="JSON lines, one per input line")
    args = p.parse_args()
    ner = PEERS[args.peer]()
    with open(args.input, encoding="utf-8") as src, open(args.output, "w", encoding="utf-8") as out:
        for line in src:
            text = line.rstrip("\n")
            out.write(json.dumps({"text": text, "entities": ner(text)}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
