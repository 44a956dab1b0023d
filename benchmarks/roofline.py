"""Roofline figures: encoder FLOPs counted from a config, the device's measured matmul peak, and the ratio.

FLOPs count multiply-adds as 2 and only the matmuls (projections, feed-forward, attention); embeddings, layer norms,
activations, softmax and the heads are left out (a few % for these encoders). For one sequence of ``n`` real tokens
(padding is not counted: it is wasted work, not achieved work), per layer, forward:

* BERT / RoBERTa / XLM-R / RoFormer(V2) (hidden ``d``, feed-forward ``f``):
  ``n * (8 d^2 + 4 d f) + 4 n^2 d``  (Q, K, V, O projections; two FFN matmuls; ``QK^T`` and ``AV``)
* GAU-α (hidden ``d``, expansion ``e``, key size ``s``, quadratic attention):
  ``n * (2 d (2e + s) + 2 e d) + 2 n^2 (s + e)``  (U, V, Z in one projection; O; ``QK^T``; ``AV``)
* zhie's convolutional encoder (width ``d``, kernel ``k``): ``2 n k d^2`` per block (one ``k d -> d`` product per
  token), plus the embeddings' projection ``2 n e d`` (embedding width ``e``) counted once

Training is counted as 3 x forward (the backward pass computes two matmuls per forward one).

The peak is measured, never taken from a datasheet: the best of a few ``size x size`` matmuls in the dtype used,
on the device used, with the thread count of the run (:func:`matmul_peak`).

    python benchmarks/roofline.py [--device cuda]   # the device's peaks and e5-small's FLOPs per token
"""

from __future__ import annotations

import time

import torch

TRAINING_FACTOR = 3  # forward + backward matmuls, relative to the forward's


def layer_flops(config, n: int) -> float:
    """Forward FLOPs of one encoder layer over one sequence of ``n`` tokens (module docstring)."""
    d = config.hidden_size
    if getattr(config, "model_type", "") == "zhie_conv":
        return 2 * n * config.kernel_size * d * d
    if getattr(config, "model_type", "") == "gau_alpha":
        e, s = config.intermediate_size, config.attention_key_size
        return n * (2 * d * (2 * e + s) + 2 * e * d) + 2 * n * n * (s + e)
    f = config.intermediate_size
    return n * (8 * d * d + 4 * d * f) + 4 * n * n * d


def encoder_flops(config, lengths: list[int]) -> float:
    """Forward FLOPs of the encoder over sequences of the given real lengths (special tokens included); a
    convolutional encoder's embedding projection counts unless it is folded into the table (an export's)."""
    projected = getattr(config, "model_type", "") == "zhie_conv" and not getattr(config, "folded_embeddings", False)
    projection = 2 * config.embedding_size * config.hidden_size * sum(lengths) if projected else 0
    return projection + config.num_hidden_layers * sum(layer_flops(config, n) for n in lengths)


def matmul_peak(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, size: int | None = None,
                repeats: int = 3, clock=None) -> float:
    """FLOP/s of the best of ``repeats`` ``size x size`` matmuls (``2 size^3`` FLOPs each) after one warm-up.

    ``size`` defaults to 2048 on the CPU (a fraction of a second per matmul on 2 cores) and 8192 on a GPU;
    ``clock`` (seconds, default wall time, synchronised on a GPU) should be the one the throughput is measured by.
    """
    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 2048)
    clock = clock or (lambda: wall_clock(device))
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        start = clock()
        a @ b
        best = min(best, clock() - start)
    return 2 * size**3 / best


def int8_matmul_peak(size: int = 2048, repeats: int = 3) -> float:
    """Integer multiply-adds x 2 per second of onnxruntime's ``MatMulInteger`` (uint8 activations x int8 weights, int32
    sums: what a dynamically quantised export runs) on ``size x size`` matrices, best of ``repeats`` after a warm-up,
    with onnxruntime's default threads (as ``zhie predict`` runs an export)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "int8_peak",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [size, size]),
         helper.make_tensor_value_info("b", TensorProto.INT8, [size, size])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [size, size])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {"a": rng.integers(0, 255, (size, size), dtype=np.uint8),
            "b": rng.integers(-127, 127, (size, size), dtype=np.int8)}
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        session.run(None, feed)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def wall_clock(device: torch.device) -> float:
    """``time.perf_counter()`` after the device's queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def window_tokens(task, texts: list[str]) -> list[int]:
    """Real tokens of every window a zhie windowed task runs over ``texts`` (content + [CLS] + [SEP])."""
    from zhie.core.text import windows

    size, overlap = task.window
    return [e - s + 2 for t in texts for s, e in windows(len(task.text_tokenizer(t)), size, overlap)]


def flops_per_token(config, lengths: list[int], training: bool = False) -> float:
    """Encoder FLOPs per real token over sequences of these lengths; training counts ``TRAINING_FACTOR`` x forward."""
    return encoder_flops(config, lengths) * (TRAINING_FACTOR if training else 1) / sum(lengths)


def roofline(per_token: float, tokens_per_s: float, peak_flops: float) -> dict:
    """JSON fields: FLOPs per token, achieved FLOP/s at ``tokens_per_s`` and its share of ``peak_flops``."""
    achieved = per_token * tokens_per_s
    return {"flops_per_token": per_token, "achieved_tflops": achieved / 1e12, "peak_tflops": peak_flops / 1e12,
            "share_of_peak": achieved / peak_flops}


def main() -> None:
    import argparse
    import sys
    from datetime import date

    from common import append_result, machine

    from zhie import encoders

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--encoder", default="e5-small")
    p.add_argument("--length", type=int, default=50, help="tokens per sequence for the FLOPs per token")
    args = p.parse_args()
    config = encoders.load(args.encoder)[0].config
    dtypes = [torch.float32] + ([torch.bfloat16] if args.device.startswith("cuda") else [])
    append_result("roofline", {
        "encoder": args.encoder, "length": args.length,
        "forward_flops_per_token": flops_per_token(config, [args.length]),
        **{f"peak_{str(d).split('.')[-1]}_tflops": matmul_peak(args.device, d) / 1e12 for d in dtypes},
        "clock": "wall", "machine": machine(), "date": date.today().isoformat(),
        "command": "python " + " ".join(sys.argv)})


if __name__ == "__main__":
    from common import machine_lock

    with machine_lock():
        main()
