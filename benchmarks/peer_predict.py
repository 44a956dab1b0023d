"""An offline peer's NER over a text file, written as ``zhie predict --output`` writes it, so that
``benchmarks/tradeoff.py --peer`` times the peer the way it times zhie: as a whole process, start included.

    PEER_PYTHON benchmarks/peer_predict.py jiagu --input texts.txt --output out.jsonl

It imports nothing of zhie: it runs in the peer's own environment (``python -m venv peers && peers/bin/pip install
jiagu jieba``). One JSON line per input line, as zhie writes it: ``{"text", "entities": [{"start", "end", "label"}]}``
for NER, ``{"text", "words": [{"start", "end", "text"}]}`` for word segmentation (character offsets, end exclusive).

Peers: ``jiagu`` (Jiagu 0.2.3, its models inside the PyPI package, as its README runs NER: ``jiagu.seg`` cuts the
sentence into words, ``jiagu.ner`` tags the words with BIO tags of PER, LOC and ORG; the spans are the tagged words'
characters); ``jiagu-seg`` (Jiagu's segmenter alone); ``jieba`` (jieba 0.42's default mode, ``jieba.cut``, its
dictionary and HMM inside the package); ``pkuseg`` (0.0.25, its default model; it builds from its sdist:
``pip install numpy cython wheel setuptools``, then ``pip install --no-build-isolation pkuseg``); ``thulac`` (0.2.2,
``seg_only``); ``snownlp`` (0.12.3, ``SnowNLP(text).words``). NER peers other than Jiagu, each in an environment of
its own Python: ``lac`` (Baidu's LAC 2.1.2, ``LAC(mode="lac")``: words with PER, LOC, ORG, TIME tags; Python 3.8,
``pip install "paddlepaddle==1.8.5" "protobuf==3.20.3" "numpy<1.20" lac``) and ``foolnltk`` (FoolNLTK 0.1.7,
``fool.analysis``: person, location, org, company, time, job; Python 3.7, ``pip install "tensorflow-cpu==1.15"
"protobuf==3.20.3" foolnltk``). Their types map to People's Daily's PER, LOC and ORG as ``LAC_LABELS`` and
``FOOL_LABELS`` say. Every peer takes one text at a time, as their READMEs call them. A segmenter's words must join
back into the text (checked on SXU's test sentences for every segmenter here).
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


def pkuseg_cut():
    import pkuseg

    return words(pkuseg.pkuseg().cut)  # its default model (mixed domains), inside the package


def thulac_cut():
    import thulac

    segmenter = thulac.thulac(seg_only=True)
    return words(lambda text: [word for word, _ in segmenter.cut(text)])


def snownlp_cut():
    from snownlp import SnowNLP

    return words(lambda text: SnowNLP(text).words)


# A NER peer's entity types -> People's Daily's labels (the types without one are left out).
LAC_LABELS = {"PER": "PER", "LOC": "LOC", "ORG": "ORG"}  # LAC's TIME has none
FOOL_LABELS = {"person": "PER", "location": "LOC", "org": "ORG", "company": "ORG"}  # its time and job have none


def lac_ner():
    from LAC import LAC

    lac = LAC(mode="lac")

    def ner(text: str) -> list[dict]:
        found, start = [], 0
        for word, tag in zip(*lac.run(text)) if text else []:
            if tag in LAC_LABELS:
                found.append({"start": start, "end": start + len(word), "label": LAC_LABELS[tag]})
            start += len(word)
        return found

    return ner


def fool_ner():
    import fool

    def ner(text: str) -> list[dict]:
        entities = fool.analysis(text)[1][0] if text else []  # (start, end exclusive, type, text)
        return [{"start": s, "end": e, "label": FOOL_LABELS[kind]} for s, e, kind, _ in entities if kind in FOOL_LABELS]

    return ner


# peer -> (the output's key, its module, what builds its function of one text)
PEERS = {"jiagu": ("entities", "jiagu", jiagu_ner), "jiagu-seg": ("words", "jiagu", jiagu_seg),
         "jieba": ("words", "jieba", jieba_cut), "pkuseg": ("words", "pkuseg", pkuseg_cut),
         "thulac": ("words", "thulac", thulac_cut), "snownlp": ("words", "snownlp", snownlp_cut),
         "lac": ("entities", "LAC", lac_ner), "foolnltk": ("entities", "fool", fool_ner)}


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
