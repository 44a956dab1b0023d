"""Speed against accuracy, the way users run a model: ``zhie predict MODEL --input FILE --output FILE`` as a whole
process on this machine, for each model as it is (torch fp32) and as an export (onnxruntime fp32 and int8).

    python benchmarks/tradeoff.py --dataset cluener --model teacher=runs/cluener-gp/best \\
        --model student-4=runs/students/student/best --out runs/tradeoff

For every model and variant: the dev F1 (``zhie eval``), sentences/s and characters/s over the set's texts
(:func:`dataset`: CLUENER's 2,688 dev + test texts; best of ``--runs``, process start included), the cold start
(``zhie predict VARIANT TEXT``, one short text, best of ``--runs``), the peak resident memory of the predicting
process, and the size on disk. zhie's modules are compiled to bytecode first (:func:`common.compile_zhie`), as
the peers' are. The exports are made once in ``OUT/exports`` (int8: ``--per-channel --reduce-range``,
the accurate setting on CPUs without VNNI). Each row appends one JSON line to ``benchmarks/results/tradeoff.jsonl``
with the load average before and after.

``--peer NAME=PYTHON`` adds an offline peer, timed the same way (``PYTHON benchmarks/peer_predict.py NAME --input
FILE --output FILE``, PYTHON the interpreter of an environment where the peer is installed): a segmenter on SXU (its
word F1), a NER peer on a NER set, its F1 counting only the labels it shares with the dataset's (People's Daily: PER,
LOC and ORG) and left out when it shares none (CLUENER's ten finer types).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path
from types import SimpleNamespace

from common import DATA, append_result, compile_zhie, machine, machine_lock, run_measured
from ner import dataset_files
from peer_predict import PEERS
from roofline import encoder_flops, int8_matmul_peak, matmul_peak

from zhie.core.metrics import segmentation_prf, span_prf
from zhie.data import read_ner
from zhie.data.cws import read_segmented

DATASETS = ("cluener", "peoples_daily", "cmeee", "sxu")
EXPORTS = {"fp32": [], "int8": ["--quantize", "int8", "--per-channel", "--reduce-range"]}


def size_mb(directory: Path) -> float:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) / 2**20


def dataset(name: str, out: Path, every: bool = False) -> tuple[Path, list, list[str]]:
    """``(the file F1 is scored on, its examples, the texts timed: theirs first, then others)``, >= 2,300 sentences.
    CLUENER: dev, then test (2,688 texts; ``every``: then train too, 13,436); People's Daily: the dev part of
    ``benchmarks/ner.py``'s fixed 80/20 split of its file, then the training part (2,318 texts: the F1 never counts a
    text a model trained on); CMeEE: dev, then train (5,000 texts; 1,000 scored); SXU word segmentation: its test file
    (3,654 sentences). ``every`` with another set: an error (its timed texts are already all it has to offer)."""
    if every and name != "cluener":
        raise SystemExit(f"--all-texts: only CLUENER has more texts to time (its train set); not {name}")
    if name == "sxu":
        test = DATA / "cws" / "sxu" / "test.txt"
        gold = read_segmented(test)
        return test, gold, [ex.text for ex in gold]
    if name == "peoples_daily":
        train, dev = dataset_files(name, out)
        others = read_ner(train)
    else:
        dev = DATA / "ner" / name / "dev.json"
        others = read_ner(DATA / "ner" / name / ("test.json" if name == "cluener" else "train.json"))
    if name == "cluener" and every:
        others += read_ner(DATA / "ner" / name / "train.json")
    gold = read_ner(dev)
    return dev, gold, [ex.text for ex in gold + others]


def cut(model: Path, layers: int, out: Path) -> Path:
    """``model`` with only its first ``layers`` encoder layers, untrained since (its speed is a student's of that
    depth; its F1 is the cut's before any distillation), saved once in ``out``."""
    if not (out / "zhie.json").exists():
        import zhie
        from zhie import encoders

        pipe = zhie.load(model)
        encoders.select_layers(pipe.model.encoder, range(layers))
        pipe.task.save(pipe.model, out)
    return out


def variants(name: str, model: Path, out: Path, which: list[str]) -> list[tuple[str, Path]]:
    """``(variant, directory)`` of ``model``: ``torch`` itself, ``fp32``/``int8`` its exports (made once)."""
    found = []
    for variant in which:
        if variant == "torch":
            found.append((variant, model))
            continue
        target = out / "exports" / f"{name}-{variant}"
        if not (target / "export.json").exists():
            subprocess.run(["zhie", "export", str(model), "--out", str(target), *EXPORTS[variant]], check=True,
                           stdout=subprocess.DEVNULL)
        found.append((variant, target))
    return found


def peer_f1(gold: list, output: Path, key: str) -> float | None:
    """F1 of a peer's output (JSON lines whose first ``len(gold)`` are the dev texts): word F1 for a segmenter
    (``key`` "words"), else micro F1 on the labels it shares with ``gold`` (None when it shares none)."""
    with output.open(encoding="utf-8") as f:
        rows = [json.loads(line)[key] for line, _ in zip(f, gold)]
    if key == "words":
        pred = [[(w["start"], w["end"], "") for w in row] for row in rows]
        return segmentation_prf([ex.spans for ex in gold], pred, [[s.text for s in ex.spans] for ex in gold],
                                set())["f1"]
    shared = {s.label for ex in gold for s in ex.spans} & {e["label"] for row in rows for e in row}
    if not shared:
        return None
    pred = [[(e["start"], e["end"], e["label"]) for e in row if e["label"] in shared] for row in rows]
    return span_prf([[s for s in ex.spans if s.label in shared] for ex in gold], pred)["micro"]["f1"]


def record(args, name: str, variant: str, path: Path, texts: list[str], f1: float | None,
           runs: list[tuple[float, float]], cold: float, load: tuple, **extra) -> None:
    best = min(w for w, _ in runs)
    append_result("tradeoff", {
        "dataset": args.dataset, "model": name, "variant": variant, "path": str(path), **extra,
        "dev_f1": f1, "texts": len(texts), "characters": sum(map(len, texts)),
        "sentences_per_s": len(texts) / best, "characters_per_s": sum(map(len, texts)) / best,
        "walls_s": [round(w, 3) for w, _ in runs], "cold_start_s": round(cold, 3),
        "peak_rss_mb": round(max(m for _, m in runs)), "rss_measured": "own", "size_mb": round(size_mb(path), 1),
        "batch_size": args.batch_size, "load_before": load, "load_after": os.getloadavg(),
        "machine": machine(), "date": date.today().isoformat(), "command": "python " + " ".join(sys.argv)})
    f1_text = "–" if f1 is None else f"{f1:.4f}"
    print(f"{name} {variant}: F1 {f1_text}, {len(texts) / best:.0f} sentences/s, cold {cold:.2f} s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="cluener", choices=DATASETS)
    p.add_argument("--model", action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--cut", action="append", default=[], metavar="NAME=DIR:LAYERS",
                   help="also DIR's model cut to its first LAYERS layers, untrained (speed of that depth)")
    p.add_argument("--peer", action="append", default=[], metavar="NAME=PYTHON",
                   help="an offline peer of benchmarks/peer_predict.py, run by PYTHON (its environment's)")
    p.add_argument("--variants", default="torch,fp32,int8")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--all-texts", action="store_true",
                   help="CLUENER: time its train texts too (13,436 texts in all, not 2,688), so that a fast model's "
                        "process start counts over more sentences")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev, gold, texts = dataset(args.dataset, out, args.all_texts)
    compile_zhie()
    (out / "texts.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    peaks = {"fp32": matmul_peak("cpu"), "int8": int8_matmul_peak()}  # this CPU's, in this run
    peaks["torch"] = peaks["fp32"]
    models = [spec.partition("=")[::2] for spec in args.model]
    for spec in args.cut:
        name, _, rest = spec.partition("=")
        source, _, layers = rest.rpartition(":")
        models.append((name, str(cut(Path(source), int(layers), out / "cuts" / name))))
    for name, directory in models:
        for variant, path in variants(name, Path(directory), out, args.variants.split(",")):
            load = os.getloadavg()
            subprocess.run(["zhie", "eval", str(path), "--data", str(dev), "--json", str(out / "eval.json")],
                           check=True, stdout=subprocess.DEVNULL)
            scores = json.loads((out / "eval.json").read_text(encoding="utf-8"))
            f1 = scores["micro"]["f1"] if "micro" in scores else scores["f1"]  # NER's micro average; CWS's word F1
            predict = ["zhie", "predict", str(path), "--input", str(out / "texts.txt"), "--output",
                       str(out / "out.jsonl"), "--batch-size", str(args.batch_size)]
            runs = [run_measured(predict) for _ in range(args.runs)]
            cold = min(run_measured(["zhie", "predict", str(path), texts[0]])[0] for _ in range(args.runs))
            config_file = Path(path) / "config.json"  # the variant's: an export's encoder may be folded
            config = SimpleNamespace(**json.loads(config_file.read_text())) if config_file.exists() else None
            flops = (encoder_flops(config, [len(t) + 2 for t in texts])
                     if config is not None and getattr(config, "model_type", "") in ("bert", "xlm-roberta", "zhie_conv")
                     else None)
            record(args, name, variant, path, texts, f1, runs, cold, load,
                   layers=getattr(config, "num_hidden_layers", None),
                   encoder_share_of_peak=flops / min(w for w, _ in runs) / peaks[variant] if flops else None,
                   peak_gflops=round(peaks[variant] / 1e9, 1))
    script = str(Path(__file__).resolve().parent / "peer_predict.py")
    for spec in args.peer:
        name, _, python = spec.partition("=")
        load = os.getloadavg()
        predict = [python, script, name, "--input", str(out / "texts.txt"), "--output", str(out / "out.jsonl")]
        runs = [run_measured(predict) for _ in range(args.runs)]
        key, module, _ = PEERS[name]
        if (key == "words") != (args.dataset == "sxu"):
            raise SystemExit(f"--peer {name}: a {'segmenter' if key == 'words' else 'NER peer'} does not fit the "
                             f"{args.dataset} set")
        f1 = peer_f1(gold, out / "out.jsonl", key)
        (out / "one.txt").write_text(texts[0] + "\n", encoding="utf-8")
        one = [python, script, name, "--input", str(out / "one.txt"), "--output", str(out / "one.jsonl")]
        cold = min(run_measured(one)[0] for _ in range(args.runs))
        package = subprocess.run([python, "-c", f"import os, {module}; print(os.path.dirname({module}.__file__))"],
                                 check=True, capture_output=True, text=True).stdout.strip()
        record(args, name, "peer", Path(package), texts, f1, runs, cold, load, layers=None)

if __name__ == "__main__":
    with machine_lock():
        main()
