"""Model cards (issue 26, item 3): ``README.md`` in every saved model directory, made from ``zhie.json`` and the run's
``training.json`` by :func:`zhie.core.card.render`; a training run records what the card needs; ``zhie demo`` says where
the card and the curves are."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import zhie
from zhie.cli import main
from zhie.core import card
from zhie.data import read_ner, write_ner_jsonl
from zhie.training import TrainConfig
from zhie.training.report import read_metrics

from . import tiny_models

SECTIONS = ["## Task and labels", "## Training data", "## Training", "## Dev metrics", "## Limits", "## How to use"]

META = {"task": "ner", "labels": ["LOC", "PER"], "head": "egp", "mode": "char", "max_length": 128, "format": 2,
        "zhie_version": "9.8.7"}
ABOUT = {"summary": "named-entity recognition with the egp head", "pipeline_tag": "token-classification",
         "metrics": ["precision", "recall", "f1"], "labels": {"title": "Entity types", "values": ["LOC", "PER"]},
         "limits": ["max length 128 tokens", "char mode: one token per character"]}
RECORD = {
    "command": "zhie train ner --train tr.json --dev dv.json --head egp --out runs/x", "encoder": "e5-small",
    "base_model": "intfloat/multilingual-e5-small",
    "data": [{"role": "train", "path": "tr.json", "bytes": 123457, "sha256": "ab" * 32},
             {"role": "dev", "path": "dv.json", "bytes": 9871, "sha256": "cd" * 32}],
    "train_config": {"epochs": 3, "batch_size": 32, "lr": 2e-5, "seed": 42, "precision": "bf16"},
    "machine": {"platform": "Linux-x", "cpus": 16, "gpus": ["NVIDIA H100 80GB HBM3"], "processes": 1,
                "python": "3.11.7", "torch": "2.13.0", "transformers": "5.23.0"},
    "saved": "2026-11-23T10:00:00+00:00", "metric": "f1",
    "dev": {"micro": {"precision": 0.8125, "recall": 0.7511, "f1": 0.7806},
            "per_type": {"LOC": {"precision": 0.9001, "recall": 0.8002, "f1": 0.8472, "support": 51},
                         "PER": {"precision": 0.6543, "recall": 0.7005, "f1": 0.6766, "support": 29}},
            "n_gold": 80, "n_pred": 74},
    "best": {"step": 300, "epoch": 2.0, "elapsed_s": 185.0}, "run": {"steps": 450, "elapsed_s": 7300.0},
}


def front_matter(text: str) -> dict:
    """The card's YAML header, parsed with PyYAML when it is installed, else read line by line (it is that simple)."""
    assert text.startswith("---\n")
    header = text[4:text.index("\n---\n")]
    try:
        import yaml
    except ImportError:
        out, key = {}, None
        for line in header.splitlines():
            if line.startswith("- "):
                out[key].append(json.loads(line[2:]))
            else:
                key, _, value = line.partition(": ")
                key = key.rstrip(":")
                out[key] = json.loads(value) if value.startswith('"') else value or []
        return out
    return yaml.safe_load(header)


def test_the_card_has_the_hub_header_every_section_and_the_records_numbers():
    text = card.render(META, RECORD, ABOUT)
    assert front_matter(text) == {"library_name": "zhie", "pipeline_tag": "token-classification", "language": ["zh"],
                                  "base_model": "intfloat/multilingual-e5-small", "tags": ["zhie", "ner", "egp"],
                                  "metrics": ["precision", "recall", "f1"]}
    positions = [text.index(f"\n{s}\n") for s in SECTIONS]
    assert positions == sorted(positions)
    for expected in ["`LOC`, `PER`", "| train | `tr.json` | 123457 | `" + "ab" * 32 + "` |",
                     "| dev | `dv.json` | 9871 |",
                     "`zhie train ner --train tr.json --dev dv.json --head egp --out runs/x`",
                     "epochs 3, batch_size 32, lr 2e-05, precision bf16, seed 42",
                     "3 min 05 s to this model (step 300, epoch 2.0) in a run of 450 steps and 2 h 01 min",
                     "NVIDIA H100 80GB HBM3", "zhie version: 9.8.7",
                     "| LOC | 0.9001 | 0.8002 | 0.8472 | 51 |", "| PER | 0.6543 | 0.7005 | 0.6766 | 29 |",
                     "| **all** | 0.8125 | 0.7511 | 0.7806 | 80 |", "| n_pred | 74 |", "- max length 128 tokens",
                     'zhie.load("MODEL_DIR")', "zhie predict MODEL_DIR", "zhie serve MODEL_DIR", "--errors"]:
        assert expected in text, expected


def test_without_a_training_record_the_card_says_what_was_not_recorded():
    text = card.render(META)
    assert front_matter(text)["library_name"] == "zhie" and "base_model" not in front_matter(text)
    assert all(f"\n{s}\n" in text for s in SECTIONS)
    assert text.count("Not recorded") == 2 and "zhie version: 9.8.7" in text


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_training_run_records_what_the_card_says_in_best(capsys):
    best = tiny_models.trained("ner-crf")
    run, data = best.parent, best.parent.parent
    record = json.loads((best / card.RECORD_FILE).read_text(encoding="utf-8"))
    assert [(f["role"], f["bytes"], f["sha256"]) for f in record["data"]] == [
        (role, (data / f"{role}.jsonl").stat().st_size, _sha256(data / f"{role}.jsonl")) for role in ("train", "dev")]
    history = read_metrics(run / "metrics.jsonl")
    assert record["best"] == {k: history[-1][k] for k in ("step", "epoch", "elapsed_s")}  # one evaluation, the last
    assert record["run"]["steps"] == history[-1]["step"] and record["encoder"] == "tiny"
    assert record["train_config"]["epochs"] == 4 and record["options"]["head"] == "crf"
    assert record["command"] and record["machine"]["cpus"] >= 1

    dev = zhie.load(best).evaluate(read_ner(data / "dev.jsonl"))  # the saved weights score what the record says
    assert record["dev"]["per_type"] == dev["per_type"] and set(dev["per_type"]) == {"LOC", "ORG", "PER"}
    text = (best / card.CARD_FILE).read_text(encoding="utf-8")
    assert text == card.render(json.loads((best / "zhie.json").read_text()), record, zhie.load(best).task.describe())
    for label, m in dev["per_type"].items():
        assert f"| {label} | {m['precision']:.4f} | {m['recall']:.4f} | {m['f1']:.4f} | {m['support']} |" in text
    assert "sha256 |" in text and _sha256(data / "train.jsonl") in text


MULTITASK = """
[[tasks]]
name = "ner"
task = "ner"
train = "ner.jsonl"
dev = "ner.jsonl"
options = {head = "gp", max_length = 48}

[[tasks]]
name = "seg"
task = "cws"
train = "cws.txt"
dev = "cws.txt"
"""


def test_a_multi_task_model_gets_a_card_with_every_member(tmp_path):
    write_ner_jsonl(tiny_models.nested_corpus(32, seed=1), tmp_path / "ner.jsonl")
    (tmp_path / "cws.txt").write_text("上海  体育局  召开  会议  。\n记者  从  大学  获悉  。\n" * 8, encoding="utf-8")
    (tmp_path / "mt.toml").write_text(MULTITASK, encoding="utf-8")
    zhie.fit("multitask", out=tmp_path / "run", encoder="tiny", tasks_file=tmp_path / "mt.toml",
             config=TrainConfig(epochs=1, batch_size=8, lr=1e-3, head_lr=1e-3, seed=0), resume=False, progress=False)
    best = tmp_path / "run" / "best"
    record = json.loads((best / card.RECORD_FILE).read_text(encoding="utf-8"))
    assert [f["role"] for f in record["data"]] == ["config", "ner/train", "ner/dev", "seg/train", "seg/dev"]
    assert set(record["dev"]) == {"ner", "seg"} and "per_type" in record["dev"]["ner"]
    text = (best / card.CARD_FILE).read_text(encoding="utf-8")
    assert "- Member `ner`: named-entity recognition with the gp head" in text
    assert "- Member `seg`: Chinese word segmentation with the crf head" in text
    assert "### ner" in text and "### seg" in text and "--task NAME" in text
    assert f"| seg/train | `{tmp_path / 'cws.txt'}` | {(tmp_path / 'cws.txt').stat().st_size} |" in text


def test_zhie_demo_prints_where_the_card_and_the_curves_are(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--encoder", "tiny", "--epochs", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    for path in (tmp_path / "demo/best/README.md", tmp_path / "demo/training.png"):
        assert str(path) in out and path.is_file()
