"""Runs killed with SIGKILL, and saves that do not fit on the disk (issue 51).

Each job (``zhie train``, ``zhie distill student``, ``zhie pretrain``) runs as a process of its own
(``tests/crash_worker.py``) that is killed at chosen moments: in the middle of a checkpoint's write, between the two
renames of a directory's replacement, after the last checkpoint but before the model's card is complete. The same
command then resumes it, and its last run must end with the weights, records and card of a run that was never
interrupted, with no temporary file left behind. ``benchmarks/crash.py`` does the same at random moments, many times.
A save that does not fit (a file-size limit, as a full disk) must stop the command with one clear line and exit 2,
keeping the last best model and checkpoint as they were.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import zhie
from zhie.data import write_ner_jsonl
from zhie.training import TrainConfig

from .tiny_models import nested_corpus, paragraphs

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGKILL and RLIMIT_FSIZE are POSIX")

WORKER = Path(__file__).with_name("crash_worker.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # the same bits in every process
TEMPORARY = re.compile(r"^\..+\.(tmp|old)$")  # zhie.core.files' temporary names
CLOCK = ("elapsed_s", "tokens_per_s", "saved", "finished")
BERT = "new:bert:layers=1,hidden=32,heads=2,intermediate=64"


def zhie_process(moment: str, args: list, cwd: Path) -> subprocess.CompletedProcess:
    """``zhie ARGS`` in a process of its own, killed at ``moment`` (:mod:`tests.crash_worker`)."""
    return subprocess.run([sys.executable, str(WORKER), moment, *map(str, args)], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300)


def killed(moment: str, args: list, cwd: Path) -> None:
    done = zhie_process(moment, args, cwd)
    assert done.returncode == -signal.SIGKILL, f"not killed at {moment} (exit {done.returncode}): {done.stderr[-3000:]}"


def finished(args: list, cwd: Path) -> None:
    done = zhie_process("none", args, cwd)
    assert done.returncode == 0, done.stderr[-3000:]


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if TEMPORARY.match(p.name))


def untimed(value):
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k not in CLOCK}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def step(out: Path) -> int:
    return torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)["progress"]["step"]


def tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    found = {f"{f.name}:{k}": v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert found, f"no weights in {model_dir}"
    return found


def assert_same_run(ref: Path, out: Path, model: str = "best") -> None:
    """``out`` holds the run that ``ref`` holds, bit for bit (clock times aside), and nothing temporary."""
    a, b = tensors(ref / model), tensors(out / model)
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []
    ca, cb = (torch.load(d / "checkpoint.pt", map_location="cpu", weights_only=True) for d in (ref, out))
    assert ca["progress"]["step"] == cb["progress"]["step"] and cb["progress"]["finished"]
    assert [k for k in ca["model"] if not torch.equal(ca["model"][k], cb["model"][k])] == []
    sa, sb = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])
    records = [untimed([json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()])
               for d in (ref, out)]
    assert records[0] == records[1]
    for name in ("best/training.json", "pretrain.json"):  # the command line is the worker's, with its moment
        if (ref / name).exists():
            a, b = ({k: v for k, v in untimed(json.loads((d / name).read_text(encoding="utf-8").replace(str(d), "OUT")))
                     .items() if k != "command"} for d in (ref, out))
            assert a == b, name
    assert leftovers(out.parent) == []


@pytest.fixture
def ner_data(tmp_path) -> Path:
    write_ner_jsonl(nested_corpus(24, seed=1), tmp_path / "train.jsonl")
    write_ner_jsonl(nested_corpus(8, seed=2), tmp_path / "dev.jsonl")
    return tmp_path


def train_args(data: Path, out: str, **flags) -> list:
    flags = {"epochs": 2, "batch_size": 8, "eval_every": 2, "save_every": 1, "log_every": 2, **flags}
    return ["train", "ner", "--train", data / "train.jsonl", "--dev", data / "dev.jsonl", "--encoder", "tiny",
            "--head", "gp", "--max-length", 32, "--seed", 0, "--quiet", "--out", data / out,
            *[x for k, v in flags.items() for x in (f"--{k.replace('_', '-')}", v)]]


# ------------------------------------------------------------------------------------------------------ kills
def test_a_training_killed_mid_checkpoint_mid_swap_and_before_its_card_ends_as_if_never_killed(ner_data):
    """6 steps, an evaluation every 2 (best/ at 2, and at 4, where F1 rises), a checkpoint every step."""
    finished(train_args(ner_data, "ref"), ner_data)
    args, run = train_args(ner_data, "run"), ner_data / "run"

    killed("writing:3", args, ner_data)  # half of the third checkpoint written under its temporary name
    assert step(run) == 2 and len(list(run.glob(".checkpoint.pt.*.tmp"))) == 1
    killed("swap:1", args, ner_data)  # resumed at 2; at 4, best/ renamed away, the new one not yet in place
    assert step(run) == 3 and not (run / "best").exists() and (run / ".best.old" / "model.safetensors").exists()
    assert not list(run.glob(".checkpoint.pt.*")), "the killed write's temporary file was left"
    killed("finish", args, ner_data)  # the last checkpoint written, the card not yet completed
    assert step(run) == 6 and "run" not in json.loads((run / "best" / "training.json").read_text())
    finished(args, ner_data)
    assert_same_run(ner_data / "ref", run)


def test_a_distillation_killed_mid_checkpoint_and_before_its_card_ends_as_if_never_killed(ner_data):
    teacher = ner_data / "teacher"
    zhie.fit("ner", ner_data / "train.jsonl", ner_data / "dev.jsonl", out=teacher, encoder="tiny", head="gp",
             max_length=32, config=TrainConfig(epochs=1, batch_size=8, seed=0), progress=False)
    (ner_data / "unlabelled.txt").write_text("".join(ex.text + "\n" for ex in nested_corpus(16, seed=7)),
                                             encoding="utf-8")

    def args(out: str) -> list:
        return ["distill", "student", "--teacher", teacher / "best", "--train", ner_data / "train.jsonl", "--dev",
                ner_data / "dev.jsonl", "--unlabelled", ner_data / "unlabelled.txt", "--encoder-layers", 1,
                "--epochs", 2, "--batch-size", 8, "--lr", "2e-3", "--eval-every", 2, "--save-every", 1,
                "--log-every", 2, "--seed", 0, "--quiet", "--out", ner_data / out]

    finished(args("ref"), ner_data)
    run = ner_data / "run"
    killed("writing:3", args("run"), ner_data)
    assert step(run) == 2 and (run / "teacher" / "targets.pt").exists()
    killed("finish", args("run"), ner_data)  # resumed from the stored teacher outputs and step 2
    finished(args("run"), ner_data)
    assert_same_run(ner_data / "ref", run)


def test_a_pretraining_killed_between_renames_and_mid_snapshot_ends_as_if_never_killed(tmp_path):
    """A snapshot every 2 steps; the output directory is replaced as a whole at each."""
    (tmp_path / "corpus.txt").write_text("".join(p + "\n" for p in paragraphs(120, seed=6)), encoding="utf-8")

    def args(out: str) -> list:
        return ["pretrain", "--corpus", tmp_path / "corpus.txt", "--encoder", BERT, "--steps", 6, "--batch-size",
                4, "--max-length", 64, "--heldout", 20, "--shuffle-buffer", 16, "--lr", "1e-3", "--eval-every", 3,
                "--save-every", 2, "--log-every", 2, "--seed", 0, "--quiet", "--out", tmp_path / out / "encoder"]

    finished(args("ref"), tmp_path)
    run = tmp_path / "run" / "encoder"
    killed("swap:1", args("run"), tmp_path)  # at step 4: the snapshot of step 2 renamed away, step 4's not in place
    assert not run.exists() and step(run.with_name(".encoder.old")) == 2
    killed("writing:1", args("run"), tmp_path)  # step 2's put back; step 4's written whole, not renamed into place
    assert step(run) == 2 and len(list(run.parent.glob(".encoder.*.tmp"))) == 1
    finished(args("run"), tmp_path)
    assert_same_run(tmp_path / "ref" / "encoder", run, model=".")


# --------------------------------------------------------------------------------------------------- no room
def test_a_save_that_does_not_fit_stops_clearly_and_keeps_the_last_model_and_checkpoint(ner_data):
    """A file-size limit (as a full disk) below best/'s weights, then between them and the checkpoint's size: one line
    naming what was not written and what to do, exit 2, and best/ and checkpoint.pt as they were; the same command
    then finishes the run once there is room."""
    args, run = train_args(ner_data, "run", eval_every=3, save_every=3), ner_data / "run"
    killed("saved:3", args, ner_data)  # best/ of the evaluation at 3, the checkpoint of step 3
    before = (tensors(run / "best"), (run / "checkpoint.pt").read_bytes())
    weights, checkpoint = (run / "best" / "model.safetensors").stat().st_size, len(before[1])
    others = [f.stat().st_size for f in run.rglob("*") if f.is_file() and f.name not in ("model.safetensors",
                                                                                        "checkpoint.pt")]
    assert max(others) * 2 < weights < checkpoint

    for limit, what in ((weights // 2, "best"), ((weights + checkpoint) // 2, "checkpoint.pt")):
        done = zhie_process(f"fsize:{limit}", args, ner_data)  # at 6 F1 rises: best/ is saved, then the checkpoint
        assert done.returncode == 2, done.stderr[-3000:]
        assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"zhie: error: {run / what}: not written: a file would exceed the file-size "
                                      "limit"), done.stderr
        assert done.stderr.rstrip().endswith(f"run the command again: it resumes the run at step 3, from "
                                             f"{run / 'checkpoint.pt'}"), done.stderr
        assert (run / "checkpoint.pt").read_bytes() == before[1]
        if what == "best":
            now = tensors(run / "best")
            assert all(torch.equal(now[k], before[0][k]) for k in before[0])
        assert leftovers(ner_data) == []
        assert zhie.load(run / "best").predict(["王伟在青山市的远华大学工作。"])  # loads and predicts
    finished(args, ner_data)
    assert step(run) == 6


def test_a_record_that_does_not_fit_leaves_no_part_of_a_line(tmp_path, monkeypatch):
    """metrics.jsonl on a disk that fills in the middle of a line: the line is cut off again, and the error says
    what was not written."""
    import errno

    from zhie.core.files import NoRoom
    from zhie.training.report import append_jsonl, read_metrics

    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, {"kind": "step", "step": 1})
    write = os.write

    def filling(fd: int, data) -> int:
        if len(data) > 8:
            return write(fd, bytes(data[:8]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", filling)
    with pytest.raises(NoRoom, match="no space left on the device") as raised:
        append_jsonl(path, {"kind": "step", "step": 2, "loss": 1.5})
    monkeypatch.undo()
    assert raised.value.filename == str(path) and raised.value.errno == errno.ENOSPC
    assert read_metrics(path, kind=None) == [{"kind": "step", "step": 1}]
