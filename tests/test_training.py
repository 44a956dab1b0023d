"""The training loop on a tiny model: parameter groups, schedule, batching, EMA, learning, logging, early
stopping, exact resume and atomic writes."""

import os
import random
import stat
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zhie.core.files import atomic_write_text, replace_dir
from zhie.training import (
    EMA,
    TrainConfig,
    atomic_torch_save,
    build_param_groups,
    build_scheduler,
    epoch_batches,
    load_checkpoint,
    train,
)
from zhie.training.report import read_metrics

VOCAB, DIM, TAGS = 12, 16, 3


# ---------------------------------------------------------------------------------------------------------------
# a tiny tagging task: tag = token id % 3, with a CRF-like transition matrix in the head
# ---------------------------------------------------------------------------------------------------------------
class Head(nn.Module):
    def __init__(self, dim: int, tags: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, tags)
        self.transitions = nn.Parameter(torch.zeros(tags, tags))

    def lr_multipliers(self) -> dict[str, float]:
        return {"transitions": 2.0}

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden)


class Toy(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        # the LayerNorm is named "2" here: found by its type, not its name
        self.encoder = nn.Sequential(OrderedDict(
            embed=nn.Embedding(VOCAB, DIM), proj=nn.Linear(DIM, DIM), **{"2": nn.LayerNorm(DIM)}))
        self.norm = nn.LayerNorm(DIM)
        self.dropout = nn.Dropout(dropout)
        self.head = Head(DIM, TAGS)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.norm(torch.tanh(self.encoder(input_ids)))))


def make_items(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(2, 11))] for _ in range(n)]


def collate(items: list[list[int]]) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids in items)
    input_ids = torch.zeros(len(items), width, dtype=torch.long)
    labels = torch.full((len(items), width), -100)
    for i, ids in enumerate(items):
        input_ids[i, :len(ids)] = torch.tensor(ids)
        labels[i, :len(ids)] = torch.tensor(ids) % TAGS
    return {"input_ids": input_ids, "attention_mask": (input_ids > 0).long(), "labels": labels}


def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    labels = batch["labels"]
    emissions = model(batch["input_ids"])
    ce = F.cross_entropy(emissions.flatten(0, 1), labels.flatten(), ignore_index=-100)
    pair = (labels[:, :-1] >= 0) & (labels[:, 1:] >= 0)
    log_t = model.head.transitions.log_softmax(-1)[labels[:, :-1].clamp(min=0), labels[:, 1:].clamp(min=0)]
    return ce - log_t[pair].mean()


TRAIN = make_items(64, seed=0)
DEV = make_items(32, seed=1)


def accuracy(model: nn.Module) -> dict[str, float]:
    batch = collate(DEV)
    pred = model(batch["input_ids"]).argmax(-1)
    gold = batch["labels"]
    acc = (pred == gold)[gold >= 0].float().mean().item()
    return {"f1": acc, "accuracy": acc}


def save_state(model: nn.Module, directory: Path) -> None:
    torch.save(model.state_dict(), directory / "model.pt")


def run(out_dir: Path, config: TrainConfig, *, dropout: float = 0.0, loss=loss_fn, **kwargs) -> tuple[Toy, dict]:
    torch.manual_seed(0)
    model = Toy(dropout)
    kwargs = {"evaluate": accuracy, "save_best": save_state, "lengths": [len(x) for x in TRAIN],
              "progress": False} | kwargs
    result = train(model, TRAIN, collate=collate, loss_fn=loss, config=config, out_dir=out_dir, **kwargs)
    return model, result


def untimed(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if k not in ("elapsed_s", "tokens_per_s")} for h in history]


# ---------------------------------------------------------------------------------------------------------------
# parameter groups and schedule
# ---------------------------------------------------------------------------------------------------------------
def test_param_groups_learning_rates_and_weight_decay():
    model = Toy()
    model.encoder.embed.weight.requires_grad_(False)  # frozen parameters are left out
    config = TrainConfig(lr=1e-4, head_lr=1e-3, weight_decay=0.01)
    groups = {g["name"]: g for g in build_param_groups(model, config)}
    names = {id(p): n for n, p in model.named_parameters()}
    members = {name: {names[id(p)] for p in g["params"]} for name, g in groups.items()}
    assert members == {
        "encoder": {"encoder.proj.weight"},
        "encoder_no_decay": {"encoder.proj.bias", "encoder.2.weight", "encoder.2.bias"},
        "head": {"head.proj.weight"},
        "head_no_decay": {"head.proj.bias", "norm.weight", "norm.bias"},
        "lr_x2": {"head.transitions"},
    }
    assert {n: g["lr"] for n, g in groups.items()} == pytest.approx(
        {"encoder": 1e-4, "encoder_no_decay": 1e-4, "head": 1e-3, "head_no_decay": 1e-3, "lr_x2": 2e-4})
    assert {n: g["weight_decay"] for n, g in groups.items()} == {
        "encoder": 0.01, "encoder_no_decay": 0.0, "head": 0.01, "head_no_decay": 0.0, "lr_x2": 0.0}

    # head_lr None -> lr; a model without an encoder attribute is all head
    groups = {g["name"]: g for g in build_param_groups(Toy(), TrainConfig(lr=3e-5, head_lr=3e-5))}
    assert groups["head"]["lr"] == groups["encoder"]["lr"] == 3e-5
    assert groups["lr_x2"]["lr"] == pytest.approx(6e-5)
    bare = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
    assert [g["name"] for g in build_param_groups(bare, TrainConfig(lr=1e-3))] == ["head", "head_no_decay"]


def linear_warmup_decay(step: int, warmup_steps: int, total_steps: int) -> float:
    """The schedule's factor by hand: linear 0 -> 1 over the warm-up, then 1 -> 0 at the last step."""
    return step / warmup_steps if step < warmup_steps else max(0.0, (total_steps - step) / (total_steps - warmup_steps))


def test_linear_warmup_then_decay():
    param = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=0.1)
    scheduler = build_scheduler(optimizer, total_steps=10, warmup=0.2)
    lrs = []
    for _ in range(10):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.0, 0.05, 0.1, 0.0875, 0.075, 0.0625, 0.05, 0.0375, 0.025, 0.0125])


# ---------------------------------------------------------------------------------------------------------------
# batching
# ---------------------------------------------------------------------------------------------------------------
def test_length_grouped_batches():
    rng = random.Random(0)
    lengths = [rng.randrange(1, 101) for _ in range(1003)]
    batches = epoch_batches(1003, 8, seed=1, epoch=0, lengths=lengths)
    assert sorted(i for b in batches for i in b) == list(range(1003))
    assert sorted(len(b) for b in batches) == [3] + [8] * 125
    assert batches == epoch_batches(1003, 8, seed=1, epoch=0, lengths=lengths)
    assert batches != epoch_batches(1003, 8, seed=1, epoch=1, lengths=lengths)
    assert batches != epoch_batches(1003, 8, seed=2, epoch=0, lengths=lengths)

    def spread(bs):
        return sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in bs) / len(bs)

    plain = epoch_batches(1003, 8, seed=1, epoch=0)
    assert sorted(i for b in plain for i in b) == list(range(1003))
    assert spread(batches) < 5 < 50 < spread(plain)
    # the batch order is shuffled too, not sorted by length within a chunk
    firsts = [lengths[b[0]] for b in batches[:50]]
    assert firsts != sorted(firsts)


# ---------------------------------------------------------------------------------------------------------------
# EMA
# ---------------------------------------------------------------------------------------------------------------
def test_ema_bias_correction():
    model = nn.Linear(3, 2)
    ema = EMA(model, decay=0.9)
    w1 = {n: p.detach().clone() for n, p in model.named_parameters()}
    ema.update(model)
    for name, value in ema.average().items():  # one update: the average is the weights themselves
        torch.testing.assert_close(value, w1[name], rtol=1e-6, atol=1e-7)

    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    expected = (0.9 * 0.1 * w1["weight"] + 0.1 * model.weight.detach()) / (1 - 0.9**2)
    torch.testing.assert_close(ema.average()["weight"], expected)

    # constant weights stay constant
    const = nn.Linear(3, 2)
    ema = EMA(const, decay=0.999)
    for _ in range(50):
        ema.update(const)
    for name, p in const.named_parameters():
        torch.testing.assert_close(ema.average()[name], p.detach(), rtol=1e-5, atol=1e-6)

    # swapping in and out restores the training weights bit for bit
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ema = EMA(model, 0.5)
    ema.update(model)
    with torch.no_grad():
        model.weight.mul_(3.0)
    trained = {n: p.detach().clone() for n, p in model.named_parameters()}
    with ema.applied(model):
        torch.testing.assert_close(model.weight.detach(), before["weight"])
    assert all(torch.equal(p, trained[n]) for n, p in model.named_parameters())


# ---------------------------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------------------------
def test_toy_model_learns_logs_and_saves_best(tmp_path):
    config = TrainConfig(epochs=5, batch_size=8, lr=2e-2, head_lr=5e-2, warmup=0.1)
    model, result = run(tmp_path, config)

    history = result["history"]
    assert len(history) == 5 and result["steps"] == 40
    losses = [h["train_loss"] for h in history]  # the transition term keeps it above ~log(3)
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 0.5, losses
    assert result["best"]["f1"] > 0.95 and result["best"]["f1"] == max(h["dev"]["f1"] for h in history)
    assert result["best_step"] in [h["step"] for h in history]

    lines = read_metrics(tmp_path / "metrics.jsonl")
    assert lines == history
    assert set(lines[0]) == {"kind", "epoch", "step", "train_loss", "lr", "tokens_per_s", "elapsed_s", "dev"}
    assert [h["epoch"] for h in lines] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert set(lines[0]["lr"]) == {"encoder", "encoder_no_decay", "head", "head_no_decay", "lr_x2"}
    assert lines[-1]["lr"]["encoder"] == 0.0 and lines[0]["lr"]["lr_x2"] == pytest.approx(
        2e-2 * 2.0 * linear_warmup_decay(8, 4, 40))  # the tagged transitions: lr x multiplier
    assert lines[0]["tokens_per_s"] > 0
    assert (tmp_path / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    best = torch.load(tmp_path / "best" / "model.pt", weights_only=True)
    reloaded = Toy()
    reloaded.load_state_dict(best)
    reloaded.eval()
    assert accuracy(reloaded)["f1"] == result["best"]["f1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "checkpoint.pt", "metrics.jsonl", "training.png"]


def test_without_evaluate_saves_final_model(tmp_path):
    calls = []
    config = TrainConfig(epochs=1, batch_size=16, lr=1e-2, head_lr=1e-2)
    model, result = run(tmp_path, config, evaluate=None, lengths=None,
                        save_best=lambda m, d: calls.append(d) or save_state(m, d))
    assert len(calls) == 1 and result["best"] == {} and result["best_step"] == result["steps"] == 4
    assert all(torch.equal(v, model.state_dict()[k])
               for k, v in torch.load(tmp_path / "best" / "model.pt", weights_only=True).items())
    assert read_metrics(tmp_path / "metrics.jsonl") == result["history"] and result["history"][0]["dev"] == {}


def test_early_stopping(tmp_path):
    config = TrainConfig(epochs=10, batch_size=8, lr=1e-2, head_lr=1e-2, eval_every=1, patience=2)
    _, result = run(tmp_path, config, evaluate=lambda model: {"f1": 0.5})
    assert result["steps"] == 3 and len(result["history"]) == 3 and result["best_step"] == 1
    # a finished run is not continued when called again
    _, again = run(tmp_path, config, evaluate=lambda model: {"f1": 0.5}, loss=None)
    assert again["steps"] == 3 and again["history"] == result["history"]


def test_interrupted_run_resumes_exactly(tmp_path):
    config = TrainConfig(epochs=3, batch_size=8, grad_accum=2, lr=1e-2, head_lr=3e-2, ema=0.9, save_every=3,
                         eval_every=5, warmup=0.2, log_every=4)  # the step record at 8 spans the checkpoint at 6
    model_a, result_a = run(tmp_path / "a", config, dropout=0.3)

    calls = 0

    def crashing_loss(model, batch):
        nonlocal calls
        calls += 1
        if calls == 15:  # in the 8th optimizer step, after the checkpoint at step 6 (mid second epoch)
            raise RuntimeError("interrupted")
        return loss_fn(model, batch)

    with pytest.raises(RuntimeError, match="interrupted"):
        run(tmp_path / "b", config, dropout=0.3, loss=crashing_loss)
    state = load_checkpoint(tmp_path / "b" / "checkpoint.pt")
    assert (state["progress"]["step"], state["data"]["epoch"], state["data"]["batch"]) == (6, 1, 4)

    model_b, result_b = run(tmp_path / "b", config, dropout=0.3)
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert result_b["steps"] == result_a["steps"] == 12 and result_b["best_step"] == result_a["best_step"]
    assert untimed(result_b["history"]) == untimed(result_a["history"])
    assert [h["step"] for h in result_a["history"]] == [5, 10, 12]
    assert result_b["best"] == result_a["best"]

    def lines(d):
        return untimed(read_metrics(tmp_path / d / "metrics.jsonl", kind=None))

    assert lines("b") == lines("a")
    assert [h["step"] for h in lines("a") if h["kind"] == "step"] == [4, 8, 12]
    assert untimed(result_b["step_records"]) == untimed(result_a["step_records"])
    best_a, best_b = (torch.load(tmp_path / d / "best" / "model.pt", weights_only=True) for d in "ab")
    assert all(torch.equal(best_a[k], best_b[k]) for k in best_a)
    assert not all(torch.equal(best_a[k], state_a[k]) for k in best_a)  # the best model holds EMA weights
    ema_a, ema_b = (load_checkpoint(tmp_path / d / "checkpoint.pt")["ema"] for d in "ab")
    assert ema_a["steps"] == ema_b["steps"] == 12
    assert all(torch.equal(ema_a["shadow"][k], ema_b["shadow"][k]) for k in ema_a["shadow"])

    with pytest.raises(ValueError, match="config.batch_size: 8 -> 4"):
        run(tmp_path / "b", TrainConfig(**{**config.__dict__, "batch_size": 4}))


# ---------------------------------------------------------------------------------------------------------------
# atomic writes
# ---------------------------------------------------------------------------------------------------------------
def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    atomic_torch_save({"step": 1, "w": torch.ones(3)}, path)
    real_save = torch.save

    def half_save(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", half_save)
    with pytest.raises(OSError, match="disk full"):
        atomic_torch_save({"step": 2, "w": torch.zeros(3)}, path)
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]

    # the same through the loop: the third checkpoint fails, the second one is intact
    saves = 0

    def failing_third(obj, f, *args, **kwargs):
        nonlocal saves
        saves += 1
        if saves == 3:
            half_save(obj, f)
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing_third)
    out = tmp_path / "run"
    with pytest.raises(OSError, match="disk full"):
        run(out, TrainConfig(epochs=1, batch_size=8, lr=1e-2,
                             head_lr=1e-2, save_every=1), evaluate=None, save_best=None)
    assert load_checkpoint(out / "checkpoint.pt")["progress"]["step"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "metrics.jsonl"]  # the step records


def test_best_dir_is_replaced_atomically(tmp_path):
    scores = iter([0.1, 0.2])

    def save_twice_fail(model, directory):
        (directory / "model.txt").write_text("partial")
        if (tmp_path / "best").exists():
            raise OSError("crash while saving")
        (directory / "model.txt").write_text("complete")

    with pytest.raises(OSError, match="crash while saving"):
        run(tmp_path, TrainConfig(epochs=2, batch_size=32, lr=1e-2,
                                  head_lr=1e-2), evaluate=lambda m: {"f1": next(scores)},
            save_best=save_twice_fail)
    assert (tmp_path / "best" / "model.txt").read_text() == "complete"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_what_lands_has_the_modes_of_a_plain_write(tmp_path, mask):
    """mkstemp/mkdtemp make the temporary names private and safetensors writes 0o600; what is renamed into place must
    not stay so (a model directory written by root would be unreadable to the user a service runs as)."""
    from safetensors.torch import save_file

    def write(directory: Path) -> None:
        (directory / "sub").mkdir()
        save_file({"w": torch.zeros(2)}, str(directory / "sub" / "model.safetensors"))
        (directory / "run.sh").write_text("")
        (directory / "run.sh").chmod(0o700)

    old = os.umask(mask)
    try:
        atomic_write_text(tmp_path / "metrics.json", "{}")
        replace_dir(tmp_path / "best", write)
    finally:
        os.umask(old)
    mode = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*")}
    assert mode == {"metrics.json": 0o666 & ~mask, "best": 0o777 & ~mask, "best/sub": 0o777 & ~mask,
                    "best/sub/model.safetensors": 0o666 & ~mask, "best/run.sh": 0o777 & ~mask}


def test_config_is_validated():
    with pytest.raises(ValueError, match="warmup"):
        TrainConfig(warmup=10)
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match="grad_accum"):
        TrainConfig(grad_accum=0)
