"""benchmarks/active_learning.py on a small written dataset with the tiny encoder: one curve per strategy, sharing the
seed round; the labelled sets nest, each round adding texts not picked before; random and uncertainty pick different
texts; a rerun skips the rounds done, and a selection made again from the same model is the same."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from zhie import demo
from zhie.data import write_ner_jsonl

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def al():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("active_learning")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture
def curve(al, tmp_path, monkeypatch):
    """Run ``active_learning.main`` with a strategy on 120 written sentences (dev: 30), results in ``tmp_path``; returns
    the run function and the run directory."""
    import common
    import ner

    (tmp_path / "data" / "cluener").mkdir(parents=True)
    write_ner_jsonl(demo.make_corpus(120, seed=1), tmp_path / "data" / "cluener" / "train.json")
    write_ner_jsonl(demo.make_corpus(30, seed=2), tmp_path / "data" / "cluener" / "dev.json")
    monkeypatch.setattr(ner, "DATA", tmp_path / "data")
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    out = tmp_path / "run"

    def run(strategy: str, *extra: str, out: Path = out) -> list[dict]:
        al.main(["--dataset", "cluener", "--strategy", strategy, "--encoder", "tiny", "--sizes", "20,40,60",
                 "--min-steps", "6", "--batch-size", "8", "--evals", "2", "--out", str(out), "--quiet", *extra])
        path = tmp_path / "results" / "active_learning.jsonl"
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    return run, out


def _sets(out: Path, strategy: str) -> list[list[int]]:
    rounds = [out / "round-20", out / strategy / "round-40", out / strategy / "round-60"]
    return [json.loads((r / "labelled.json").read_text())["indices"] for r in rounds]


def test_curves_nest_differ_and_resume(curve):
    run, out = curve
    run("random")
    rows = run("uncertainty")
    assert [(r["strategy"], r["size"], r["round"]) for r in rows] == [
        (s, size, kind) for s in ("random", "uncertainty")
        for size, kind in ((20, "seed"), (40, "selected"), (60, "selected"))]
    assert rows[0]["dev_f1"] == rows[3]["dev_f1"] and rows[0]["share"] == 20 / 120  # one seed round, shared
    assert all(r["epochs"] == 3 and r["teacher_labelled"] == 0 for r in rows)
    assert "uncertainty_picked" in rows[4] and "uncertainty_picked" not in rows[1]
    picks = {}
    for strategy in ("random", "uncertainty"):
        sets = _sets(out, strategy)
        assert [len(s) for s in sets] == [20, 40, 60]
        for before, after in zip(sets, sets[1:]):
            assert after[:len(before)] == before and len(set(after)) == len(after)  # nested, nothing picked twice
        picks[strategy] = set(sets[1][20:])
    assert _sets(out, "random")[0] == _sets(out, "uncertainty")[0]
    assert picks["random"] != picks["uncertainty"]
    assert not list(out.rglob("checkpoint.pt"))  # a round done keeps its model, not its resumable state

    done = {p: p.stat().st_mtime_ns for p in out.rglob("done.json")}
    chosen = _sets(out, "uncertainty")
    (out / "uncertainty" / "round-60" / "labelled.json").unlink()  # selected again from round 40's model
    again = run("uncertainty")[len(rows):]
    assert {p: p.stat().st_mtime_ns for p in out.rglob("done.json")} == done  # every round skipped
    assert _sets(out, "uncertainty") == chosen
    assert [(r["size"], r["dev_f1"], r["steps"]) for r in again] == [(r["size"], r["dev_f1"], r["steps"])
                                                                      for r in rows[3:]]


def test_sizes_and_epochs(al):
    assert al.sizes_of(al.parse_sizes("200, 500,full"), 4000) == [200, 500, 4000]
    with pytest.raises(SystemExit, match="increasing sizes"):
        al.sizes_of(["500", "200"], 4000)
    with pytest.raises(SystemExit, match="at most the pool"):
        al.sizes_of(["200", "5000"], 4000)

    class Args:
        min_steps, batch_size, evals, seed, save_every = 600, 16, 5, 1, None

    assert [al.epochs_for(n, Args) for n in (200, 500, 1000, 2000, 4000, 10748)] == [48, 20, 10, 5, 3, 3]
    config = al.round_config(200, Args)
    assert (config.epochs, config.eval_every) == (48, 125)  # 48 x 13 = 624 steps: 125, 250, 375, 500, 624
    assert al.round_config(4000, Args).eval_every is None  # 3 epochs: each epoch


def test_later_points_of_a_model_free_curve_without_its_earlier_rounds(curve, tmp_path):
    """--train-sizes: random's round of 60 on a fresh run directory labels the texts that the whole chain labels
    there, and trains only that round; a strategy that needs the model of the round before refuses."""
    run, out = curve
    whole = run("random")
    fresh = tmp_path / "fresh"
    rows = run("random", "--train-sizes", "60", out=fresh)[len(whole):]
    assert [(r["size"], r["round"]) for r in rows] == [(60, "selected")]
    assert _sets(fresh, "random") == _sets(out, "random")
    assert [p.parent.name for p in fresh.rglob("done.json")] == ["round-60"]
    assert rows[0]["dev_f1"] == whole[2]["dev_f1"]  # the same labelled set, seed and settings: the same model
    with pytest.raises(SystemExit, match="uncertainty picks each round's texts with the model"):
        run("uncertainty", "--train-sizes", "60", out=tmp_path / "other")
    with pytest.raises(SystemExit, match="among --sizes"):
        run("random", "--train-sizes", "50", out=tmp_path / "other")


def test_the_report_keeps_rounds_trained_longer_apart(monkeypatch):
    """report.py's learning-curve table: rounds of another --min-steps are a curve of their own beside their strategy,
    not seeds of it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmarks_report", BENCHMARKS / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)

    def line(strategy, size, f1, min_steps=600):
        return {"dataset": "cluener", "strategy": strategy, "seed": 1, "size": size, "pool": 10000,
                "share": size / 10000, "head": "gp", "encoder": "e5-small", "min_steps": min_steps,
                "teacher_labelled": 0, "dev_f1": f1}

    lines = [line("random", 4000, 0.72), line("uncertainty", 4000, 0.74), line("random", 4000, 0.75, 2016)]
    monkeypatch.setattr(report, "campaign", lambda prefix: [])
    monkeypatch.setattr(report, "rows", lambda name: lines if name == "active_learning.jsonl" else [])
    header, _, body = report.active_learning_table().splitlines()[:3]
    assert header.split(" | ")[2:] == ["random", "random, ≥ 2,016 steps", "uncertainty |"]
    assert body.split(" | ")[2:] == ["72.00 (1)", "75.00 (1)", "74.00 (1) |"]
