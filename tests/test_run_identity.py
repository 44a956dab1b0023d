"""What a run is: the default learning rates that `zhie train` resolves (and records), and the identity a checkpoint
keeps, so that a resume never mixes two runs and a finished run is left as it was."""

from __future__ import annotations

import json

import pytest

import zhie
from tests.tiny_models import nested_corpus
from zhie.cli import build_parser
from zhie.data import write_ner_jsonl
from zhie.training import TrainConfig
from zhie.training.checkpoint import claim
from zhie.training.config import config_from_flags, default_lr


def test_the_default_rate_falls_with_the_square_of_the_encoders_width():
    assert default_lr(384) == 2e-4       # e5-small: the rate of the README's tables
    assert default_lr(768) == 5e-5       # BERT-base
    assert default_lr(1024) == 2.8e-5    # a large model
    assert default_lr(128) == 2e-4       # narrower: never above the base rate
    assert default_lr(768, base_lr=2e-5) == 5e-6
    config = TrainConfig().resolved(768)
    assert (config.lr, config.head_lr, config.batch_size) == (5e-5, 5e-4, 16)
    assert TrainConfig(lr=1e-3, head_lr=7e-3).resolved(768) == TrainConfig(lr=1e-3, head_lr=7e-3)
    assert TrainConfig(lr=1e-3).resolved(768).head_lr == 1e-2


def test_zhie_train_sets_no_rate_of_its_own():
    """The CLI leaves the rates and the batch to TrainConfig (one source), as benchmarks/ner.py does."""
    args = build_parser(["train"]).parse_args(["train", "ner", "--train", "t", "--dev", "d", "--out", "o"])
    config = config_from_flags(args)
    assert (config.lr, config.head_lr, config.batch_size) == (None, None, TrainConfig.batch_size) == (None, None, 16)


@pytest.fixture
def data(tmp_path):
    write_ner_jsonl(nested_corpus(24, seed=1), tmp_path / "train.jsonl")
    write_ner_jsonl(nested_corpus(8, seed=2), tmp_path / "dev.jsonl")
    return tmp_path


def fit(data, out="run", **kwargs):
    options = {"head": "gp", "max_length": 32, **kwargs}
    return zhie.fit("ner", data / "train.jsonl", data / "dev.jsonl", out=data / out, encoder="tiny",
                    config=TrainConfig(epochs=1, batch_size=8, seed=0, save_every=1), progress=False, **options)


def test_the_resolved_rates_are_recorded(data):
    fit(data)
    record = json.loads((data / "run" / "best" / "training.json").read_text(encoding="utf-8"))["train_config"]
    assert (record["lr"], record["head_lr"]) == (2e-4, 2e-3)


@pytest.mark.parametrize("change, named", [
    ({"head": "egp"}, "ner.head"),
    ({"max_length": 48}, "ner.max_length"),
    ({"encoder_layers": 1}, "encoder_layers"),
    ({"keep_tokens": "all"}, "keep_tokens"),
])
def test_a_resume_with_other_settings_is_refused_naming_them(data, change, named):
    fit(data)
    with pytest.raises(ValueError, match=rf"(?s)would mix two runs.*{named}.*--no-resume"):
        fit(data, **change)
    fit(data, **change, resume=False)  # starting over is allowed


def test_a_resume_on_changed_data_is_refused(data):
    fit(data)
    write_ner_jsonl(nested_corpus(24, seed=3), data / "train.jsonl")  # same size, other sentences
    with pytest.raises(ValueError, match="data.train: the file's contents changed"):
        fit(data)


def test_a_finished_run_is_left_as_it_was(data):
    first = fit(data)
    card = data / "run" / "best" / "README.md"
    before = (card.read_bytes(), (data / "run" / "best" / "training.json").read_bytes())
    again = fit(data)
    assert (first["session_steps"], again["session_steps"]) == (first["steps"], 0)
    assert again["best"] == first["best"]
    assert (card.read_bytes(), (data / "run" / "best" / "training.json").read_bytes()) == before


def test_a_second_job_on_the_same_out_is_refused_before_it_writes(data):
    with claim(data / "run"):  # another job holds the run directory
        with pytest.raises(ValueError, match="in use: another training process holds its lock"):
            fit(data)
        assert not (data / "run").exists()  # refused before anything was written
    fit(data)  # free again once the other job ends


def test_every_train_config_field_is_a_flag_of_zhie_train_with_its_help():
    """One source: the flags are made from TrainConfig's fields (find_unused_parameters is the task's to set)."""
    from dataclasses import fields

    parser = build_parser(["train"])
    args = parser.parse_args(["train", "ner", "--train", "t", "--dev", "d", "--out", "o", "--save-every", "7",
                              "--weight-decay", "0", "--optimizer", "lamb", "--report-to", "none"])
    config = config_from_flags(args)
    assert (config.save_every, config.weight_decay, config.optimizer, config.report_to) == (7, 0.0, "lamb", ())
    flags = {f.name for f in fields(TrainConfig)} - {"find_unused_parameters"}
    assert flags <= set(vars(args))


def test_config_toml_reruns_the_run_and_flags_override_it(data, capsys):
    from zhie.cli import main

    common = ["--train", str(data / "train.jsonl"), "--dev", str(data / "dev.jsonl"), "--encoder", "tiny",
              "--max-length", "32", "--epochs", "1", "--batch-size", "8", "--seed", "3", "--quiet"]
    assert main(["train", "ner", *common, "--out", str(data / "a"), "--head", "egp", "--lr", "1e-3"]) == 0
    config = data / "a" / "config.toml"
    assert main(["train", "--config", str(config), "--out", str(data / "b")]) == 0
    assert main(["train", "--config", str(config), "--out", str(data / "c"), "--head", "gp"]) == 0
    first, again, other = (json.loads((data / d / "best" / "training.json").read_text(encoding="utf-8"))
                           for d in "abc")
    assert again["train_config"] == first["train_config"] and again["train_config"]["lr"] == 1e-3
    assert again["dev"] == first["dev"]  # the same run again
    assert (first["options"]["head"], again["options"]["head"], other["options"]["head"]) == ("egp", "egp", "gp")
    (data / "bad.toml").write_text('task = "ner"\nheads = "gp"\n[training]\nlr = 1e-3\n', encoding="utf-8")
    assert main(["train", "--config", str(data / "bad.toml"), "--out", str(data / "d")]) == 2
    assert "heads: not a setting of zhie train ner" in capsys.readouterr().err


def test_a_lock_released_by_one_job_cannot_be_held_by_two_others(tmp_path):
    """A job that opened the lock file just before the holder let go, and a third job that claims the directory
    after: they lock one file, so only one of them holds it (a lock file removed on release would give each its
    own file, and both the directory)."""
    import fcntl
    import os

    out = tmp_path / "run"
    with claim(out):
        late = os.open(out.with_name(".run.lock"), os.O_RDWR)  # the second job, between its open and its lock
    try:
        with claim(out):  # the third job
            with pytest.raises(BlockingIOError):
                fcntl.flock(late, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(late)


def _hold_and_check(out: str, rounds: int, clashes) -> None:
    """One of several processes racing for ``out``: each time it holds the lock, no other may be inside."""
    import os
    import time

    inside = f"{out}.inside"
    for _ in range(rounds):
        try:
            with claim(out):
                try:
                    os.close(os.open(inside, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    clashes.value += 1
                    continue
                time.sleep(0.0005)
                os.unlink(inside)
        except ValueError:  # refused: another holds it
            pass


def test_processes_racing_for_one_run_directory_never_hold_it_together(tmp_path):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    clashes = ctx.Value("i", 0)
    jobs = [ctx.Process(target=_hold_and_check, args=(str(tmp_path / "run"), 300, clashes)) for _ in range(3)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(120)
    assert [job.exitcode for job in jobs] == [0, 0, 0] and clashes.value == 0


def test_a_run_started_over_leaves_no_model_of_the_old_one(data, monkeypatch):
    """``--no-resume`` (resume=False): until the new run saves its first model, ``best/`` holds none, never the old
    run's under the new run's config.toml."""
    from zhie.training import session

    fit(data)
    assert (data / "run" / "best").is_dir()

    def crash(self, *args, **kwargs):
        raise RuntimeError("stopped before the first evaluation")

    monkeypatch.setattr(session.Session, "loop", crash)
    with pytest.raises(RuntimeError, match="before the first evaluation"):
        fit(data, head="egp", resume=False)
    assert not (data / "run" / "best").exists() and not (data / "run" / "checkpoint.pt").exists()
