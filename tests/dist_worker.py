"""One process of a multi-process run for tests/test_dist.py, started by ``python -m torch.distributed.run``.

``ner TRAIN DEV ENCODER OUT BATCH_SIZE RESULTS`` trains NER with :func:`zhie.fit` and writes
``RESULTS/rank<r>.json``: fit's summary and the paths under ``OUT`` that this process changed (created, opened for
writing, renamed or deleted; seen by an audit hook).

``cosent RESULTS`` computes the CoSENT loss of :class:`SimilarityTask` on this rank's 16 of 32 sentence pairs whose
vectors come from a DDP-wrapped linear layer, and writes ``RESULTS/rank<r>.json``: the loss and the layer's
gradient once DDP has averaged it.
"""

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

import zhie
from zhie.tasks.similarity import SimilarityConfig, SimilarityTask
from zhie.training import TrainConfig

PAIRS, DIM = 32, 8
# Audit events that change files, and how many of their first arguments are paths (os.rename: source, target).
CHANGES = {"os.mkdir": 1, "os.rename": 2, "os.remove": 1, "os.rmdir": 1, "shutil.rmtree": 1}


def cosent_inputs() -> tuple[nn.Linear, torch.Tensor, torch.Tensor]:
    """A linear layer, the inputs of its ``2 x PAIRS`` sentence vectors (pairs interleaved) and the pairs'
    labels: the same in every process, and in test_dist.py's single-process reference."""
    torch.manual_seed(0)
    return nn.Linear(DIM, DIM), torch.randn(2 * PAIRS, DIM), torch.randint(0, 6, (PAIRS,)).float()


def cosent() -> dict:
    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    layer, inputs, labels = cosent_inputs()
    n = PAIRS // world
    model = nn.parallel.DistributedDataParallel(layer)
    task = SimilarityTask(SimilarityConfig(loss="cosent"), tokenizer=None)
    loss = task.head_loss(None, model(inputs[2 * n * rank:2 * n * (rank + 1)]),
                          {"labels": labels[n * rank:n * (rank + 1)]})
    loss.backward()
    torch.distributed.destroy_process_group()
    return {"loss": loss.item(), "weight_grad": layer.weight.grad.tolist(), "bias_grad": layer.bias.grad.tolist()}


def ner(train: str, dev: str, encoder: str, out: str, batch_size: str) -> dict:
    out = Path(out).resolve()
    writes = []

    def audit(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writing = mode and set(mode) & set("wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            paths = [path] if writing else []
        else:
            paths = args[:CHANGES.get(event, 0)]
        writes.extend(os.path.relpath(path, out) for path in paths
                      if isinstance(path, (str, os.PathLike)) and Path(os.path.abspath(path)).is_relative_to(out))

    sys.addaudithook(audit)
    summary = zhie.fit("ner", train, dev, out=out, encoder=encoder, head="gp", resume=False, progress=False,
                       config=TrainConfig(epochs=1, batch_size=int(batch_size), lr=1e-3, seed=0, warmup=0.0))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return {"summary": summary, "writes": writes}


if __name__ == "__main__":
    mode, *args, results = sys.argv[1:]
    result = cosent() if mode == "cosent" else ner(*args)
    result |= {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}
    Path(results, f"rank{result['rank']}.json").write_text(json.dumps(result))
