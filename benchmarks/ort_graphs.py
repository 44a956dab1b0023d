"""Graph rewrites that zhie export does not use, measured against what it does (issue 25's speed targets).

    python benchmarks/ort_graphs.py --model runs/cluener-gp/best --dataset cluener --texts 400

From one model: zhie's fp32 exports at opsets 23 (the default) and 18, each also rewritten by onnxruntime's
transformer optimizer (``onnxruntime.transformers.optimizer.optimize_model(model_type="bert")``, the fusions of its
BERT recipe: attention, SkipLayerNormalization, BiasGelu), each of the four quantised by onnxruntime's dynamic
quantisation with zhie's int8 settings (per channel, 7-bit weights; one activation scale per run), and onnxruntime's
weight-only ``MatMulNBits`` (8 and 4 bits, blocks of 32, symmetric, ``accuracy_level=4``: int8 activations inside the
kernel) of the opset-23 graph; against them what ``zhie export --quantize int8 --per-channel --reduce-range`` writes
(``zhie-int8-23``: a scale per token) and the same with ``--batch-scales`` (``zhie-int8-23-batch-scales``). Every
variant predicts the same first ``--texts`` dev texts in one process, in turns (``--repeats`` rounds, the median),
batch 32, 2 threads; one JSON line per variant: sentences/s, the ratio to the opset-23 fp32 export, the fused
operators, and how many texts get the same entities (offsets and labels) as the fp32 export.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import onnx
from common import append_result, machine, machine_lock
from ner import dataset_files

from zhie.data import read_ner
from zhie.deploy.export import WEIGHT_OPS, export
from zhie.deploy.runtime import GRAPH_FILE, load_export

BERT_FUSIONS = ("Attention", "SkipLayerNormalization", "BiasGelu", "EmbedLayerNormalization", "FastGelu")


def ort_optimized(src: Path, dst: Path, heads: int, hidden: int) -> dict:
    """``src`` rewritten by onnxruntime's transformer optimizer into ``dst``; the fusions it reports."""
    from onnxruntime.transformers import optimizer

    graph = optimizer.optimize_model(str(src / GRAPH_FILE), model_type="bert", num_heads=heads, hidden_size=hidden,
                                     opt_level=0, use_gpu=False)
    fused = {k: v for k, v in graph.get_fused_operator_statistics().items() if v and k in BERT_FUSIONS}
    copy_export(src, dst)
    graph.save_model_to_file(str(dst / GRAPH_FILE))
    return fused


def int8(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    copy_export(src, dst)
    quantize_dynamic(str(src / GRAPH_FILE), str(dst / GRAPH_FILE), weight_type=QuantType.QInt8, per_channel=True,
                     reduce_range=True, op_types_to_quantize=list(WEIGHT_OPS))


def nbits(src: Path, dst: Path, bits: int) -> None:
    from onnxruntime.quantization import matmul_nbits_quantizer as mq

    config = mq.DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True, accuracy_level=4, bits=bits)
    quantizer = mq.MatMulNBitsQuantizer(onnx.load(str(src / GRAPH_FILE)), bits=bits, block_size=32,
                                        is_symmetric=True, accuracy_level=4, algo_config=config)
    quantizer.process()
    copy_export(src, dst)
    quantizer.model.save_model_to_file(str(dst / GRAPH_FILE), use_external_data_format=False)


def copy_export(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(GRAPH_FILE))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a NER model directory (torch)")
    p.add_argument("--dataset", default="cluener", choices=("cluener", "peoples_daily", "cmeee"))
    p.add_argument("--texts", type=int, default=400, help="the first N dev texts")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    with machine_lock(), tempfile.TemporaryDirectory(prefix="zhie-ort-graphs-") as tmp:
        run(args, Path(tmp))


def run(args, work: Path) -> None:
    _, dev_file = dataset_files(args.dataset, work / "data")
    texts = [ex.text for ex in read_ner(dev_file)][: args.texts]
    config = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
    fused: dict[str, dict] = {}
    for opset in (23, 18):
        fp32 = work / f"fp32-{opset}"
        export(args.model, fp32, opset=opset)
        fused[f"{fp32.name}-ort-optimizer"] = ort_optimized(fp32, work / f"{fp32.name}-ort-optimizer",
                                                            config["num_attention_heads"], config["hidden_size"])
        for name in (fp32.name, f"{fp32.name}-ort-optimizer"):
            int8(work / name, work / name.replace("fp32", "int8"))
    for bits in (8, 4):
        nbits(work / "fp32-23", work / f"nbits{bits}-23", bits)
    for name, batch_scales in (("zhie-int8-23", False), ("zhie-int8-23-batch-scales", True)):
        export(args.model, work / name, quantize="int8", per_channel=True, reduce_range=True, batch_scales=batch_scales)
    names = ["fp32-23", "fp32-23-ort-optimizer", "fp32-18", "fp32-18-ort-optimizer", "int8-23",
             "int8-23-ort-optimizer", "int8-18", "int8-18-ort-optimizer", "nbits8-23", "nbits4-23", "zhie-int8-23",
             "zhie-int8-23-batch-scales"]
    pipes = {}
    for name in names:
        task, model = load_export(work / name, threads=2)  # as zhie.load, with onnxruntime's threads set
        pipes[name] = task.pipeline_class(task, model, "cpu")
        pipes[name].predict(texts[:32], batch_size=32)  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in names}
    spans: dict[str, list] = {}
    for _ in range(args.repeats):  # in turns, so that the machine's drift is shared
        for name, pipe in pipes.items():
            start = time.perf_counter()
            rows = pipe.predict(texts, batch_size=32)
            seconds[name].append(time.perf_counter() - start)
            spans[name] = [[(s.start, s.end, s.label) for s in row] for row in rows]
    base = statistics.median(seconds["fp32-23"])
    for name in names:
        median = statistics.median(seconds[name])
        ops = collections.Counter(node.op_type for node in onnx.load(str(work / name / GRAPH_FILE)).graph.node)
        append_result("ort_graphs", {
            "dataset": args.dataset, "variant": name, "texts": len(texts),
            "sentences_per_s": round(len(texts) / median, 1), "x_fp32_23": round(base / median, 3),
            "fused": fused.get(name.replace("int8", "fp32"), {}), "ops": dict(ops.most_common(8)),
            "same_entities_as_fp32_23": sum(a == b for a, b in zip(spans[name], spans["fp32-23"])),
            "size_mb": round((work / name / GRAPH_FILE).stat().st_size / 2**20, 1), "model": str(args.model),
            "repeats": args.repeats, "load_avg": [round(x, 2) for x in os.getloadavg()], "machine": machine(),
            "date": str(date.today())})


if __name__ == "__main__":
    main()
