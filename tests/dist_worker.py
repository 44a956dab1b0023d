"""One process of a multi-process run for tests/test_dist.py, started by ``python -m torch.distributed.run``.

``ner TRAIN DEV ENCODER OUT BATCH_SIZE RESULTS`` trains NER with :func:`zhie.fit` and writes
``RESULTS/rank<r>.json``: fit's summary and the paths under ``OUT`` that this process changed (created, opened for
writing, renamed or deleted; seen by an audit hook).

``cosent RESULTS`` computes the CoSENT loss of :class:`SimilarityTask` on this rank's 16 of 32 sentence pairs whose
vectors come from a DDP-wrapped linear layer, and writes ``RESULTS/rank<r>.json``: the loss and the layer's
gradient once DDP has averaged it.

``multitask CONFIG OUT RESULTS`` trains the multi-task config ``CONFIG`` (sampled steps) with :func:`zhie.fit` for 6
steps and writes ``RESULTS/rank<r>.json``: fit's summary (this process's ``per_batch`` rows are in its history).

``distill RECOGNIZER EVALUATOR TARGET ENCODER OUT BATCH_SIZE RESULTS`` distils an MTMT student with
:func:`zhie.training.mtmt.distill` (64 word pairs, one epoch) and writes ``RESULTS/rank<r>.json``: the loop's
summary.

``resume OUT RESULTS`` trains a small model with dropout in ``OUT/full``, then in ``OUT/resumed`` until it is
interrupted in its third step, resumes that run, and writes ``RESULTS/rank<r>.json``: the largest difference between
the final weights of the two runs.

``evaluate OUT RESULTS`` trains the small model for one epoch, in a process group whose collectives time out after
10 s (long enough for the main process's writes), with an evaluation that takes 15 s and scores each process
differently; writes ``RESULTS/rank<r>.json``: how often this process evaluated, and the loop's summary.

``adversarial BATCH_SIZE OUT RESULTS`` trains a small model with an embedding table with FGM, then with PGD (2
global batches a step, :func:`embedding_model`) and writes ``RESULTS/rank<r>.json``: per method, the unit direction
each adversarial step started from, with one process also the unit gradient of the micro-batch's own clean loss
there, and the final weights.

``pretrain OUT ARGS... RESULTS`` runs ``zhie pretrain --out OUT ARGS`` (:func:`zhie.cli.main`) and writes
``RESULTS/rank<r>.json``: its exit code and the paths beside ``OUT`` that this process changed.
"""

import contextlib
import gc
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn

import zhie
from zhie.cli import main as zhie_main
from zhie.tasks.similarity import SimilarityConfig, SimilarityTask
from zhie.training import TrainConfig, train

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
    result = {"loss": loss.item(), "weight_grad": layer.weight.grad.tolist(), "bias_grad": layer.bias.grad.tolist()}
    del model, loss  # DDP's reducer must go before its process group (else gloo may abort at exit) ...
    gc.collect()  # ... and it sits in a reference cycle: without this, 3 exits in 20 aborted under load
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return result


class Interrupted(Exception):
    pass


def toy_data() -> tuple[nn.Module, dict]:
    """A small model with dropout and the training arguments of 64 random items."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, 32), nn.Dropout(0.5), nn.Linear(32, 1))
    data = torch.randn(64, DIM + 1, generator=torch.Generator().manual_seed(1))
    return model, {"train_items": list(range(64)),
                   "collate": lambda rows: {"x": data[rows, :DIM], "y": data[rows, DIM:]}}


def toy_run(out: Path, resume: bool, interrupt_at: int | None = None) -> dict[str, torch.Tensor]:
    """4 steps of 2 x 8 items, a checkpoint after each; raises Interrupted in the step ``interrupt_at``."""
    model, data = toy_data()
    steps = 0

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        nonlocal steps
        steps += 1
        if steps == interrupt_at:
            raise Interrupted
        return ((m(batch["x"]) - batch["y"]) ** 2).mean()

    train(model, **data, loss_fn=loss_fn,
          config=TrainConfig(epochs=1, batch_size=8, lr=1e-2,
                             head_lr=1e-2, seed=0, warmup=0.0, save_every=1), out_dir=out,
          resume=resume, progress=False)
    return model.state_dict()


def resume(out: str) -> dict:
    full = toy_run(Path(out, "full"), resume=False)
    with contextlib.suppress(Interrupted):
        toy_run(Path(out, "resumed"), resume=False, interrupt_at=3)
    resumed = toy_run(Path(out, "resumed"), resume=True)
    torch.distributed.destroy_process_group()
    return {"max_difference": max((full[k] - resumed[k]).abs().max().item() for k in full)}


def evaluate(out: str) -> dict:
    torch.distributed.init_process_group("gloo", timeout=timedelta(seconds=10))
    rank, calls = torch.distributed.get_rank(), []

    def slow_evaluation(m: nn.Module) -> dict:
        calls.append(rank)
        time.sleep(15)
        return {"f1": float(rank)}

    model, data = toy_data()
    summary = train(model, **data, loss_fn=lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(),
                    config=TrainConfig(epochs=1, batch_size=8, lr=1e-2, head_lr=1e-2, seed=0), out_dir=Path(out),
                    evaluate=slow_evaluation, resume=False, progress=False)
    torch.distributed.destroy_process_group()
    return {"evaluations": len(calls), "summary": summary}


class EmbeddingModel(nn.Module):
    """Token ids -> a score: an embedding table (what FGM/PGD perturb), tanh, a linear layer; no dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.out = nn.Embedding(20, DIM), nn.Linear(DIM, 1)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.embed(ids))).mean(1)


def embedding_model() -> tuple[nn.Module, dict]:
    """:class:`EmbeddingModel` and the training arguments of 32 items of 5 token ids and a target."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ids, y = torch.randint(0, 20, (32, 5), generator=g), torch.randn(32, 1, generator=g)
    return EmbeddingModel(), {"train_items": list(range(32)), "collate": lambda rows: {"ids": ids[rows], "y": y[rows]}}


def adversarial(batch_size: str, out: str) -> dict:
    from zhie.training import session  # the engine's steps call fgm_step / pgd_step from there

    single, result = int(os.environ["WORLD_SIZE"]) == 1, {}
    for method in ("fgm", "pgd"):
        model, data = embedding_model()
        directions, own = [], []
        step = getattr(session, f"{method}_step")

        def recording(weight, batch_grad, *args, step=step, directions=directions, own=own, **kwargs):
            directions.append((batch_grad / batch_grad.norm()).flatten().tolist())
            if single:  # the gradient of this micro-batch's clean loss, at the weights of its clean pass
                (g,) = torch.autograd.grad(args[0](), weight)  # FGM: the loss, PGD: the direction loss
                own.append((g / g.norm()).flatten().tolist())
            return step(weight, batch_grad, *args, **kwargs)

        setattr(session, f"{method}_step", recording)
        try:
            train(model, **data, loss_fn=lambda m, b: ((m(b["ids"]) - b["y"]) ** 2).mean(), out_dir=Path(out, method),
                  config=TrainConfig(epochs=1, batch_size=int(batch_size), grad_accum=2, lr=0.1, seed=0, warmup=0.0,
                                     adversarial=method, adv_epsilon=0.5, adv_alpha=0.3, adv_steps=2),
                  resume=False, progress=False)
        finally:
            setattr(session, f"{method}_step", step)
        result[method] = {"directions": directions, "own": own,
                          "weights": {k: v.flatten().tolist() for k, v in model.state_dict().items()}}
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return result


def record_writes(out: Path) -> list[str]:
    """The paths under ``out`` that this process changes from now on (created, opened for writing, renamed or
    deleted; seen by an audit hook), filled in as it goes."""
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
    return writes


def ner(train: str, dev: str, encoder: str, out: str, batch_size: str) -> dict:
    writes = record_writes(Path(out).resolve())
    summary = zhie.fit("ner", train, dev, out=out, encoder=encoder, head="gp", resume=False, progress=False,
                       config=TrainConfig(epochs=1, batch_size=int(batch_size), lr=1e-3,
                                          head_lr=1e-3, seed=0, warmup=0.0))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return {"summary": summary, "writes": writes}


def pretrain(out: str, *args: str) -> dict:
    writes = record_writes(Path(out).resolve().parent)  # out is replaced through a temporary directory beside it
    code = zhie_main(["pretrain", "--out", out, *args])
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return {"code": code, "writes": writes}


def multitask(config: str, out: str) -> dict:
    summary = zhie.fit("multitask", out=out, encoder="tiny", tasks_file=config, resume=False, progress=False,
                       config=TrainConfig(max_steps=6, batch_size=4, lr=1e-3, head_lr=1e-3, seed=0, warmup=0.0))
    torch.distributed.destroy_process_group()
    return {"summary": summary}


def distill(recognizer: str, evaluator: str, target: str, encoder: str, out: str, batch_size: str) -> dict:
    from zhie.training.mtmt import distill as mtmt

    summary = mtmt(recognizer, evaluator, target, out=out, format="wikiann", encoder=encoder, pairs=64, balanced=False,
                   config=TrainConfig(epochs=1, batch_size=int(batch_size), lr=1e-3, head_lr=1e-3, seed=0, warmup=0.0),
                   head_lr_ratio=1.0, resume=False, progress=False)
    torch.distributed.destroy_process_group()
    return {"summary": summary}


if __name__ == "__main__":
    mode, *args, results = sys.argv[1:]
    result = {"cosent": cosent, "resume": resume, "evaluate": evaluate, "ner": ner, "pretrain": pretrain,
              "multitask": multitask, "distill": distill, "adversarial": adversarial}[mode](*args)
    result |= {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}
    Path(results, f"rank{result['rank']}.json").write_text(json.dumps(result))
