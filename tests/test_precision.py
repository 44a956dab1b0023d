"""--precision fp32|bf16|fp16: the encoder under autocast, heads, masks and losses in fp32; tiny models on the CPU."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

import zhie
from tests.tiny_models import nested_corpus, trained
from zhie.cli import build_parser
from zhie.heads import masking_value
from zhie.tasks.base import model_inputs
from zhie.training import TrainConfig
from zhie.training.config import config_from_flags
from zhie.training.report import read_metrics

TEXTS = [ex.text for ex in nested_corpus(30, seed=1)]  # sentences the tiny models learned


def spans(predictions) -> list[set]:
    return [{(s.start, s.end, s.label) for s in row} for row in predictions]


@pytest.mark.parametrize("kind", ["ner-gp", "ner-crf"])
def test_bf16_predicts_the_same_spans_as_fp32(kind):
    fp32 = spans(zhie.load(trained(kind)).predict(TEXTS))
    assert sum(map(len, fp32)) >= len(TEXTS)  # the model did learn them
    assert spans(zhie.load(trained(kind), precision="bf16").predict(TEXTS)) == fp32


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_heads_get_fp32_and_masks_stay_finite_under_autocast(precision, dtype):
    pipe = zhie.load(trained("ner-gp"), precision=precision)
    tt = pipe.task.text_tokenizer
    batch = model_inputs([tt.model_input(tt(t).ids) for t in TEXTS[:4]], tt.pad_id)
    linear = next(m for m in pipe.model.encoder.modules() if isinstance(m, torch.nn.Linear))
    seen = []
    handle = linear.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    try:
        with pipe.autocast():
            logits = pipe.model(**batch)[pipe.task.head_name]
    finally:
        handle.remove()
    assert torch.is_autocast_enabled("cpu") is False
    assert seen == [dtype]  # the encoder's matrix products did run in half precision
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    assert logits.min() == torch.tensor(masking_value(torch.float32))  # padding and j < i cells: the fp32 value
    assert math.isfinite(torch.tensor(masking_value(dtype), dtype=dtype).item())


def test_fp16_on_the_cpu_and_embeddings_in_bf16():
    assert spans(zhie.load(trained("ner-gp"), precision="fp16").predict(TEXTS[:5])) == spans(
        zhie.load(trained("ner-gp")).predict(TEXTS[:5]))
    fp32 = zhie.load(trained("similarity")).encode(TEXTS[:5])
    bf16 = zhie.load(trained("similarity"), precision="bf16").encode(TEXTS[:5])
    assert bf16.dtype == fp32.dtype and abs(bf16 - fp32).max() < 0.05


def test_unknown_precision_is_an_error():
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        zhie.load(trained("ner-gp"), precision="fp8")
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="no")


def test_the_loss_is_fp32_under_autocast():
    pipe = zhie.load(trained("ner-gp"))
    batch = pipe.task.collate(pipe.task.encode(nested_corpus(4, seed=9)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = pipe.task.loss(pipe.model, batch)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


def test_zhie_train_in_bf16_learns(tmp_path):
    """`zhie train --precision bf16`, the command in a process of its own."""
    from zhie.data import write_ner_jsonl

    write_ner_jsonl(nested_corpus(64, seed=1), tmp_path / "train.jsonl")
    command = [sys.executable, "-m", "zhie.cli", "train", "ner", "--train", str(tmp_path / "train.jsonl"), "--dev",
               str(tmp_path / "train.jsonl"), "--encoder", "tiny", "--head", "gp", "--max-length", "64", "--epochs",
               "3", "--batch-size", "16", "--lr", "2e-3", "--eval-every", "4", "--out", str(tmp_path / "run"),
               "--precision", "bf16", "--quiet"]
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    losses = [r["train_loss"] for r in records]
    assert all(map(math.isfinite, losses)) and losses[-1] < losses[0]


def test_a_second_fit_in_one_process_may_take_another_precision(tmp_path):
    """accelerate keeps one precision per process (its AcceleratorState): each run sets its own."""
    from accelerate.state import AcceleratorState

    from zhie.data import write_ner_jsonl

    write_ner_jsonl(nested_corpus(16, seed=1), tmp_path / "train.jsonl")
    for precision, accelerate_name in (("bf16", "bf16"), ("fp32", "no"), ("bf16", "bf16")):
        zhie.fit("ner", tmp_path / "train.jsonl", tmp_path / "train.jsonl", out=tmp_path / f"run-{precision}",
                 encoder="tiny", head="gp", max_length=32, config=TrainConfig(max_steps=2, batch_size=8,
                                                                              precision=precision),
                 resume=False, progress=False)
        assert AcceleratorState().mixed_precision == accelerate_name


def test_train_flags_precision_and_the_deprecated_alias(capsys):
    parser = build_parser()
    args = parser.parse_args(["train", "ner", "--train", "a", "--dev", "b", "--out", "c", "--precision", "bf16"])
    assert args.precision == "bf16"
    args = parser.parse_args(["train", "ner", "--train", "a", "--dev", "b", "--out", "c", "--mixed-precision", "no"])
    assert args.precision == "fp32" and "deprecated" in capsys.readouterr().err
    default = parser.parse_args(["train", "ner", "--train", "a", "--dev", "b", "--out", "c"])
    assert default.precision == TrainConfig.precision == config_from_flags(default).precision == "fp32"  # its default
