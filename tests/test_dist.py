"""Training in several processes: ``torchrun`` with 2 CPU processes (gloo) computes what one process computes with
twice the batch (a task's ``fit`` and ``zhie pretrain``), only the main process writes, every process evaluates and
takes the main process's result, CoSENT ranks the pairs of every process, an interrupted run resumes bit-exactly,
batches are cut into full slices, and the e5-small conversion runs once when several processes start together."""

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from zhie import demo, encoders
from zhie.data import read_ner, write_ner_jsonl
from zhie.dist import local_device
from zhie.encoders import SPECIAL_TOKENS, e5, wordpiece_tokenizer
from zhie.encoders.mlm import HEAD_FILE
from zhie.model import Model
from zhie.tasks.base import seeded
from zhie.tasks.ner import NerTask
from zhie.tasks.similarity import SimilarityConfig, SimilarityTask
from zhie.tasks.xner import XnerEvaluatorTask
from zhie.training import epoch_batches
from zhie.training.batching import process_batches
from zhie.training.report import read_metrics

from .dist_worker import PAIRS, cosent_inputs
from .test_mtmt import LOC, ORG, PER, WORDS, corpus
from .tiny_models import multitask_config, paragraphs, write_multitask_data

WORKER = Path(__file__).with_name("dist_worker.py")
needs_gloo = pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available")


def torchrun(processes: int, results: Path, *args: str, timeout: float = 120) -> list[dict]:
    """Run ``dist_worker.py ARGS RESULTS`` in ``processes`` CPU processes; their results, in rank order."""
    results.mkdir(parents=True)
    launch(processes, str(WORKER), *args, results, timeout=timeout)
    return [json.loads((results / f"rank{r}.json").read_text()) for r in range(processes)]


def launch(processes: int, *args: str, timeout: float = 120) -> None:
    """``torchrun --nproc-per-node PROCESSES ARGS`` on the CPU; fails the test unless it ends well within
    ``timeout`` seconds."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}  # the same threads in every run
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
               "--master-addr", "127.0.0.1", "--master-port", str(port), *map(str, args)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # torchrun stops its workers (each in a session of its own, out of reach of a group kill)
        try:
            _, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stderr = "(none: torchrun did not stop, and its workers may still hold its output)"
        pytest.fail(f"torchrun did not finish in {timeout} s; its stderr:\n{stderr[-5000:]}")
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}); its stderr:\n{stderr[-5000:]}"


# ---------------------------------------------------------------------------------------------------------------
# NER: 2 processes x batch 8 against 1 process x batch 16
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ner_runs(tmp_path_factory) -> dict:
    """64 made-up NER items (4 steps of 16), a tiny encoder without dropout (a process draws its own dropout masks, so
    with dropout the two runs would differ), trained once in 2 processes with batch 8 and once in 1 with batch 16."""
    tmp = tmp_path_factory.mktemp("dist")
    train, dev = demo.make_corpus(64, seed=1), demo.make_corpus(16, seed=2)
    write_ner_jsonl(train, tmp / "train.json")
    write_ner_jsonl(dev, tmp / "dev.json")
    texts = [ex.text for ex in train + dev]
    encoder, tokenizer = encoders.tiny(texts, seed=0)
    encoder.config.hidden_dropout_prob = encoder.config.attention_probs_dropout_prob = 0.0
    encoder.save_pretrained(tmp / "encoder")
    tokenizer.save_pretrained(tmp / "encoder")
    data = [tmp / "train.json", tmp / "dev.json", tmp / "encoder"]
    return {"tmp": tmp,
            "two": torchrun(2, tmp / "results2", "ner", *data, tmp / "run2", 8),
            "one": torchrun(1, tmp / "results1", "ner", *data, tmp / "run1", 16)[0]}


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "best" / "model.safetensors") | load_file(run / "best" / "head.safetensors")


def assert_same_training(tmp: Path) -> None:
    """``tmp/run1`` and ``tmp/run2`` saved the same weights, which training moved away from ``tmp/encoder``'s."""
    w1, w2 = weights(tmp / "run1"), weights(tmp / "run2")
    assert w1.keys() == w2.keys()
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    initial = load_file(tmp / "encoder" / "model.safetensors")
    assert max((w1[name] - initial[name]).abs().max().item() for name in initial) > 1e-3  # training moved them


@needs_gloo
def test_two_processes_train_as_one_with_twice_the_batch(ner_runs):
    tmp, one, two = ner_runs["tmp"], ner_runs["one"]["summary"], ner_runs["two"][0]["summary"]
    assert one["steps"] == two["steps"] == 4 and one["best_step"] == two["best_step"] == 4  # best/ = final weights
    assert two["history"][0]["train_loss"] == pytest.approx(one["history"][0]["train_loss"], rel=1e-6)
    assert_same_training(tmp)


@needs_gloo
def test_only_the_main_process_writes(ner_runs):
    tmp, (rank0, rank1) = ner_runs["tmp"], ner_runs["two"]
    assert rank1["writes"] == []
    written = {Path(path).parts[0] for path in rank0["writes"] if path != "."}
    assert {"metrics.jsonl", "best"} <= written
    assert any(name.startswith(f".{file}.") for name in written for file in ("data_stats.json", "checkpoint.pt"))
    assert read_metrics(tmp / "run2" / "metrics.jsonl") == rank0["summary"]["history"]  # one evaluation, logged once
    steps = read_metrics(tmp / "run2" / "metrics.jsonl", kind="step")
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and steps == rank0["summary"]["step_records"]
    assert json.loads((tmp / "run2" / "data_stats.json").read_text(encoding="utf-8"))["examples"] == 64


@needs_gloo
def test_every_process_gets_the_main_process_evaluation(ner_runs):
    rank0, rank1 = (r["summary"] for r in ner_runs["two"])
    assert rank1["best"] == rank0["best"] and rank1["best_step"] == rank0["best_step"]
    assert [h["dev"] for h in rank1["history"]] == [h["dev"] for h in rank0["history"]]


@needs_gloo
def test_every_process_evaluates_and_none_waits_for_another(tmp_path):
    """A 15 s evaluation in a process group whose collectives time out after 10 s: a process waiting in a collective
    while another evaluated would fail. Each process scores differently; both keep the main process's score."""
    ranks = torchrun(2, tmp_path / "results", "evaluate", tmp_path / "run")
    assert [r["evaluations"] for r in ranks] == [1, 1]
    assert [r["summary"]["best"] for r in ranks] == [{"f1": 0.0}, {"f1": 0.0}]


# ---------------------------------------------------------------------------------------------------------------
# zhie pretrain: 2 processes x batch 4, stopped and resumed, against 1 process x batch 8
# ---------------------------------------------------------------------------------------------------------------
PRETRAIN = ["--encoder", "new:bert:layers=1,hidden=32,heads=2,intermediate=64,dropout=0", "--steps", "6",
            "--max-length", "64", "--heldout", "20", "--shuffle-buffer", "16", "--lr", "1e-3", "--eval-every", "3",
            "--save-every", "3", "--seed", "0", "--quiet"]


@pytest.fixture(scope="module")
def pretrain_runs(tmp_path_factory) -> dict:
    """300 made-up lines of text; a BERT without dropout (each process draws its own masks) pre-trained for 6 steps by
    ``torchrun -m zhie pretrain`` in 1 process with batch 8, and in 2 with batch 4 stopped after step 4 (between the
    evaluations at 3 and 6) and resumed."""
    tmp = tmp_path_factory.mktemp("pretrain")
    (tmp / "corpus.txt").write_text("\n".join(paragraphs(300, seed=6)) + "\n", encoding="utf-8")
    args = ["--corpus", tmp / "corpus.txt", *PRETRAIN]
    launch(1, "-m", "zhie", "pretrain", "--out", tmp / "one" / "out", *args, "--batch-size", 8)
    two = [torchrun(2, tmp / f"results-{name}", "pretrain", tmp / "two" / "out", *args, "--batch-size", 4, *flags)
           for name, flags in (("first", ["--stop-after", 4]), ("resumed", []))]
    return {"one": tmp / "one" / "out", "two": tmp / "two" / "out", "launches": two}


def mlm_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "model.safetensors") | {f"head.{k}": v for k, v in load_file(out / HEAD_FILE).items()}


def records(out: Path, kind: str = "eval") -> list[dict]:
    return read_metrics(out / "metrics.jsonl", kind)


@needs_gloo
def test_two_processes_pretrain_as_one_with_twice_the_batch(pretrain_runs):
    one, two = records(pretrain_runs["one"]), records(pretrain_runs["two"])
    assert [r["step"] for r in two] == [r["step"] for r in one] == [3, 6]
    assert [r["tokens"] for r in two] == [r["tokens"] for r in one]  # the same sequences
    for a, b in zip(one, two):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
        assert b["train_accuracy"] == pytest.approx(a["train_accuracy"], rel=1e-5)
        assert b["dev"]["predicted"] == a["dev"]["predicted"] > 0  # each held-out token counted once
        assert b["dev"] == pytest.approx(a["dev"], rel=1e-5)
    steps = records(pretrain_runs["one"], "step"), records(pretrain_runs["two"], "step")
    assert [r["step"] for r in steps[1]] == [r["step"] for r in steps[0]] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(*steps):  # the step records too, across the stop after step 4
        assert (b["loss"], b["grad_norm"]) == pytest.approx((a["loss"], a["grad_norm"]), rel=1e-5)
    w1, w2 = mlm_weights(pretrain_runs["one"]), mlm_weights(pretrain_runs["two"])
    assert w1.keys() == w2.keys()
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    summary = json.loads((pretrain_runs["two"] / "pretrain.json").read_text(encoding="utf-8"))
    assert summary["processes"] == 2 and summary["finished"] and summary["step"] == 6


@needs_gloo
def test_only_the_main_process_writes_the_pretraining_run(pretrain_runs):
    for rank0, rank1 in pretrain_runs["launches"]:
        assert rank0["code"] == rank1["code"] == 0
        assert rank1["writes"] == []
        assert any(path.startswith(".out.") for path in rank0["writes"])  # the snapshot's temporary directory


# ---------------------------------------------------------------------------------------------------------------
# CoSENT over the pairs of every process
# ---------------------------------------------------------------------------------------------------------------
@needs_gloo
def test_cosent_over_two_processes_is_cosent_over_all_pairs(tmp_path):
    """2 processes x 16 pairs: the loss, and the gradient DDP averages, of one process with the 32 pairs."""
    ranks = torchrun(2, tmp_path / "results", "cosent")
    layer, inputs, labels = cosent_inputs()
    task = SimilarityTask(SimilarityConfig(loss="cosent"), tokenizer=None)
    loss = task.head_loss(None, layer(inputs), {"labels": labels})
    loss.backward()
    for r in ranks:
        assert r["loss"] == pytest.approx(loss.item(), rel=1e-6)
        torch.testing.assert_close(torch.tensor(r["weight_grad"]), layer.weight.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.tensor(r["bias_grad"]), layer.bias.grad, rtol=1e-5, atol=1e-6)
    half = task.head_loss(None, layer(inputs[:PAIRS]), {"labels": labels[:PAIRS // 2]})
    assert abs(half.item() - loss.item()) > 0.1  # a process ranking only its own pairs would be caught


@needs_gloo
def test_sampled_multitask_steps_train_the_same_member_in_every_process(tmp_path):
    """A CWS and a CoSENT member, one sampled per step: both processes train the same member at each step (else the
    CoSENT one waits for the other's pairs, or DDP reduces different heads), each on its own batch of it; the head
    of the member not drawn gets no gradient, which DDP must allow."""
    config = multitask_config(write_multitask_data(tmp_path), tmp_path, 'scheme = "equal"', members=("seg", "sim"),
                              sampling='mode = "proportional"')
    ranks = [r["summary"]["history"] for r in torchrun(2, tmp_path / "results", "multitask", config, tmp_path / "run")]
    rows = [[row for record in history for row in record["per_batch"]] for history in ranks]
    assert [row["batch"] for row in rows[0]] == list(range(1, 7))
    members = [[name for row in r for name in row["losses"]] for r in rows]
    assert members[0] == members[1] and set(members[0]) == {"seg", "sim"}
    for row0, row1 in zip(*rows):
        if "sim" in row0["losses"]:  # CoSENT ranks the pairs of both processes: the same loss in each
            assert row0["losses"]["sim"] == pytest.approx(row1["losses"]["sim"], rel=1e-6)
        else:  # each process has its own batch
            assert row0["losses"]["seg"] != row1["losses"]["seg"]


@needs_gloo
def test_a_resumed_run_ends_as_the_uninterrupted_one(tmp_path):
    """Bit-exact resume in 2 processes with dropout: each process gets its own generators back from the
    checkpoint (the main process's alone would give the other one different dropout masks)."""
    assert [r["max_difference"] for r in torchrun(2, tmp_path / "results", "resume", tmp_path)] == [0.0, 0.0]


@needs_gloo
def test_adversarial_steps_with_accumulation_perturb_as_one_process(tmp_path):
    """FGM and PGD with 2 batches a step (the first under DDP's no_sync, the second synchronised): in 2 processes x
    batch 4, each adversarial step starts from the same direction in both, that of 1 process x batch 8, where it is
    the gradient of the micro-batch's own clean loss; both runs end with the same weights."""
    one = torchrun(1, tmp_path / "results1", "adversarial", 8, tmp_path / "run1")[0]
    two = torchrun(2, tmp_path / "results2", "adversarial", 4, tmp_path / "run2")
    for method in ("fgm", "pgd"):
        reference = torch.tensor(one[method]["directions"])
        assert reference.shape[0] == 4  # 2 steps of 2 micro-batches
        torch.testing.assert_close(reference, torch.tensor(one[method]["own"]), rtol=0, atol=1e-5)
        for rank in two:
            torch.testing.assert_close(torch.tensor(rank[method]["directions"]), reference, rtol=0, atol=1e-5,
                                       msg=lambda m, r=rank["rank"], method=method: f"{method}, rank {r}: {m}")
        for name, values in one[method]["weights"].items():
            torch.testing.assert_close(torch.tensor(two[0][method]["weights"][name]), torch.tensor(values), rtol=0,
                                       atol=1e-5, msg=lambda m, name=name, method=method: f"{method} {name}: {m}")


# ---------------------------------------------------------------------------------------------------------------
# MTMT distillation: 2 processes x batch 8 against 1 process x batch 16
# ---------------------------------------------------------------------------------------------------------------
@needs_gloo
def test_distill_in_two_processes_trains_as_one_with_twice_the_batch(tmp_path):
    """Untrained teachers (they need not be good), each process running them on its own batches of pairs; a student
    without dropout (a process draws its own masks): 64 pairs of 40 target sentences, 4 steps, the same weights as one
    process with twice the batch."""
    from transformers import BertConfig, BertModel

    (tmp_path / "src.txt").write_text(corpus(40, 1), encoding="utf-8")
    (tmp_path / "tgt.txt").write_text(corpus(40, 2), encoding="utf-8")
    chars = sorted({c for w in PER + LOC + ORG + WORDS for c in w})
    vocab = SPECIAL_TOKENS + WORDS + chars + ["##" + c for c in chars]
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=48, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    with seeded(0):
        BertModel(config, add_pooling_layer=False).save_pretrained(tmp_path / "encoder")
    tokenizer = wordpiece_tokenizer(vocab)
    tokenizer.save_pretrained(tmp_path / "encoder")
    examples = read_ner(tmp_path / "src.txt", "wikiann")
    recognizer = NerTask.configure(examples, encoder="", mode="word", head="softmax", max_length=48)
    for name, task in (("rec", NerTask(dataclasses.replace(recognizer, dropout=0.0), tokenizer)),
                       ("ev", XnerEvaluatorTask(XnerEvaluatorTask.configure(examples, encoder="", max_length=48),
                                                tokenizer))):
        with seeded(1):
            task.save(Model(encoders.load(str(tmp_path / "encoder"))[0], task.build_heads(32)), tmp_path / name)
    args = [tmp_path / "rec", tmp_path / "ev", tmp_path / "tgt.txt", tmp_path / "encoder"]
    two = torchrun(2, tmp_path / "results2", "distill", *args, tmp_path / "run2", 8)
    one = torchrun(1, tmp_path / "results1", "distill", *args, tmp_path / "run1", 16)[0]["summary"]
    assert one["steps"] == two[0]["summary"]["steps"] == two[1]["summary"]["steps"] == 4
    assert_same_training(tmp_path)


def test_each_process_runs_the_teachers_on_its_own_gpu(monkeypatch):
    """distill's teachers go where the loop puts the student: the GPU of the process's LOCAL_RANK (not cuda:0 in
    every process), or the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_device() == torch.device("cuda", 3)
    monkeypatch.delenv("LOCAL_RANK")
    assert local_device() == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert local_device() == torch.device("cpu")


# ---------------------------------------------------------------------------------------------------------------
# batches
# ---------------------------------------------------------------------------------------------------------------
def test_each_process_gets_a_full_slice_of_a_full_batch():
    """72 items, batch 8, 2 processes: 4 global batches of 16 and a short one of 8, which length grouping shuffles
    anywhere; every process gets 8 items of each of the 4 full batches, the two slices of a batch disjoint."""
    lengths = [3 + i % 11 for i in range(72)]
    short_not_last = 0
    for epoch in range(6):
        batches = epoch_batches(72, 16, seed=0, epoch=epoch, lengths=lengths)
        short_not_last += len(batches[-1]) == 16
        full = [b for b in batches if len(b) == 16]
        slices = [process_batches(batches, 8, 2, rank) for rank in (0, 1)]
        assert all(len(s) == 4 and all(len(b) == 8 for b in s) for s in slices)
        assert [sorted(a + b) for a, b in zip(*slices)] == [sorted(b) for b in full]
    assert short_not_last  # the case where keeping the first 4 batches would keep the short one
    assert process_batches(batches, 16, 1, 0) == batches  # one process keeps every batch


# ---------------------------------------------------------------------------------------------------------------
# e5-small's first-run conversion
# ---------------------------------------------------------------------------------------------------------------
def test_e5_is_converted_once_when_processes_start_together(tmp_path, monkeypatch):
    """4 callers at once (threads: each takes the file lock through its own file, as processes do): one converts,
    the others wait for it and return the converted directory. The conversion is faked (the real one takes 10 s)."""
    conversions = []

    def fake_write_model_dir(f, out: Path) -> None:
        conversions.append(out)
        time.sleep(0.2)  # the others are past the first "already converted?" check by now
        for name in ("model.safetensors", "tokenizer.json"):
            (out / name).write_text("")

    monkeypatch.setattr(e5, "read", lambda source: None)
    monkeypatch.setattr(e5, "write_model_dir", fake_write_model_dir)
    out, start = tmp_path / "e5-small", threading.Barrier(4)

    def convert(_) -> Path:
        start.wait()
        return e5.convert(source=tmp_path / "e5-small-q4.bin", out_dir=out)

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(convert, range(4))) == [out] * 4
    assert len(conversions) == 1
    assert (out / "model.safetensors").exists() and (tmp_path / ".e5-small.lock").exists()


def test_e5_conversion_needs_no_fcntl(tmp_path, monkeypatch):
    """Windows has no fcntl: the first run's conversion still takes its lock (filelock picks the system's) and
    converts."""
    monkeypatch.setitem(sys.modules, "fcntl", None)  # `import fcntl` raises ImportError, as on Windows
    monkeypatch.setattr(e5, "read", lambda source: None)
    monkeypatch.setattr(e5, "write_model_dir", lambda f, out: [(out / n).write_text("") for n in
                                                               ("model.safetensors", "tokenizer.json")])
    out = tmp_path / "e5-small"
    assert e5.convert(source=tmp_path / "e5-small-q4.bin", out_dir=out) == out
    assert (out / "model.safetensors").exists()
