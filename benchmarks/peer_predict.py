"""An offline peer's NER over a text file, written as ``zhie predict --output`` writes it, so that
``benchmarks/tradeoff.py --peer`` times the peer the way it times zhie: as a whole process, start included.

    PEER_PYTHON benchmarks/peer_predict.py jiagu --input texts.txt --output out.jsonl

It imports nothing of zhie: it runs in the peer's own environment (``python -m venv peers && peers/bin/pip install
jiagu jieba``). One JSON line per input line, as zhie writes it: ``{"text", "entities": [{"start", "end", "label"}]}``
for NER, ``{"text", "words": [{"start", "end", "text"}]}`` for word segmentation (character offsets, end exclusive).

Peers: ``jiagu`` (Jiagu 0.2.3, its models inside the PyPI package, as its README runs NER: ``jiagu.seg`` cuts the
sentence into words, ``jiagu.ner`` tags the words with BIO tags of PER, LOC and ORG; the spans are the tagged words'
characters); ``jiagu-seg`` (Jiagu's segmenter alone); ``jieba`` (jieba 0.42's default mode, ``jieba.cut``, its
dictionary and HMM inside the package).
"""

from __future__ import annotations

import argparse
import json


def bio_spans(tags: list[str]) -> list[dict]:
    """Spans (token offsets) of a BIO tag sequence: ``B-X`` starts one, ``I-X`` continues one of ``X`` (else starts
    one)."""
    spans, start, label = [], None, None
    for k, tag in enumerate(tags + ["O"]):
        inside = tag.startswith("I-") and label == tag[2:]
        if start is not None and not inside:
            spans.append({"start": start, "end": k, "label": label})
            start = label = None
        if tag[:2] in ("B-", "I-") and not inside:
            start, label = k, tag[2:]
    return spans


def words(cut):
    """A segmenter's ``{"start", "end", "text"}`` words from ``cut(text) -> [word]``."""
    def segment(text: str) -> list[dict]:
        found, start = [], 0
        for word in cut(text) if text else []:
            found.append({"start": start, "end": start + len(word), "text": word})
            start += len(word)
        return found
    return segment


def jiagu_ner():
    import jiagu

    segment = words(jiagu.seg)

    def ner(text: str) -> list[dict]:
        found = segment(text)
        return [{"start": found[span["start"]]["start"], "end": found[span["end"] - 1]["end"], "label": span["label"]}
                for span in bio_spans(jiagu.ner([w["text"] for w in found]))]

    return ner


def jiagu_seg():
    import jiagu

    return words(jiagu.seg)


def jieba_cut():
    import jieba

    jieba.setLogLevel(60)  # no "Building prefix dict" lines
    return words(jieba.lcut)


# peer -> (the output's key, its module, what builds its function of one text)
PEERS = {"jiagu": ("entities", "jiagu", jiagu_ner), "jiagu-seg": ("words", "jiagu", jiagu_seg),
         "jieba": ("words", "jieba", jieba_cut)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("peer", choices=sorted(PEERS))
    p.add_argument("--input", required=True, help="one text per line")
    p.add_argument("--output", required=True, help="JSON lines, one per input line")
    args = p.parse_args()
    key, _, build = PEERS[args.peer]
    run = build()
    with open(args.input, encoding="utf-8") as src, open(args.output, "w", encoding="utf-8") as out:
        for line in src:
            text = line.rstrip("\n")
            out.write(json.dumps({"text": text, key: run(text)}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
