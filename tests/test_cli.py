"""The ``zhie`` command's errors (one line for bad input, a bug said to be one, the traceback with ``--debug``, exit
statuses 2, 1 and 130) and what it shows of the library's logging."""

from __future__ import annotations

import json
import logging

import pytest

import zhie
from tests.tiny_models import nested_corpus
from zhie import cli
from zhie.cli import main
from zhie.data import write_ner_jsonl
from zhie.training import TrainConfig


def test_bad_input_is_one_line_and_debug_adds_the_traceback(tmp_path, capsys):
    missing = str(tmp_path / "missing")
    assert main(["predict", missing, "北京"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zhie: error: ") and missing in err and len(err.splitlines()) == 1, err
    for flag in ("--debug", "--verbose"):
        assert main([flag, "predict", missing, "北京"]) == 2
        lines = capsys.readouterr().err.splitlines()
        assert lines[0] == "Traceback (most recent call last):" and lines[-1].startswith("zhie: error: "), lines
        assert missing in lines[-1]


@pytest.mark.parametrize("debug", [False, True])
def test_an_unexpected_error_is_called_a_bug(debug, monkeypatch, capsys):
    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.setitem(cli.COMMANDS, "export", broken)
    assert main([*(["--debug"] if debug else []), "export", "model", "--out", "out"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("zhie: error: unexpected RuntimeError: boom. This is a bug in zhie; please report it")
    if debug:
        assert lines[0] == "Traceback (most recent call last):" and 'raise RuntimeError("boom")' in "\n".join(lines)
    else:
        assert len(lines) == 1 and "zhie --debug" in lines[0]


def test_an_interrupted_command_says_so(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "export", interrupted)
    assert main(["export", "model", "--out", "out"]) == 130
    assert capsys.readouterr().err == "zhie: interrupted\n"


def test_the_library_logs_and_the_command_shows_it_on_stderr(tmp_path, capsys, caplog):
    """``zhie.fit`` logs its data summary (logger ``zhie.training.fit``), printing nothing; ``zhie train`` shows it on
    stderr, and its stdout is the result alone."""
    data = tmp_path / "train.jsonl"
    write_ner_jsonl(nested_corpus(8, seed=1), data)
    with caplog.at_level(logging.INFO, logger="zhie"):
        zhie.fit("ner", data, data, out=tmp_path / "lib", encoder="tiny", head="gp", max_length=32,
                 config=TrainConfig(max_steps=1, batch_size=8), resume=False, progress=True)
    (summary,) = [r for r in caplog.records if r.name == "zhie.training.fit"]
    assert json.loads(summary.getMessage())["examples"] == 8
    assert capsys.readouterr().out == ""

    assert main(["train", "ner", "--train", str(data), "--dev", str(data), "--encoder", "tiny", "--head", "gp",
                 "--max-length", "32", "--max-steps", "1", "--batch-size", "8", "--out", str(tmp_path / "cli")]) == 0
    out, err = capsys.readouterr()
    assert list(json.loads(out)) == ["best", "best_step", "model"]  # one line: the result
    assert '"examples": 8' in err


def test_debug_goes_before_the_command_and_keeps_train_config(tmp_path, capsys):
    """``zhie --debug train --config FILE``: the run's config file is read as without --debug."""
    missing = tmp_path / "config.toml"
    assert main(["--debug", "train", "--config", str(missing)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1].startswith(f"zhie: error: --config {missing}: no such file; give a TOML file")


@pytest.mark.parametrize("own", [None, "2"])
def test_the_command_starts_one_openblas_thread_unless_the_user_says_otherwise(own, monkeypatch):
    """numpy's OpenBLAS starts a thread per core at import; the command needs one (its models have their own)."""
    pytest.importorskip("threadpoolctl")
    import subprocess
    import sys

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    if own is not None:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", own)
    code = ("import zhie.cli, numpy, threadpoolctl; "
            "print([i['num_threads'] for i in threadpoolctl.threadpool_info() if i['internal_api'] == 'openblas'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [int(own or 1)]  # on a machine of 2 cores or more, OpenBLAS would start 2
