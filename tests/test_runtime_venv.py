"""The runtime extra alone runs exports: a virtual environment with ``pip install -e ".[runtime]"`` has no torch,
and its ``zhie predict`` / ``segment`` / ``embed`` / ``eval`` on exports answer what the torch models answer; a
command that needs torch says which extra to install."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the export extra (onnx, onnxruntime, onnxscript) is not installed")
pytest.importorskip("onnxscript", reason="torch.onnx.export (dynamo) needs onnxscript")

import zhie  # noqa: E402
from tests.tiny_models import nested_corpus, trained  # noqa: E402
from zhie.data import write_ner_jsonl  # noqa: E402
from zhie.deploy.export import export  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["吕洋琼在清宁县银行工作。", "蔡涛勇毕业于新平省基金会，住在湖南区。"]


@pytest.fixture(scope="module")
def venv_bin(tmp_path_factory) -> Path:
    """A fresh virtual environment with zhie and its runtime extra only (pip resolves them as a user's would)."""
    where = tmp_path_factory.mktemp("venv") / "runtime"
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    done = subprocess.run([str(where / "bin" / "pip"), "install", "-q", "-e", f"{ROOT}[runtime]"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return where / "bin"


def run(venv_bin: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv_bin / "zhie"), *args], capture_output=True, text=True, timeout=300)


def exported(kind: str, tmp_path: Path) -> tuple[Path, Path]:
    source = trained(kind)
    return source, export(source, tmp_path / kind)


def test_the_runtime_extra_has_no_torch(venv_bin):
    for module in ("torch", "transformers"):
        done = subprocess.run([str(venv_bin / "python"), "-c", f"import {module}"], capture_output=True, text=True)
        assert done.returncode != 0 and f"No module named '{module}'" in done.stderr


@pytest.mark.parametrize("kind", ["ner-crf", "ner-gp", "re", "multitask"])
def test_predict_from_an_export_without_torch(venv_bin, tmp_path, kind):
    source, out = exported(kind, tmp_path)
    done = run(venv_bin, "predict", str(out), *TEXTS)
    assert done.returncode == 0, done.stderr
    pipe = zhie.load(source, device="cpu")
    want = [{"text": t, pipe.task.output_key: pipe.task.to_json(p)} for t, p in zip(TEXTS, pipe.predict(TEXTS))]
    got = [json.loads(line) for line in done.stdout.splitlines()]
    assert json.dumps(got, sort_keys=True, ensure_ascii=False) == json.dumps(want, sort_keys=True, ensure_ascii=False)


STUDENTS = {"conv": dict(student="conv", encoder_layers=3, width=64),
            "narrow": dict(student="narrow", encoder_layers=2, width=64),
            "pruned cut": dict(student="cut", encoder_layers=2, attention_heads=1, bigrams=97)}


@pytest.mark.parametrize("student", list(STUDENTS))
def test_a_fast_students_int8_export_predicts_without_torch(venv_bin, tmp_path, student):
    from zhie.training import TrainConfig
    from zhie.training.students import distill_student

    write_ner_jsonl(nested_corpus(120, seed=1), tmp_path / "train.jsonl")
    distill_student([trained("ner-gp")], tmp_path / "train.jsonl", out=tmp_path / "s", head="egp",
                    config=TrainConfig(epochs=8, lr=2e-3, batch_size=16), progress=False, **STUDENTS[student])
    out = export(tmp_path / "s" / "best", tmp_path / "onnx", quantize="int8")
    done = run(venv_bin, "predict", str(out), *TEXTS)
    assert done.returncode == 0, done.stderr
    pipe = zhie.load(out)  # the same export in this process: the runtime venv answers what it answers here
    want = [{"text": t, pipe.task.output_key: pipe.task.to_json(p)} for t, p in zip(TEXTS, pipe.predict(TEXTS))]
    assert [json.loads(line) for line in done.stdout.splitlines()] == want
    assert all(row["entities"] for row in want), want  # a student that learned: spans to compare


def test_segment_embed_and_eval_from_exports_without_torch(venv_bin, tmp_path):
    source, out = exported("cws", tmp_path)
    done = run(venv_bin, "segment", str(out), TEXTS[0])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["  ".join(zhie.load(source, device="cpu").segment(TEXTS[0])[0])]

    source, out = exported("similarity", tmp_path)
    done = run(venv_bin, "embed", str(out), *TEXTS)
    assert done.returncode == 0, done.stderr
    vectors = [json.loads(line)["embedding"] for line in done.stdout.splitlines()]
    np.testing.assert_allclose(vectors, zhie.load(source, device="cpu").encode(TEXTS), atol=1e-4)

    source, out = exported("ner-softmax", tmp_path)
    write_ner_jsonl(nested_corpus(20, seed=7), tmp_path / "dev.jsonl")
    done = run(venv_bin, "eval", str(out), "--data", str(tmp_path / "dev.jsonl"), "--json", str(tmp_path / "m.json"))
    assert done.returncode == 0, done.stderr
    metrics = zhie.load(source, device="cpu").evaluate(nested_corpus(20, seed=7))
    assert json.loads((tmp_path / "m.json").read_text(encoding="utf-8"))["micro"] == pytest.approx(metrics["micro"])


def test_commands_that_need_torch_say_which_extra(venv_bin, tmp_path):
    assert run(venv_bin, "--help").returncode == 0
    done = run(venv_bin, "predict", str(trained("ner-gp")), TEXTS[0])  # a torch model directory
    assert done.returncode == 2 and "pip install 'zhie[train]'" in done.stderr, done.stderr
    done = run(venv_bin, "export", str(trained("ner-gp")), "--out", str(tmp_path / "onnx"))
    assert done.returncode == 2 and "pip install 'zhie[train,export]'" in done.stderr, done.stderr
