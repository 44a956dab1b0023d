"""Tiny models for the serving and export tests, trained in seconds on sentences written here (zhie.demo's names).

``nested_corpus`` has nested entities: an organisation named after its place (``青山市大学``: ORG, with the LOC
``青山市`` inside). Each ``train_*`` function trains one model with the ``tiny`` encoder and returns its directory.
"""

from __future__ import annotations

import atexit
import functools
import json
import random
import shutil
import tempfile
from pathlib import Path

import zhie
from zhie import demo
from zhie.core.spans import Span
from zhie.data import NerExample, write_ner_jsonl
from zhie.training import TrainConfig

NESTED_TEMPLATES = ["{PER}在{ORG}工作。", "{PER}去了{LOC}。", "{ORG}位于{LOC}。", "{PER}毕业于{ORG}，住在{LOC}。",
                    "记者从{ORG}获悉，{PER}将前往{LOC}。"]


def _mention(rng: random.Random, label: str) -> tuple[str, list[tuple[int, int, str]]]:
    """A mention and its spans relative to it (an ORG is a LOC followed by an organisation word)."""
    if label == "PER":
        name = rng.choice(demo.SURNAMES) + "".join(rng.choices(demo.GIVEN, k=rng.choice([1, 2])))
        return name, [(0, len(name), "PER")]
    place = "".join(rng.choices(demo.PLACE_HEADS, k=2)) + rng.choice(demo.PLACE_TAILS)
    if label == "LOC":
        return place, [(0, len(place), "LOC")]
    org = place + rng.choice(demo.ORG_TAILS)
    return org, [(0, len(org), "ORG"), (0, len(place), "LOC")]


def nested_corpus(n: int, seed: int) -> list[NerExample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text, spans, rest = "", [], rng.choice(NESTED_TEMPLATES)
        while "{" in rest:
            head, _, tail = rest.partition("{")
            label, _, rest = tail.partition("}")
            text += head
            mention, parts = _mention(rng, label)
            spans += [Span(len(text) + s, len(text) + e, lab, mention[s:e]) for s, e, lab in parts]
            text += mention
        out.append(NerExample(text + rest, spans))
    return out


@functools.cache
def trained(kind: str) -> Path:
    """One model per kind for the whole test session (``ner-gp``, ``ner-egp``, ``ner-crf``, ``ner-softmax``,
    ``re``, ``cws``, ``similarity``), trained once in a temporary directory removed at exit."""
    out = Path(tempfile.mkdtemp(prefix=f"zhie-{kind}-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    if kind == "ner-gp":  # the one that must be good: nested entities on the page, int8 against an accuracy floor
        return train_ner(out, "gp")
    if kind.startswith("ner-"):
        return train_ner(out, kind[4:], n=120, epochs=4)
    return {"re": train_relation, "cws": train_cws, "similarity": train_similarity,
            "multitask": train_multitask}[kind](out)


def _config(epochs: int, lr: float = 2e-3, batch_size: int = 16) -> TrainConfig:
    return TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, head_lr=lr, warmup=0.05, seed=0, eval_every=10**9)


def train_ner(out: Path, head: str = "gp", n: int = 240, epochs: int = 12, max_length: int = 64) -> Path:
    """A NER model on the nested corpus (the taggers keep the outermost entities)."""
    out.mkdir(parents=True, exist_ok=True)
    write_ner_jsonl(nested_corpus(n, seed=1), out / "train.jsonl")
    write_ner_jsonl(nested_corpus(40, seed=2), out / "dev.jsonl")
    config = _config(epochs, 1e-3 if head == "gp" else 2e-3)
    zhie.fit("ner", out / "train.jsonl", out / "dev.jsonl", out=out / "run", encoder="tiny", head=head,
             max_length=max_length, flatten=head in ("crf", "softmax"), config=config, resume=False, progress=False)
    return out / "run" / "best"


def relation_corpus(n: int, seed: int) -> list[dict]:
    """'{PER}毕业于{ORG}，{ORG}位于{LOC}。' sentences with their two triples, as CMeIE JSON records."""
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        per, org, loc = (demo._entity(rng, x) for x in ("PER", "ORG", "LOC"))
        spo = [{"subject": per, "predicate": "毕业于", "object": {"@value": org}},
               {"subject": org, "predicate": "位于", "object": {"@value": loc}}]
        records.append({"text": f"{per}毕业于{org}，{org}位于{loc}。", "spo_list": spo})
    return records


def write_relation_data(out: Path, n: int = 40, seed: int = 3) -> tuple[Path, Path]:
    """``out/re.jsonl`` with :func:`relation_corpus` sentences and ``out/schema.json``, their schema (CMeIE's
    formats)."""
    lines = [json.dumps(r, ensure_ascii=False) for r in relation_corpus(n, seed)]
    (out / "re.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    schema = [{"subject_type": "人物", "predicate": "毕业于", "object_type": "机构"},
              {"subject_type": "机构", "predicate": "位于", "object_type": "地点"}]
    (out / "schema.json").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in schema),
                                     encoding="utf-8")
    return out / "re.jsonl", out / "schema.json"


def train_relation(out: Path, head: str = "egp", n: int = 100, epochs: int = 6) -> Path:
    """GPLinker on :func:`relation_corpus` sentences."""
    out.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r, ensure_ascii=False) for r in relation_corpus(n, seed=3)]
    (out / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    zhie.fit("re", out / "train.jsonl", out / "train.jsonl", out=out / "run", encoder="tiny", head=head,
             max_length=48, config=_config(epochs), resume=False, progress=False)
    return out / "run" / "best"


def paragraphs(n: int, seed: int, sentences: int = 6) -> list[str]:
    """``n`` lines of running text, ``sentences`` of :func:`zhie.demo.make_corpus`'s each (about 110 characters, a
    wiki paragraph's length): a corpus to pre-train on."""
    corpus = [ex.text for ex in demo.make_corpus(n * sentences, seed)]
    return ["".join(corpus[i:i + sentences]) for i in range(0, len(corpus), sentences)]


def write_segmented_corpus(path: Path) -> Path:
    lines = ["  ".join([s.text for s in ex.spans] + ["了"]) for ex in demo.make_corpus(120, seed=4)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_pairs(path: Path) -> Path:
    sentences = [ex.text for ex in demo.make_corpus(80, seed=5)]
    rows = [f"{a}\t{b}\t{int(a[:2] == b[:2])}" for a, b in zip(sentences, sentences[1:] + sentences[:1])]
    rows += [f"{a}\t{a}\t1" for a in sentences[:20]]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def train_cws(out: Path, epochs: int = 4) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_segmented_corpus(out / "train.txt")
    zhie.fit("cws", out / "train.txt", out / "train.txt", out=out / "run", encoder="tiny", head="crf",
             config=_config(epochs), resume=False, progress=False)
    return out / "run" / "best"


def train_similarity(out: Path, epochs: int = 2) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_pairs(out / "pairs.tsv")
    zhie.fit("similarity", out / "pairs.tsv", out / "pairs.tsv", out=out / "run", encoder="tiny", max_length=32,
             config=_config(epochs), resume=False, progress=False)
    return out / "run" / "best"


def write_multitask_data(out: Path) -> Path:
    """``out`` with 24 made-up sentences for each of a NER (``ner.json``), a CWS (``cws.txt``) and a similarity
    (``sim.tsv``) member of a multi-task config (:func:`multitask_config`)."""
    examples = demo.make_corpus(24, seed=4)
    write_ner_jsonl(examples, out / "ner.json")
    (out / "cws.txt").write_text("".join("  ".join([s.text for s in ex.spans] + ["了"]) + "\n" for ex in examples),
                                 encoding="utf-8")
    texts = [ex.text for ex in examples]
    pairs = [f"{a}\t{b}\t{int(a[:2] == b[:2])}" for a, b in zip(texts, texts[1:] + texts[:1])]
    (out / "sim.tsv").write_text("\n".join(pairs) + "\n", encoding="utf-8")
    return out


MEMBERS = {"ner": ("ner", "ner.json", '{head = "gp", max_length = 32}'), "seg": ("cws", "cws.txt", "{max-length = 32}"),
           "sim": ("similarity", "sim.tsv", '{loss = "cosent"}')}  # task, file (train and dev), options


def multitask_config(data: Path, out: Path, weighting: str, members=("ner", "seg"), sampling: str = "") -> Path:
    """``out/mt.toml``: the ``members`` (names of :data:`MEMBERS`) on the files of ``data``
    (:func:`write_multitask_data`), each with batch_size 4; ``weighting`` and ``sampling``: the lines of the
    ``[weighting]`` and ``[sampling]`` tables."""
    config = out / "mt.toml"
    config.write_text(f"[weighting]\n{weighting}\n[sampling]\n{sampling}\n" + "".join(
        f'[[tasks]]\nname = "{m}"\ntask = "{task}"\ntrain = "{data / file}"\ndev = "{data / file}"\n'
        f"options = {options}\nbatch_size = 4\n" for m in members for task, file, options in [MEMBERS[m]]),
        encoding="utf-8")
    return config


MULTITASK_CONFIG = """
[[tasks]]
name = "ner"
task = "ner"
train = "ner.jsonl"
dev = "ner.jsonl"
options = {head = "crf", flatten = true, max_length = 64}

[[tasks]]
name = "cws"
task = "cws"
train = "cws.txt"
dev = "cws.txt"

[[tasks]]
name = "sim"
task = "similarity"
train = "pairs.tsv"
dev = "pairs.tsv"
options = {max_length = 32}
"""


def train_multitask(out: Path, epochs: int = 4) -> Path:
    """NER (CRF), segmentation and sentence embeddings on one encoder (members ``ner``, ``cws``, ``sim``)."""
    out.mkdir(parents=True, exist_ok=True)
    write_ner_jsonl(nested_corpus(120, seed=1), out / "ner.jsonl")
    write_segmented_corpus(out / "cws.txt")
    write_pairs(out / "pairs.tsv")
    (out / "mt.toml").write_text(MULTITASK_CONFIG, encoding="utf-8")
    zhie.fit("multitask", out=out / "run", encoder="tiny", tasks_file=out / "mt.toml", config=_config(epochs),
             resume=False, progress=False)
    return out / "run" / "best"
