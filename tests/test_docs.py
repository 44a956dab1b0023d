"""Every fenced code block of README.md and docs/**/*.md runs here, on tiny models, so that an example that stops
working fails CI.

One test per page (``test_page[docs/tasks/ner.md]``) runs the page's blocks in order, as a reader would, in a
directory of its own: ``WORKSPACE/<page>/``, one level under a module-scoped workspace, so that the docs' paths to the
shared datasets, ``../shared/data/...``, reach the tiny files the workspace writes at ``WORKSPACE/shared/data/``.

- ``python`` blocks are executed, in one namespace per page (a later block uses an earlier one's names).
- ``bash`` blocks: each command (continuation lines joined, comments dropped) must be a ``zhie ...`` command; it runs
  in-process through :func:`zhie.cli.main` after the substitutions below and must return 0. ``> FILE`` at its end
  writes its standard output to FILE. Anything else (another program, a pipe, ``&&``) fails: mark such a block.
- ``toml`` and ``json`` blocks are parsed; ``text`` blocks (outputs, file formats) are not run.
- ``<!-- docs-test: file NAME -->`` on the line before a block writes the block to NAME in the page's directory before
  the page's first block runs (a configuration file, a small data file shown whole, wherever the page shows it).
- ``<!-- docs-test: skip REASON -->`` on the line before a block leaves it out: a server that runs until stopped, a
  cluster, a package install. The reason is required, and there are at most :data:`MAX_SKIPS` skips in all.

Substitutions (:func:`substitute`), each to make a command take seconds on 2 CPU cores:

| in the docs | in the test |
|---|---|
| `../shared/data/...` | tiny files in the same formats (:data:`DATA`), at that path from the page |
| other input files the docs name (`texts.txt`, `export.json`, ...) | tiny files in each page's directory (`FILES`) |
| `--encoder X`: e5-small, a hub name, a directory that does not exist | `--encoder TINY`, a random 2-layer BERT |
| a job that trains an encoder, given no `--encoder` (nor a `--config` that names one) | `--encoder TINY` added |
| `--encoder "new:FAMILY:layers=N,..."` | `layers=1` |
| `--epochs N`; a job that trains (`train`, `distill student`, `distill mtmt`) | `--epochs 1`; `--max-steps 2` added |
| `zhie pretrain --steps N --batch-size B --max-length L` | `--steps 2 --batch-size 4 --max-length 128 --heldout 4` |
| `zhie train xner-evaluator`, `zhie distill mtmt --pairs N` | `--pairs 64` (and `--dev-pairs 32` for the evaluator) |
| `--encoder-layers N`, `--attention-heads K`, `--ffn-width N`, `--bigrams N` | 1, 1, 64, 1024 (the tiny encoder's) |
| a model directory of :data:`MODELS` that a page uses but does not make | a tiny one, trained once for the module |
| `"e5-small"` in Python | TINY's path |

TINY's vocabulary is every character of the tiny files and of the pages. Torch runs on one thread meanwhile (tiny
models run several times faster so on a busy machine). A page that registers a task or a NER head (docs/extending.md)
leaves the registries as they were. The tables between ``<!-- report:NAME -->`` and ``<!-- cli:NAME -->`` markers are
checked against their sources here too.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
WITH_CODE = [p for p in PAGES if "```" in p.read_text(encoding="utf-8")]
MAX_SKIPS = 11
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
LANGUAGES = {"python", "bash", "toml", "json", "text"}


# --------------------------------------------------------------------------------------------- the collector
@dataclass
class Block:
    page: str    # the page, relative to the repository
    line: int    # the line of its opening fence
    lang: str
    text: str
    skip: str | None = None  # the reason of a skip marker
    file: str | None = None  # the file name of a file marker

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


class DocsError(AssertionError):
    """An example that does not run, or a block the collector cannot run (with the page and line)."""


def collect(text: str, page: str) -> list[Block]:
    """The fenced blocks of a page, each with the marker on the line before its fence; a marker elsewhere, one
    without its argument, or a block of a language the collector does not know, is an error."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if MARKER.fullmatch(line.strip()) and not (i + 1 < len(lines) and lines[i + 1].startswith("```")):
            raise DocsError(f"{page}:{i + 1}: a docs-test marker must be on the line right before a code block")
    blocks = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        block = Block(page, line, m[1], m[2])
        marker = MARKER.fullmatch(lines[line - 2].strip()) if line >= 2 else None
        if marker:
            verb, _, arg = marker[1].partition(" ")
            if verb not in ("skip", "file"):
                raise DocsError(f"{page}:{line - 1}: unknown docs-test marker {verb!r} (skip REASON, file NAME)")
            if not arg.strip():
                what = "reason" if verb == "skip" else "name"
                raise DocsError(f"{page}:{line - 1}: docs-test: {verb} needs a {what}")
            setattr(block, verb, arg.strip())
        if block.lang not in LANGUAGES and not block.skip:
            raise DocsError(f"{block.where}: a ```{block.lang} block; the test runs {sorted(LANGUAGES)} (or mark it "
                            "<!-- docs-test: skip REASON -->)")
        blocks.append(block)
    return blocks


def commands(block: Block) -> list[tuple[list[str], str | None]]:
    """``(argv, stdout file)`` of each command of a bash block; anything but ``zhie ...`` is an error."""
    out = []
    for row in block.text.replace("\\\n", " ").split("\n"):
        try:
            words = shlex.split(row, comments=True)
        except ValueError as err:
            raise DocsError(f"{block.where}: {row!r}: {err}") from None
        if not words:
            continue
        redirect = None
        if ">" in words:
            i = words.index(">")
            if len(words) != i + 2:
                raise DocsError(f"{block.where}: {row!r}: only `> FILE` at the end of a command is run")
            words, redirect = words[:i], words[i + 1]
        if words[0] != "zhie" or {"&&", "||", "|", ";", "<"} & set(words):
            raise DocsError(f"{block.where}: {row.strip()!r} is not a zhie command the test can run: make it one, or "
                            "mark the block <!-- docs-test: skip REASON -->")
        out.append((words[1:], redirect))
    return out


# ------------------------------------------------------------------------------------------ the substitutions
SHRINK = {"--epochs": "1", "--encoder-layers": "1", "--attention-heads": "1", "--ffn-width": "64", "--pairs": "64"}
PRETRAIN_SHRINK = {"--steps": "2", "--batch-size": "4", "--max-length": "128"}


def trains(argv: list[str]) -> bool:
    """A job that trains with the training engine's step limit (``--max-steps``)."""
    return argv[:1] == ["train"] or argv[:2] in (["distill", "student"], ["distill", "mtmt"])


def names_an_encoder(argv: list[str], cwd: Path) -> bool:
    """``--encoder`` given, or a ``--config`` file that sets one (a run's config.toml does)."""
    if "--encoder" in argv:
        return True
    if "--config" in argv:
        path = cwd / argv[argv.index("--config") + 1]
        with open(path, "rb") as f:
            data = tomllib.load(f)
        return "encoder" in data or any(isinstance(v, dict) and "encoder" in v for k, v in data.items()
                                        if k != "derived")
    return False


def encoder(value: str, cwd: Path, tiny: str) -> str:
    if value.startswith("new:"):
        return re.sub(r"\blayers=\d+", "layers=1", value)
    return value if value == "tiny" or (cwd / value).exists() else tiny


def substitute(argv: list[str], cwd: Path, tiny: str = "tiny") -> list[str]:
    """``argv`` as the test runs it (the module's table); ``tiny``: the encoder that stands for e5-small."""
    out, i = [], 0
    shrink = {**SHRINK, **(PRETRAIN_SHRINK if argv[:1] == ["pretrain"] else {})}
    while i < len(argv):
        flag = argv[i]
        if flag in shrink and i + 1 < len(argv):
            out += [flag, shrink[flag]]
        elif flag == "--bigrams" and i + 1 < len(argv):
            out += [flag, "1024" if argv[i + 1] != "0" else "0"]
        elif flag == "--encoder" and i + 1 < len(argv):
            out += [flag, encoder(argv[i + 1], cwd, tiny)]
        else:
            out.append(flag)
            i += 1
            continue
        i += 2
    job = out[:2] if out[:1] in (["train"], ["distill"]) else out[:1]
    if (out[:1] in (["train"], ["pretrain"]) or job == ["distill", "mtmt"]) and not names_an_encoder(out, cwd):
        out += ["--encoder", tiny]
    if trains(out) and "--max-steps" not in out:
        out += ["--max-steps", "2"]
    if out[:1] == ["pretrain"] and "--heldout" not in out:
        out += ["--heldout", "4"]
    if job == ["train", "xner-evaluator"]:
        out += [x for x in ["--pairs", "64", "--dev-pairs", "32"] if x not in out]
    return out


def substitute_python(source: str, tiny: str = "tiny") -> str:
    return source.replace('"e5-small"', repr(tiny))


# ----------------------------------------------------------------------------------------------- tiny data
def ner_examples(n: int, seed: int):
    from zhie import demo

    return demo.make_corpus(n, seed)


def cluener(n: int, seed: int) -> str:
    lines = []
    for ex in ner_examples(n, seed):
        label: dict = {}
        for s in ex.spans:
            label.setdefault(s.label.lower(), {}).setdefault(s.text, []).append([s.start, s.end - 1])
        lines.append(json.dumps({"text": ex.text, "label": label}, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def cmeee(n: int, seed: int) -> str:
    return json.dumps([{"text": ex.text, "entities": [{"start_idx": s.start, "end_idx": s.end - 1, "type": s.label,
                                                       "entity": s.text} for s in ex.spans]}
                       for ex in ner_examples(n, seed)], ensure_ascii=False, indent=0)


def segmented(n: int, seed: int) -> str:
    return "".join("  ".join([s.text for s in ex.spans] + ["了"]) + "\n" for ex in ner_examples(n, seed))


def pairs(n: int, seed: int) -> str:
    texts = [ex.text for ex in ner_examples(n, seed)]
    return "".join(f"{a}\t{b}\t{int(a[:2] == b[:2]) * 5}\n" for a, b in zip(texts, texts[1:] + texts[:1]))


WORDS = {"PER": ["Angela Merkel", "Olaf", "Anna Schmidt", "John Smith"], "LOC": ["Paris", "Berlin", "New York"],
         "ORG": ["Siemens", "the United Nations"]}
TEMPLATES = ["{PER} visits {LOC} .", "{PER} works for {ORG} in {LOC} .", "{ORG} opened an office in {LOC} ."]


def wikiann(lang: str, n: int, seed: int) -> str:
    rng, sentences = random.Random(seed), []
    for _ in range(n):
        rows = []
        for word in rng.choice(TEMPLATES).split():
            if word.startswith("{"):
                kind = word[1:-1]
                rows += [f"{lang}:{w}\t{'B' if j == 0 else 'I'}-{kind}"
                         for j, w in enumerate(rng.choice(WORDS[kind]).split())]
            else:
                rows.append(f"{lang}:{word}\tO")
        sentences.append("\n".join(rows))
    return "\n\n".join(sentences) + "\n"


def relations(n: int, seed: int) -> tuple[str, str]:
    from tests.tiny_models import relation_corpus

    records = relation_corpus(n, seed)
    schema = [{"subject_type": "人物", "predicate": "毕业于", "object_type": "机构"},
              {"subject_type": "机构", "predicate": "位于", "object_type": "地点"}]
    return ("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in schema))


def paragraphs(n: int, seed: int) -> str:
    from tests.tiny_models import paragraphs as make

    return "\n".join(make(n, seed)) + "\n"


def texts(n: int, seed: int) -> str:
    return "".join(ex.text + "\n" for ex in ner_examples(n, seed))


def label_studio(n: int, seed: int) -> str:
    tasks = []
    for i, ex in enumerate(ner_examples(n, seed)):
        result = [{"id": f"r{j}", "from_name": "label", "to_name": "text", "type": "labels",
                   "value": {"start": s.start, "end": s.end, "text": s.text, "labels": [s.label]}}
                  for j, s in enumerate(ex.spans)]
        tasks.append({"id": i + 1, "data": {"text": ex.text}, "predictions": [],
                      "annotations": [{"id": 100 + i, "was_cancelled": False, "ground_truth": False,
                                       "updated_at": "2026-01-01T00:00:00.000000Z", "result": result}]})
    return json.dumps(tasks, ensure_ascii=False, indent=1)


def doccano(n: int, seed: int) -> str:
    return "".join(json.dumps({"text": ex.text, "label": [[s.start, s.end, s.label] for s in ex.spans]},
                              ensure_ascii=False) + "\n" for ex in ner_examples(n, seed))


def doccano_relations(n: int, seed: int) -> str:
    from tests.tiny_models import relation_corpus

    lines = []
    for record in relation_corpus(n, seed):
        text, entities, ids = record["text"], [], {}
        for spo in record["spo_list"]:
            for mention in (spo["subject"], spo["object"]["@value"]):
                if mention not in ids:
                    start = text.index(mention)
                    ids[mention] = len(entities) + 1
                    entities.append({"id": ids[mention], "start_offset": start, "end_offset": start + len(mention),
                                     "label": "ENTITY"})
        rels = [{"id": k + 1, "from_id": ids[spo["subject"]], "to_id": ids[spo["object"]["@value"]],
                 "type": spo["predicate"]} for k, spo in enumerate(record["spo_list"])]
        lines.append(json.dumps({"text": text, "entities": entities, "relations": rels}, ensure_ascii=False))
    return "\n".join(lines) + "\n"


# the shared datasets, at their paths under ../shared/data (each a few sentences in the corpus's own format)
DATA = {
    "ner/cluener/train.json": lambda: cluener(16, 1),
    "ner/cluener/dev.json": lambda: cluener(8, 2),
    "ner/cluener/test.json": lambda: "".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n"
                                             for i, t in enumerate(texts(8, 3).split("\n")[:8])),
    "ner/cmeee/train.json": lambda: cmeee(16, 4),
    "ner/cmeee/dev.json": lambda: cmeee(8, 5),
    "cws/sxu/train.txt": lambda: segmented(16, 6),
    "cws/sxu/test.txt": lambda: segmented(8, 7),
    "re/cmeie/train.jsonl": lambda: relations(16, 8)[0],
    "re/cmeie/dev.jsonl": lambda: relations(8, 9)[0],
    "re/cmeie/schema.json": lambda: relations(1, 8)[1],
    "sts/stsb/train.data": lambda: pairs(16, 10),
    "sts/stsb/valid.data": lambda: pairs(8, 11),
    "xner/wikiann/en/train": lambda: wikiann("en", 16, 12),
    "xner/wikiann/en/dev": lambda: wikiann("en", 8, 13),
    "xner/wikiann/de/train": lambda: wikiann("de", 16, 14),
    "xner/wikiann/de/dev": lambda: wikiann("de", 8, 15),
    "corpus/wiki.txt": lambda: paragraphs(12, 16),
    "corpus/medical.txt": lambda: paragraphs(12, 17),
}

# the other files the docs read, written into each page's directory
FILES = {
    "texts.txt": lambda: texts(6, 20) + "\n" + texts(2, 21),   # a blank line: an empty result
    "corpus.txt": lambda: texts(12, 22),
    "corpus.jsonl": lambda: "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n"
                                    for t in texts(4, 23).split("\n")[:4]) + "{not json\n",
    "wiki_sentences.txt": lambda: texts(12, 24),
    "export.json": lambda: label_studio(12, 25),
    "doccano_train.jsonl": lambda: doccano(12, 26),
    "doccano_dev.jsonl": lambda: doccano(6, 27),
    "doccano_relations.jsonl": lambda: doccano_relations(12, 28),
    "doccano_relations_dev.jsonl": lambda: doccano_relations(6, 29),
}

# model directories the docs use on pages that do not make them: the command that makes each (run once)
MODELS = {
    "runs/cluener-egp": "train ner --train ../shared/data/ner/cluener/train.json "
                        "--dev ../shared/data/ner/cluener/dev.json --head egp --out runs/cluener-egp",
    "runs/cluener-gp": "train ner --train ../shared/data/ner/cluener/train.json "
                       "--dev ../shared/data/ner/cluener/dev.json --head gp --out runs/cluener-gp",
    "runs/sxu-crf": "train cws --train ../shared/data/cws/sxu/train.txt --dev ../shared/data/cws/sxu/test.txt "
                    "--out runs/sxu-crf",
    "runs/cmeie-egp": "train re --train ../shared/data/re/cmeie/train.jsonl --dev ../shared/data/re/cmeie/dev.jsonl "
                      "--schema ../shared/data/re/cmeie/schema.json --out runs/cmeie-egp",
    "runs/stsb-cosent": "train sts --train ../shared/data/sts/stsb/train.data "
                        "--dev ../shared/data/sts/stsb/valid.data --out runs/stsb-cosent",
}


# ----------------------------------------------------------------------------------------------- the runner
def run_zhie(argv: list[str]) -> tuple[int, str, str]:
    """``zhie ARGV`` in this process: (exit status, stdout, stderr)."""
    from zhie.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit:  # argparse: a bad flag
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    return code, out.getvalue(), err.getvalue()


class Workspace:
    """The module's directory: the tiny datasets under ``shared/data``, the encoder that stands for e5-small, the
    shared models under ``_models``, and a directory per page."""

    def __init__(self, root: Path) -> None:
        from zhie import encoders

        self.root = root
        for name, make in DATA.items():
            path = root / "shared" / "data" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(make(), encoding="utf-8")
        self.files = {name: make() for name, make in FILES.items()}
        self.tiny = str(root / "tiny-encoder")
        characters = [path.read_text(encoding="utf-8") for path in [*(root / "shared").rglob("*.*"), *PAGES]]
        model, tokenizer = encoders.tiny([*characters, *self.files.values(), *(c.upper() for c in characters)])
        model.save_pretrained(self.tiny)
        tokenizer.save_pretrained(self.tiny)
        self.models = root / "_models"
        self.models.mkdir()

    def model(self, name: str) -> Path:
        """The shared tiny model ``name`` (a key of :data:`MODELS`), trained on first use."""
        path = self.models / name
        if not path.exists():
            run(self.models, substitute(shlex.split(MODELS[name]), self.models, self.tiny), f"MODELS[{name!r}]")
        return path

    def page_dir(self, page: str, text: str) -> Path:
        cwd = self.root / re.sub(r"[^\w.-]", "-", page)
        cwd.mkdir()
        for name, content in self.files.items():
            (cwd / name).write_text(content, encoding="utf-8")
        for name in MODELS:  # a model the page uses but does not make
            if re.search(rf"{re.escape(name)}\b(?![\w-])", text) and not re.search(
                    rf"""(--out\s+|out=["']){re.escape(name)}(?![\w-])""", text):
                (cwd / name).parent.mkdir(parents=True, exist_ok=True)
                (cwd / name).symlink_to(self.model(name), target_is_directory=True)
        return cwd


def run(cwd: Path, argv: list[str], where: str) -> str:
    """Run ``zhie ARGV`` in ``cwd``; its stdout, or :class:`DocsError` with what it said."""
    old = Path.cwd()
    os.chdir(cwd)
    try:
        code, out, err = run_zhie(argv)
    finally:
        os.chdir(old)
    if code != 0:
        raise DocsError(f"{where}: `zhie {shlex.join(argv)}` exited with {code}:\n{err[-3000:]}")
    return out


@contextlib.contextmanager
def registries_kept():
    """The task and NER-head registries as they were before, whatever a page registers."""
    from zhie import tasks
    from zhie.tasks import ner_heads

    tasks.all_tasks()
    saved = [(d, dict(d)) for d in (tasks._REGISTRY, tasks._ALIASES, ner_heads.NER_HEADS)]
    try:
        yield
    finally:
        for d, old in saved:
            d.clear()
            d.update(old)


def run_page(workspace: Workspace, page: str, text: str) -> dict:
    """Run every block of ``text`` (the page ``page``) in a new directory of ``workspace``; what ran, by kind."""
    blocks = collect(text, page)
    cwd = workspace.page_dir(page, text)
    for block in blocks:
        if block.file and not block.skip:
            (cwd / block.file).write_text(block.text, encoding="utf-8")
    module = types.ModuleType("docs_test_" + re.sub(r"\W", "_", page))  # a module: dataclasses look theirs up
    ran = {"python": 0, "zhie": 0, "file": sum(bool(b.file) for b in blocks), "parsed": 0, "skipped": 0}
    sys.modules[module.__name__] = module
    try:
        with registries_kept():
            for block in blocks:
                if block.skip:
                    ran["skipped"] += 1
                elif block.lang == "python":
                    python(block, cwd, module, workspace.tiny)
                    ran["python"] += 1
                elif block.lang == "bash":
                    for argv, redirect in commands(block):
                        out = run(cwd, substitute(argv, cwd, workspace.tiny), block.where)
                        if redirect:
                            (cwd / redirect).write_text(out, encoding="utf-8")
                        ran["zhie"] += 1
                elif block.lang == "toml":
                    tomllib.loads(block.text)
                    ran["parsed"] += 1
                elif block.lang == "json":
                    json.loads(block.text)
                    ran["parsed"] += 1
    finally:
        del sys.modules[module.__name__]
    return ran


def python(block: Block, cwd: Path, module: types.ModuleType, tiny: str) -> None:
    """Execute a python block in ``module``'s namespace, in ``cwd``."""
    old = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(substitute_python(block.text, tiny), block.where, "exec"), module.__dict__)
    except Exception as err:
        raise DocsError(f"{block.where}: the python block fails: {type(err).__name__}: {err}") from err
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The module's workspace; torch on one thread meanwhile (tiny models: several times faster than two threads
    that wait on each other, the more so on a busy machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield Workspace(tmp_path_factory.mktemp("docs"))
    finally:
        torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("page", WITH_CODE, ids=[str(p.relative_to(ROOT)) for p in WITH_CODE])
def test_page(workspace, page):
    """Every block of the page runs (or is marked, with its reason)."""
    name = str(page.relative_to(ROOT))
    ran = run_page(workspace, name, page.read_text(encoding="utf-8"))
    assert sum(ran.values()), f"{name}: no code block"


def test_skips_are_few_and_say_why():
    skips = [b for p in PAGES for b in collect(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT))) if b.skip]
    assert all(len(b.skip.split()) >= 2 for b in skips), [b.where for b in skips if len(b.skip.split()) < 2]
    assert len(skips) <= MAX_SKIPS, [f"{b.where}: {b.skip}" for b in skips]


def test_a_broken_example_fails_the_collector(workspace):
    """An unknown flag, a command that fails, a line that is not zhie, and a bad marker each fail with the page and
    line; the same page with a correct command runs."""
    good = "# page\n\n```bash\nzhie predict runs/cluener-egp \"王伟在青山市工作。\"\n```\n"
    assert run_page(workspace, "good.md", good)["zhie"] == 1
    bad = good.replace("zhie predict", "zhie predict --no-such-flag")
    with pytest.raises(DocsError, match=r"bad\.md:3: `zhie predict --no-such-flag .*` exited with 2"):
        run_page(workspace, "bad.md", bad)
    with pytest.raises(DocsError, match=r"missing\.md:3: .* exited with 2:\n.*no-such-model"):
        run_page(workspace, "missing.md", good.replace("runs/cluener-egp", "runs/no-such-model"))
    with pytest.raises(DocsError, match=r"not a zhie command"):
        run_page(workspace, "curl.md", good.replace("zhie predict", "curl -s localhost:8000 && zhie predict"))
    with pytest.raises(DocsError, match=r"python block fails: NameError"):
        run_page(workspace, "python.md", "```python\nprint(undefined_name)\n```\n")
    with pytest.raises(DocsError, match=r"needs a reason"):
        collect("<!-- docs-test: skip -->\n```bash\nzhie serve x\n```\n", "reason.md")
    with pytest.raises(DocsError, match=r"right before a code block"):
        collect("<!-- docs-test: skip because -->\n\nsome text\n```bash\nzhie serve x\n```\n", "far.md")
    with pytest.raises(DocsError, match=r"```yaml block"):
        collect("```yaml\na: 1\n```\n", "yaml.md")


def test_substitutions():
    cwd = ROOT
    assert substitute(["train", "ner", "--train", "t", "--dev", "d", "--encoder", "e5-small", "--epochs", "6",
                       "--out", "o"], cwd) == ["train", "ner", "--train", "t", "--dev", "d", "--encoder", "tiny",
                                               "--epochs", "1", "--out", "o", "--max-steps", "2"]
    assert substitute(["train", "cws", "--encoder", "new:roformer-v2:layers=24,hidden=256"], cwd)[3] == \
        "new:roformer-v2:layers=1,hidden=256"
    assert substitute(["pretrain", "--corpus", "c", "--steps", "20000", "--out", "o"], cwd) == \
        ["pretrain", "--corpus", "c", "--steps", "2", "--out", "o", "--encoder", "tiny", "--heldout", "4"]
    assert substitute(["distill", "student", "--teacher", "t", "--encoder-layers", "4", "--bigrams", "65536"], cwd) \
        == ["distill", "student", "--teacher", "t", "--encoder-layers", "1", "--bigrams", "1024", "--max-steps", "2"]
    assert substitute(["predict", "runs/x", "--input", "texts.txt"], cwd) == ["predict", "runs/x", "--input",
                                                                              "texts.txt"]
    assert substitute_python('zhie.fit("ner", encoder="e5-small")') == "zhie.fit(\"ner\", encoder='tiny')"


def test_the_readme_test_command_reports_how_many_passed(tmp_path):
    """The README's ``python -m pytest ...`` (which .ci/run reruns) under pyproject's pytest options (its ``addopts``)
    ends with pytest's ``N passed`` line (``-q`` twice, once from each, is ``-qq``: no such line)."""
    (command,) = re.findall(r"&& (python -m pytest[^\n`]*)", (ROOT / "README.md").read_text(encoding="utf-8"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_one.py").write_text("def test_one():\n    pass\n", encoding="utf-8")
    args = shlex.split(command)[3:]
    result = subprocess.run([sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^1 passed in ", result.stdout, re.MULTILINE), result.stdout


def load_script(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tables_of_the_docs_are_what_their_sources_give():
    """A table between ``<!-- report:NAME -->`` markers is what ``benchmarks/report.py`` makes from the result rows;
    one between ``<!-- cli:NAME -->`` markers is what ``docs/cli_reference.py`` makes from the command's parsers."""
    report, cli = load_script(ROOT / "benchmarks" / "report.py"), load_script(ROOT / "docs" / "cli_reference.py")
    stale = []
    for page in PAGES:
        text, name = page.read_text(encoding="utf-8"), page.relative_to(ROOT)
        stale += [f"{name}: {t} (python benchmarks/report.py --write --doc {name})" for t in report.stale(text)]
        stale += [f"{name}: {t} (python docs/cli_reference.py --write)" for t in cli.stale(text)]
    assert not stale, stale
    page = (ROOT / "docs" / "training" / "configuration.md").read_text(encoding="utf-8")
    assert cli.marked_tables.marked(page, "cli", cli.TABLES)
