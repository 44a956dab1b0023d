"""Pack what a benchmark run on a lent GPU machine needs into ``.devcarry/`` (git-ignored, under 64 MiB).

    python benchmarks/device_pack.py

The GPU machine sees only the repository, so this copies the datasets the benchmarks read and writes
e5-small with its vocabulary pruned to CJK ideographs, ASCII, punctuation and every character of those
datasets, plus every subword piece of the sentence-pair data's sentences with and without e5's ``"query: "``
prefix (``.devcarry/e5-small-pruned``, safetensors in fp32). Char-mode training prunes e5-small to exactly
such a set anyway (``--keep-tokens auto``), pruning keeps the hidden states of kept tokens unchanged, and a
Unigram tokenizer segments a text the same way as long as the pieces of its best segmentation are kept, so a
run on the pruned copy equals a run on e5-small. The weights travel xz-compressed (lossless, ~22 MiB:
dequantised 4-bit values compress well). On the GPU machine:

    python3 benchmarks/device_pack.py --unpack
    ZHIE_DATA=.devcarry/data python3 benchmarks/ner.py --encoder .devcarry/e5-small-pruned ...

With ``--campaign PREFIX`` it also packs the campaign's ner.py rows left whose key starts with PREFIX
(``.devcarry/rows.txt``: key and training options) and the code of their commit (``.devcarry/tree``, with a file
``COMMIT``); ``benchmarks/gpu_campaign.sh`` runs them there (see benchmarks/campaign.py).
"""

from __future__ import annotations

import argparse
import io
import lzma
import shlex
import shutil
import subprocess
import tarfile

from common import DATA, ROOT

from zhie import encoders
from zhie.core.text import TextTokenizer
from zhie.tasks.base import CJK_CHARSET

FILES = ["ner/cluener/train.json", "ner/cluener/dev.json", "ner/cmeee/train.json", "ner/cmeee/dev.json",
         "ner/peoples_daily/example.dev", "cws/sxu/train.txt", "cws/sxu/test.txt", "re/cmeie/train.jsonl",
         "re/cmeie/dev.jsonl", "re/cmeie/schema.json", "sts/stsb/train.data", "sts/stsb/valid.data",
         "sts/atec/train.data", "sts/atec/valid.data"]


OUT = ROOT / ".devcarry"
WEIGHTS = OUT / "e5-small-pruned" / "model.safetensors"


def pack() -> None:
    out = OUT
    chars = set(CJK_CHARSET)
    for name in FILES:
        (out / "data" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DATA / name, out / "data" / name)
        chars |= set((DATA / name).read_text(encoding="utf-8"))
    model, tokenizer = encoders.load("e5-small")
    tt = TextTokenizer(tokenizer, "char")
    keep = {tt.char_id(c) for c in chars} - {None}
    for name in FILES:
        if name.startswith("sts/"):
            sentences = [s for line in (DATA / name).read_text(encoding="utf-8").splitlines()
                         for s in line.split("\t")[:2]]
            for prefix in ("", "query: "):
                keep.update(i for ids in tokenizer([prefix + s for s in sentences])["input_ids"] for i in ids)
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


def pack_campaign(prefix: str) -> None:
    """The campaign's ner.py rows left under ``prefix`` that share the first one's commit, and that commit's code."""
    from campaign import PLAN, RESULTS, gpu_rows

    rows = gpu_rows(PLAN, RESULTS, prefix)
    if not rows:
        raise SystemExit(f"error: no ner.py row of {PLAN.name} under {prefix!r} is left to run")
    commit = rows[0][1]
    same = [r for r in rows if r[1] == commit]
    (OUT / "rows.txt").write_text("".join(f"{key} {shlex.join(options)}\n" for key, _, options in same))
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


def unpack() -> None:
    with lzma.open(WEIGHTS.with_suffix(".safetensors.xz")) as src, WEIGHTS.open("wb") as dst:
        shutil.copyfileobj(src, dst)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--unpack", action="store_true", help="decompress the weights (on the GPU machine)")
    p.add_argument("--campaign", metavar="PREFIX", help="also the campaign's ner.py rows left under PREFIX")
    args = p.parse_args()
    if args.unpack:
        unpack()
    else:
        if args.campaign is None or not WEIGHTS.with_suffix(".safetensors.xz").exists():
            pack()
        if args.campaign is not None:
            pack_campaign(args.campaign)
