"""Training options (issue 17, item 2): FGM/PGD on the embeddings, layer-wise lr decay, R-Drop, EMA in evaluation and
saving, and their CLI flags."""

import copy
import dataclasses

import pytest
import torch
from torch import nn

from zhie import encoders
from zhie.cli import build_parser
from zhie.heads import CrfTagger, GlobalPointer, SoftmaxTagger
from zhie.heads.tagger import IGNORE
from zhie.model import Model
from zhie.training import (
    EMA,
    RDropLoss,
    TrainConfig,
    build_param_groups,
    embedding_weight,
    fgm_step,
    pgd_step,
    symmetric_kl,
    train,
)
from zhie.training.config import config_from_flags

TEXTS = ["北京大学位于海淀区。", "张三在上海工作。", "李四去了南京市。", "王五毕业于复旦大学。"]


def tiny_model(head: nn.Module | None = None, seed: int = 0) -> Model:
    encoder, _ = encoders.tiny(TEXTS, seed=seed, hidden_size=32, layers=2, heads=2)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Model(encoder, {"ner": head or SoftmaxTagger(32, 5, dropout=0.1)})


def batch(seed: int = 0, n: int = 4, length: int = 9) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 30, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[0, -2:] = 0
    labels = torch.randint(0, 5, (n, length), generator=g)
    labels[:, 0] = IGNORE
    labels[mask == 0] = IGNORE
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def tag_loss(model: Model, b: dict) -> torch.Tensor:
    emissions = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])["ner"]
    return model.heads["ner"].loss(emissions, b["labels"])


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------------- FGM / PGD
@pytest.mark.parametrize("method", ["fgm", "pgd"])
def test_adversarial_perturbs_only_the_embeddings_and_restores_them_exactly(method):
    model = tiny_model()
    model.eval()  # no dropout: the passes differ only by the perturbation
    b = batch()
    weight = embedding_weight(model)
    assert weight is model.encoder.embeddings.word_embeddings.weight
    before = state(model)
    tag_loss(model, b).backward()
    clean_grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    seen = []

    def adversarial_loss():
        now = state(model)
        changed = [k for k in before if not torch.equal(before[k], now[k])]
        seen.append((changed, (now["encoder.embeddings.word_embeddings.weight"]
                               - before["encoder.embeddings.word_embeddings.weight"])))
        return tag_loss(model, b)

    if method == "fgm":
        fgm_step(weight, weight.grad.clone(), adversarial_loss, lambda loss: loss.backward(), epsilon=0.5)
    else:
        pgd_step(weight, weight.grad.clone(), adversarial_loss, adversarial_loss, lambda loss: loss.backward(),
                 epsilon=0.5, alpha=0.3, steps=3)
    assert len(seen) == (1 if method == "fgm" else 3)
    for changed, r in seen:
        assert changed == ["encoder.embeddings.word_embeddings.weight"]
        used = torch.zeros(weight.shape[0], dtype=torch.bool)
        used[b["input_ids"].flatten()] = True
        assert r[~used].abs().max() == 0  # rows of tokens absent from the batch have no gradient: not moved
        norm = r.norm().item()
        assert norm == pytest.approx(0.5, rel=1e-4) if method == "fgm" else norm <= 0.5 + 1e-5
    if method == "pgd":
        assert seen[0][1].norm().item() == pytest.approx(0.3, rel=1e-4)  # one step of alpha, then projected
        assert seen[-1][1].norm().item() == pytest.approx(0.5, rel=1e-4)
    after = state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)  # bit for bit

    # the gradient is the clean one plus the gradient at the (last) perturbation
    perturbed = copy.deepcopy(model)
    with torch.no_grad():
        embedding_weight(perturbed).add_(seen[-1][1])
    perturbed.zero_grad()
    tag_loss(perturbed, b).backward()
    adv_grads = dict(perturbed.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, clean_grads[name] + adv_grads[name].grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["fgm", "pgd"])
def test_training_loop_with_adversarial_changes_nothing_at_lr_zero(method, tmp_path):
    """With lr 0 the weights after training are the initial ones bit for bit: every perturbation was undone."""
    model = tiny_model()
    items = [batch(seed=i, n=1) for i in range(6)]
    before = state(model)
    config = TrainConfig(epochs=1, batch_size=2, grad_accum=2, lr=0.0, head_lr=0.0, warmup=0.0, adversarial=method,
                         adv_epsilon=0.7)
    losses = []

    def loss_fn(m, b):
        loss = tag_loss(m, b)
        losses.append(loss.item())
        return loss

    collate = lambda rows: {k: torch.cat([r[k] for r in rows]) for k in rows[0]}  # noqa: E731
    train(model, items, collate=collate, loss_fn=loss_fn, config=config, out_dir=tmp_path, progress=False)
    after = state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert len(losses) == 3 * (2 if method == "fgm" else 1 + config.adv_steps)  # clean + adversarial passes


def test_embedding_weight_needs_an_encoder():
    with pytest.raises(ValueError, match="get_input_embeddings"):
        embedding_weight(nn.Linear(2, 2))


# ---------------------------------------------------------------------------------------------------- LLRD
def _lr_of(model: nn.Module, config: TrainConfig) -> dict[str, float]:
    groups = build_param_groups(model, config)
    by_id = {id(p): g["lr"] for g in groups for p in g["params"]}
    return {name: by_id[id(p)] for name, p in model.named_parameters()}


@pytest.mark.parametrize("name, layers", [
    ("tiny", 2),
    ("new:gau-alpha:layers=3,hidden=32,intermediate=64,key_size=16", 3),
    ("new:roformer-v2:layers=4,hidden=32,intermediate=64,heads=2", 4),
])
def test_llrd_gives_layer_l_lr_times_decay_to_the_L_minus_l(name, layers):
    encoder, _ = encoders.load(name, texts=TEXTS)
    model = Model(encoder, {"ner": CrfTagger(encoder.config.hidden_size, ["O", "B-X", "I-X"], lr_multiplier=100.0)})
    lr, head_lr, decay = 1e-3, 5e-3, 0.5
    lrs = _lr_of(model, TrainConfig(lr=lr, head_lr=head_lr, llrd=decay))
    seen_layers = set()
    for pname, value in lrs.items():
        if pname.startswith("encoder."):
            if ".layer." in pname:
                layer = int(pname.split(".layer.")[1].split(".")[0]) + 1  # 1-based
                seen_layers.add(layer)
                assert value == pytest.approx(lr * decay ** (layers - layer)), pname
            else:
                assert "embeddings" in pname, pname
                assert value == pytest.approx(lr * decay ** layers), pname  # the lowest
        elif ".crf." in pname:  # the CRF transitions: lr times their multiplier
            assert value == pytest.approx(lr * 100.0)
        else:
            assert value == pytest.approx(head_lr), pname
    assert seen_layers == set(range(1, layers + 1))
    assert min(lrs.values()) == pytest.approx(lr * decay ** layers)
    # without llrd every encoder parameter learns at lr
    plain = _lr_of(model, TrainConfig(lr=lr, head_lr=head_lr))
    assert {v for k, v in plain.items() if k.startswith("encoder.")} == {lr}


def test_llrd_keeps_weight_decay_apart_and_names_groups():
    model = tiny_model()
    groups = build_param_groups(model, TrainConfig(lr=1e-3, head_lr=1e-3, llrd=0.8, weight_decay=0.01))
    names = [g["name"] for g in groups]
    assert names[:2] == ["encoder_L0", "encoder_L0_no_decay"]
    assert {"encoder_L2", "encoder_L2_no_decay", "head", "head_no_decay"} <= set(names)
    for g in groups:
        assert g["weight_decay"] == (0.0 if g["name"].endswith("no_decay") else 0.01)
    with pytest.raises(ValueError, match="llrd"):
        TrainConfig(llrd=1.5)


# ---------------------------------------------------------------------------------------------------- R-Drop
class _TagTask:
    name, head_name = "ner", "ner"

    def head_loss(self, head, output, b):
        return head.loss(output, b["labels"])


def test_rdrop_loss_equals_its_formula():
    model = tiny_model()
    model.train()
    b = batch()
    alpha = 4.0
    torch.manual_seed(1)
    loss = RDropLoss(_TagTask(), alpha, model.heads["ner"])(model, b)
    torch.manual_seed(1)  # the same dropout masks
    both = model(input_ids=torch.cat([b["input_ids"]] * 2), attention_mask=torch.cat([b["attention_mask"]] * 2))["ner"]
    e1, e2 = both.chunk(2)
    assert not torch.allclose(e1, e2)  # dropout made the two passes differ
    head = model.heads["ner"]
    keep = b["labels"] != IGNORE
    p1, p2 = e1.softmax(-1)[keep], e2.softmax(-1)[keep]
    kl12 = (p1 * (p1.log() - p2.log())).sum(-1).mean()
    kl21 = (p2 * (p2.log() - p1.log())).sum(-1).mean()
    expected = (head.loss(e1, b["labels"]) + head.loss(e2, b["labels"])) / 2 + alpha * (kl12 + kl21) / 2
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    # without dropout both passes agree: R-Drop is the plain loss
    model.eval()
    torch.testing.assert_close(RDropLoss(_TagTask(), alpha, head)(model, b), tag_loss(model, b))
    assert symmetric_kl(e1, e1, keep).item() == 0.0


def test_rdrop_refuses_span_heads_clearly(tmp_path):
    with pytest.raises(ValueError, match="GlobalPointer-style heads"):
        RDropLoss(_TagTask(), 1.0, GlobalPointer(32, 2, 8))
    with pytest.raises(ValueError, match="RDropLoss"):
        train(tiny_model(), [batch()], collate=lambda rows: rows[0], loss_fn=tag_loss, config=TrainConfig(rdrop=1.0),
              out_dir=tmp_path, progress=False)


# ---------------------------------------------------------------------------------------------------- EMA
def test_ema_weights_are_evaluated_and_saved(tmp_path):
    """The weights evaluated and saved are the average of the training weights; after train() returns the model holds
    the last training weights: those of the same run without EMA (which never feeds back into training)."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    without_ema = copy.deepcopy(model)
    items = [(torch.randn(3), torch.randn(1)) for _ in range(8)]
    at_loss, evaluated, saved = [], [], []

    def loss_fn(m, b):
        at_loss.append(state(m))  # the weights each step starts from
        return ((m(b["x"]) - b["y"]) ** 2).mean()

    def evaluate(m):
        evaluated.append(state(m))
        return {"f1": float(len(evaluated))}  # always better: every evaluation is saved

    def save_best(m, directory):
        saved.append(state(m))

    collate = lambda rows: {"x": torch.stack([r[0] for r in rows]), "y": torch.stack([r[1] for r in rows])}  # noqa: E731
    config = TrainConfig(epochs=2, batch_size=4, lr=0.1, head_lr=0.1, warmup=0.0, ema=0.5)
    train(model, items, collate=collate, loss_fn=loss_fn, config=config, out_dir=tmp_path / "ema", evaluate=evaluate,
          save_best=save_best, progress=False)
    final = state(model)
    train(without_ema, items, collate=collate, loss_fn=lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(),
          config=dataclasses.replace(config, ema=None), out_dir=tmp_path / "plain", progress=False)
    assert all(torch.equal(final[k], v) for k, v in state(without_ema).items())  # the training weights came back
    weights = at_loss[1:] + [final]  # the weights after each optimizer step (4 steps)
    ema = EMA(nn.Linear(3, 1), 0.5)
    for name in ema.shadow:
        ema.shadow[name] = sum(0.5 ** (len(weights) - 1 - t) * 0.5 * w[name] for t, w in enumerate(weights))
    ema.steps = len(weights)
    average = ema.average()
    assert len(evaluated) == len(saved) == 2
    for ev, sv in zip(evaluated, saved):
        assert all(torch.equal(ev[k], sv[k]) for k in ev)  # the weights evaluated are the weights saved
    for k in average:
        torch.testing.assert_close(evaluated[-1][k], average[k])
        assert not torch.equal(evaluated[-1][k], final[k])  # ... and they are not the training weights


# ---------------------------------------------------------------------------------------------------- CLI
def test_cli_flags_reach_the_train_config():
    args = build_parser().parse_args(
        ["train", "ner", "--train", "a", "--dev", "b", "--out", "o", "--adversarial", "pgd", "--adv-epsilon", "0.5",
         "--adv-alpha", "0.1", "--adv-steps", "2", "--rdrop", "4", "--llrd", "0.9", "--ema", "0.999"])
    config = config_from_flags(args)
    assert (config.adversarial, config.adv_epsilon, config.adv_alpha, config.adv_steps) == ("pgd", 0.5, 0.1, 2)
    assert (config.rdrop, config.llrd, config.ema) == (4.0, 0.9, 0.999)
    with pytest.raises(ValueError, match="adversarial"):
        TrainConfig(adversarial="awp")


def test_adamw_is_torchs_fused_kernel_and_updates_as_its_reference_loop():
    """The optimizer of ``optimizer="adamw"`` is torch's fused AdamW on the CPU (several times faster a step than
    its default loop) and gives the same weights as ``torch.optim.AdamW``'s loop, to float rounding."""
    from zhie.training.optim import build_optimizer

    torch.manual_seed(0)
    weights = [torch.randn(300, 16), torch.randn(16)]
    grads = [[torch.randn_like(w) for w in weights] for _ in range(5)]
    ours = [nn.Parameter(w.clone()) for w in weights]
    theirs = [nn.Parameter(w.clone()) for w in weights]
    config = TrainConfig(lr=1e-2, weight_decay=0.01)
    opt = build_optimizer([{"params": ours}], config)
    ref = torch.optim.AdamW([{"params": theirs}], lr=1e-2, weight_decay=0.01, foreach=False)
    assert opt.defaults["fused"] is True
    for step in grads:
        for p, q, g in zip(ours, theirs, step):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(ours, theirs))
    assert not torch.allclose(ours[0], weights[0], atol=1e-3)  # 5 steps of lr 1e-2 moved the weights
