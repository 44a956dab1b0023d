"""Encoder speed and memory (issue 11 item 7): forward+backward time and peak memory of BERT (HF, SDPA attention),
RoFormerV2 (zhie, SDPA), GAU-α (zhie, quadratic softmax_plus) and GAU-α in FLASH mode, at about the same parameter
count (two GAU layers per BERT layer: 2 x 3eH + 2sH = 12H^2 + 256H with e = 2H, s = 128), over sequence lengths.

Every measurement runs in its own process (``--one``). On CPU the process uses one thread and the time is its CPU
time (``time.process_time``), so that other processes on a shared machine do not inflate it; on CUDA it is wall time
after synchronising. Memory: ``saved_mb`` is what the forward pass keeps for the
backward (every tensor autograd saves, each storage counted once): deterministic, on any device, and what grows with
the length; on CUDA also ``peak_mb`` = ``max_memory_allocated`` of one step.

    python benchmarks/encoders.py --hidden 256 --layers 4 --tokens 8192 --lengths 128 512 1024 2048   # CPU
    python benchmarks/encoders.py --hidden 768 --layers 12 --tokens 65536 --lengths 128 512 1024 2048 4096
    python benchmarks/encoders.py ... --flash-lengths 2048 8192 16384    # GAU quadratic against FLASH (chunk 256)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import date

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from common import append_result, machine, machine_lock  # noqa: E402


def build(family: str, hidden: int, layers: int, length: int):
    from transformers import BertConfig, BertModel

    from zhie.encoders.gau import GAUAlphaConfig, GAUAlphaModel, RoFormerV2Config, RoFormerV2Model

    heads = max(1, hidden // 64)
    common = dict(vocab_size=8000, hidden_size=hidden, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    if family == "bert":
        return BertModel(BertConfig(num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * hidden,
                                    max_position_embeddings=max(512, length), attn_implementation="sdpa", **common),
                         add_pooling_layer=False)
    if family == "roformer-v2":
        return RoFormerV2Model(RoFormerV2Config(num_hidden_layers=layers, num_attention_heads=heads,
                                                intermediate_size=4 * hidden, **common))
    flash = family == "flash"
    return GAUAlphaModel(GAUAlphaConfig(num_hidden_layers=2 * layers, intermediate_size=2 * hidden,
                                        attention_key_size=128, attention="flash" if flash else "quadratic",
                                        normalization="squared_relu" if flash else "softmax_plus", **common))


def measure(family: str, hidden: int, layers: int, length: int, batch: int, repeats: int) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    clock = time.perf_counter if device == "cuda" else time.process_time
    if device == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build(family, hidden, layers, length).to(device).train()
    ids = torch.randint(5, 8000, (batch, length), device=device)
    mask = torch.ones_like(ids)
    params = sum(p.numel() for p in model.parameters())

    def step():
        model(input_ids=ids, attention_mask=mask).last_hidden_state.float().square().mean().backward()
        model.zero_grad(set_to_none=True)

    saved = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        step()  # also the warm-up (allocator, kernels)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = clock()
    for _ in range(repeats):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = (clock() - start) / repeats
    row = {"family": family, "params_m": round(params / 1e6, 2), "length": length, "batch": batch,
           "ms_per_step": round(1000 * seconds, 1), "tokens_per_s": round(batch * length / seconds),
           "saved_mb": round(sum(saved.values()) / 2**20, 1)}
    if device == "cuda":
        row["peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4, help="BERT/RoFormerV2 layers (GAU-α gets twice as many)")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per batch: batch = tokens // length")
    parser.add_argument("--lengths", type=int, nargs="*", default=[128, 512, 1024, 2048])
    parser.add_argument("--flash-lengths", type=int, nargs="*", default=[],
                        help="lengths at which GAU quadratic and FLASH are compared (batch 1)")
    parser.add_argument("--families", nargs="*", default=["bert", "roformer-v2", "gau-alpha", "flash"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # JSON of one measurement, run in a child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(**json.loads(args.one))))
        return
    jobs = [dict(family=f, hidden=args.hidden, layers=args.layers, length=n, batch=max(1, args.tokens // n),
                 repeats=args.repeats) for n in args.lengths for f in args.families]
    jobs += [dict(family=f, hidden=args.hidden, layers=args.layers, length=n, batch=1, repeats=args.repeats)
             for n in args.flash_lengths for f in ("gau-alpha", "flash")]
    for job in jobs:
        run = subprocess.run([sys.executable, __file__, "--one", json.dumps(job)], capture_output=True, text=True)
        if run.returncode != 0:
            row = {**job, "error": (run.stderr.strip().splitlines() or ["?"])[-1]}
        else:
            row = json.loads(run.stdout.strip().splitlines()[-1])
        append_result("encoders", {**row, "hidden": args.hidden, "bert_layers": args.layers,
                                   "threads": 1 if not torch.cuda.is_available() else None,
                                   "clock": "wall" if torch.cuda.is_available() else "process CPU time",
                                   "machine": machine().split(",")[0],
                                   "date": date.today().isoformat()})


if __name__ == "__main__":
    with machine_lock():
        main()
