"""New entity types without forgetting (issue 52): ``zhie train ner --from MODEL`` on data of a type the model lacks
gives one model of every type that keeps the old types (the old model's soft targets on the new texts), better than
naive fine-tuning on the new data (``--old-types gold``: gold zeros for the old types, no soft targets); what cannot be
merged is refused; the run's ``config.toml`` reruns it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

import zhie
from zhie.cli import main
from zhie.data import NerExample, write_ner_jsonl
from zhie.training import TrainConfig, extend

from .tiny_models import nested_corpus

OLD_TYPES = ("PER", "LOC")


def only(examples: list[NerExample], labels) -> list[NerExample]:
    """``examples`` with the entities of ``labels`` only."""
    return [NerExample(ex.text, [s for s in ex.spans if s.label in labels]) for ex in examples]


def config(epochs: int) -> TrainConfig:
    return TrainConfig(epochs=epochs, batch_size=16, lr=1e-3, head_lr=1e-3, warmup=0.05, seed=0, eval_every=10**9)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """``old.jsonl`` (PER and LOC only), ``new.jsonl`` (other texts, ORG only), ``test.jsonl`` (held out, every
    type), and the old model, trained on ``old.jsonl``, in ``old/best``."""
    root = tmp_path_factory.mktemp("extend")
    write_ner_jsonl(only(nested_corpus(160, seed=11), OLD_TYPES), root / "old.jsonl")
    write_ner_jsonl(only(nested_corpus(120, seed=12), ("ORG",)), root / "new.jsonl")
    write_ner_jsonl(nested_corpus(60, seed=13), root / "test.jsonl")
    zhie.fit("ner", root / "old.jsonl", root / "old.jsonl", out=root / "old", encoder="tiny", head="gp",
             max_length=48, config=config(10), resume=False, progress=False)
    return root


def f1s(model: Path, data: Path) -> dict[str, float]:
    pipe = zhie.load(model)
    metrics = pipe.evaluate(pipe.task.read(data / "test.jsonl"))
    return {label: m["f1"] for label, m in metrics["per_type"].items()}


def extended(data: Path, out: str, old_types: str = "model") -> Path:
    zhie.fit("ner", data / "new.jsonl", data / "new.jsonl", out=data / out, head="gp", max_length=48,
             from_model=data / "old" / "best", old_types=old_types, config=config(4), resume=False, progress=False)
    return data / out / "best"


def test_extended_model_learns_the_new_type_and_keeps_the_old_ones_better_than_naive_fine_tuning(data):
    old = f1s(data / "old" / "best", data)
    assert min(old[t] for t in OLD_TYPES) > 0.6, old  # a model worth keeping
    ours = f1s(extended(data, "ours"), data)
    assert zhie.load(data / "ours" / "best").task.config.labels == ["LOC", "PER", "ORG"]  # old types keep their rows
    # naive: the same start and steps, every type taught by the new data's gold labels (old types: learnt as absent)
    naive = f1s(extended(data, "naive", old_types="gold"), data)
    assert not (data / "naive" / "teacher").exists() and (data / "ours" / "teacher" / "targets.pt").is_file()
    print({"old": old, "extended": ours, "naive": naive})
    assert ours["ORG"] > 0.5, ours
    for t in OLD_TYPES:
        assert ours[t] >= old[t] - 0.1, (t, old, ours)
    assert sum(ours[t] for t in OLD_TYPES) > sum(naive.get(t, 0.0) for t in OLD_TYPES) + 0.3, (ours, naive)


def test_the_run_s_config_toml_reruns_it_to_the_same_weights(data):
    flags = ["--max-length", "48", "--epochs", "1", "--batch-size", "16", "--seed", "3", "--quiet"]
    assert main(["train", "ner", "--from", str(data / "old"), "--train", str(data / "new.jsonl"), "--dev",
                 str(data / "new.jsonl"), "--out", str(data / "r1"), *flags]) == 0
    text = (data / "r1" / "config.toml").read_text(encoding="utf-8")
    assert f'from_model = "{data / "old"}"' in text and 'encoder = "tiny"' in text
    assert main(["train", "--config", str(data / "r1" / "config.toml"), "--out", str(data / "r2")]) == 0
    a, b = ({f"{f.name}:{k}": v for f in sorted((data / r / "best").glob("*.safetensors"))
             for k, v in load_file(f).items()} for r in ("r1", "r2"))
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
    first = {f"head.safetensors:{k}": v for k, v in load_file(data / "old" / "best" / "head.safetensors").items()}
    assert any(bool((first[k] != a[k][tuple(slice(0, n) for n in first[k].shape)]).any()) for k in first)  # trained


def test_new_data_without_a_new_type_is_continued_training(data, capsys):
    assert main(["train", "ner", "--from", str(data / "old"), "--train", str(data / "old.jsonl"), "--dev",
                 str(data / "old.jsonl"), "--out", str(data / "warm"), "--max-steps", "1", "--quiet"]) == 0
    assert "continued training (a warm start)" in capsys.readouterr().err
    assert zhie.load(data / "warm").task.config.labels == ["LOC", "PER"]


def refusal(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_what_cannot_be_merged_is_refused_with_the_reason(data, capsys):
    base = ["train", "ner", "--train", str(data / "new.jsonl"), "--dev", str(data / "new.jsonl"), "--max-steps", "1",
            "--quiet", "--out", str(data / "refused")]
    old = str(data / "old")
    for kind in ("re", "cws"):  # the old model's directory, said to be of another task (refused before loading)
        other = data / f"as-{kind}"
        shutil.copytree(data / "old" / "best", other, dirs_exist_ok=True)
        meta = json.loads((other / "zhie.json").read_text(encoding="utf-8"))
        (other / "zhie.json").write_text(json.dumps({**meta, "task": kind}), encoding="utf-8")
        err = refusal([*base, "--from", str(other)], capsys)
        assert f"a {kind} model; zhie train ner --from extends a NER model" in err, err
    err = refusal([*base, "--from", old, "--head", "egp"], capsys)
    assert "--head egp: the model in" in err and "has --head gp" in err, err
    err = refusal([*base, "--from", str(data)], capsys)
    assert "not a model directory" in err, err
    err = refusal([*base, "--from", old, "--encoder", "new:bert:layers=1,hidden=32,heads=2,intermediate=64"], capsys)
    assert "was trained from the encoder tiny" in err, err
    zhie.fit("ner", data / "old.jsonl", data / "old.jsonl", out=data / "crf", encoder="tiny", head="crf",
             flatten=True, max_length=48, config=TrainConfig(max_steps=1, batch_size=16), progress=False)
    err = refusal([*base, "--from", str(data / "crf")], capsys)
    assert "new entity types (" in err and "gp and egp models only" in err, err


def test_copy_head_keeps_the_old_types_rows_of_every_ner_head():
    import torch

    from zhie.heads import CrfTagger, EfficientGlobalPointer, GlobalPointer, SoftmaxTagger

    torch.manual_seed(0)
    x, mask = torch.randn(2, 6, 16), torch.ones(2, 6, dtype=torch.long)
    for make in (lambda k: GlobalPointer(16, k, head_size=8, mask_special=True),
                 lambda k: EfficientGlobalPointer(16, k, head_size=8, mask_special=True)):
        old, new = make(2), make(3)
        extend.copy_head(old, new)
        torch.testing.assert_close(new(x, mask)[:, :2], old(x, mask))  # the old types score as before
    tags = ["O", "B-A", "I-A", "B-B", "I-B"]
    for make in (lambda t: SoftmaxTagger(16, len(t)), lambda t: CrfTagger(16, t, "BIO")):
        old, new = make(tags), make([*tags, "B-C", "I-C"])
        old.eval(), new.eval()
        extend.copy_head(old, new)
        torch.testing.assert_close(new(x)[..., :5], old(x))
        for name, value in old.state_dict().items():  # the CRF's transitions among the old tags too
            torch.testing.assert_close(new.state_dict()[name][tuple(slice(0, n) for n in value.shape)], value)


def run_parts(data: Path, out: Path, old_types: str):
    """What :func:`zhie.fit` trains when it extends the old model with ``new.jsonl`` (ORG only): the old model's
    :class:`~zhie.training.extend.Extension`, the new model (its head's old rows copied, in eval mode) and what
    :func:`extend.training` gives: the items, their collate function and the objective."""
    from zhie import tasks
    from zhie.model import Model
    from zhie.training.config import RunOptions

    cls = tasks.get("ner")
    examples = cls.read(data / "new.jsonl")
    ext = extend.prepare(cls, data / "old" / "best", examples, encoder=RunOptions.encoder,
                         default_encoder=RunOptions.encoder, options={"head": "gp", "max_length": 48},
                         keep_tokens=RunOptions.keep_tokens, default_keep_tokens=RunOptions.keep_tokens,
                         encoder_layers=None, unshare_layers=False, old_types=old_types)
    t = cls(ext.config, ext.task.tokenizer)
    items = t.encode(examples)
    hidden = ext.model.encoder.config.hidden_size
    model = Model(ext.model.encoder, t.build_heads(hidden))
    extend.copy_head(ext.model.heads[t.head_name], model.heads[t.head_name])
    trained = extend.training(ext, t, items, t.objective(hidden), out, data / "new.jsonl", "auto", False, False)
    return ext, model.eval(), trained


def test_naive_fine_tuning_gives_the_old_types_gold_zeros_and_extending_the_old_model_s_soft_targets(data, tmp_path):
    import torch

    from zhie.losses import TaskLoss
    from zhie.losses.distill import SPAN_MIN_PROB, span_soft_loss

    n_old = len(OLD_TYPES)
    for old_types in ("gold", "model", "predictions"):
        ext, model, (items, collate, objective) = run_parts(data, tmp_path / old_types, old_types)
        assert ext.config.labels == ["LOC", "PER", "ORG"] and ext.adds_types
        batch = collate(items[:16])
        name = ext.task.head_name
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], heads=[name])[name]
            old = ext.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], heads=[name])[name]
            loss = objective(model, batch)
        gold = extend.gold_targets(batch["labels"], logits)
        assert gold[:, :n_old].sum() == 0 and gold[:, n_old:].sum() > 0  # new.jsonl labels ORG alone
        if old_types == "gold":  # naive: no soft targets anywhere; every type, the old ones included, learns gold
            assert not ext.teaches and ext.gold_labels == ext.config.labels
            assert type(objective) is TaskLoss and "soft_cells" not in batch
            assert not (tmp_path / "gold" / "teacher").exists()  # the old model labelled nothing
            target = gold
        else:  # the old model's probabilities (or its predicted spans) for LOC and PER, gold for ORG
            assert ext.teaches and ext.gold_labels == ["ORG"]
            assert isinstance(objective, extend.ExtendObjective) and "soft_cells" in batch
            target = objective.targets(batch, logits)
            torch.testing.assert_close(target[:, n_old:], gold[:, n_old:])
            probs = torch.sigmoid(2 * old)
            if old_types == "model":
                expected = torch.where(probs >= SPAN_MIN_PROB, probs, torch.zeros_like(probs))
                torch.testing.assert_close(target[:, :n_old], expected, atol=2e-3, rtol=0)
            else:  # the spans it predicts (a logit over 0), as labels; the cells it is unsure of are some
                torch.testing.assert_close(target[:, :n_old], (old > 0).float())
                assert ((probs > 0.01) & (probs < 0.99))[:, :n_old].any()
            assert target[:, :n_old].max() > 0.9  # the texts' PER and LOC mentions, unlabelled, taught as entities
        torch.testing.assert_close(loss, span_soft_loss(logits, target).mean(), atol=1e-4, rtol=1e-4)


def test_old_types_gold_is_in_the_run_s_config_and_refused_without_from(data, capsys):
    assert main(["train", "ner", "--from", str(data / "old"), "--old-types", "gold", "--train",
                 str(data / "new.jsonl"), "--dev", str(data / "new.jsonl"), "--out", str(data / "g1"), "--max-steps",
                 "1", "--quiet"]) == 0
    assert 'old_types = "gold"' in (data / "g1" / "config.toml").read_text(encoding="utf-8")
    assert not (data / "g1" / "teacher").exists()
    err = refusal(["train", "ner", "--old-types", "gold", "--train", str(data / "new.jsonl"), "--dev",
                   str(data / "new.jsonl"), "--encoder", "tiny", "--out", str(data / "g2"), "--max-steps", "1",
                   "--quiet"], capsys)
    assert "--old-types gold: only with --from MODEL" in err, err
