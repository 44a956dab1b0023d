"""``benchmarks/forgetting.py`` (issue 52) end to end on a tiny written CLUENER-format corpus with the ``tiny`` encoder:
old -> extend -> naive -> eval, each step its own process as a campaign row runs it, the result lines' shape, a step
that is done not run again, and ``benchmarks/report.py``'s forgetting table made from the lines."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import zhie
from zhie.training import TrainConfig

from .tiny_models import nested_corpus

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "forgetting.py"
TINY = ["--encoder", "tiny", "--epochs", "2", "--max-length", "48", "--batch-size", "16", "--lr", "1e-3",
        "--head-lr", "1e-3", "--seed", "3", "--save-every", "3", "--new-types", "ORG", "--quiet"]


def write_cluener(examples, path: Path) -> None:
    """``examples`` as CLUENER writes them: ``{"text", "label": {type: {mention: [[start, end inclusive], ...]}}}``."""
    lines = []
    for ex in examples:
        label: dict = {}
        for s in ex.spans:
            label.setdefault(s.label, {}).setdefault(ex.text[s.start:s.end], []).append([s.start, s.end - 1])
        lines.append(json.dumps({"text": ex.text, "label": label}, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def step(tmp_path: Path, *flags: str) -> list[dict]:
    """Run the benchmark with ``flags`` (its data, results and machine lock under ``tmp_path``); the lines it added."""
    results = tmp_path / "results" / "forgetting.jsonl"
    before = len(results.read_text(encoding="utf-8").splitlines()) if results.exists() else 0
    env = {**os.environ, "ZHIE_DATA": str(tmp_path / "data"), "ZHIE_RESULTS": str(tmp_path / "results"),
           "ZHIE_CAMPAIGN_DIR": str(tmp_path / "campaign"), "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()[before:]]


def test_old_extend_naive_eval_write_their_lines_and_the_table(tmp_path):
    cluener = tmp_path / "data" / "ner" / "cluener"
    cluener.mkdir(parents=True)
    write_cluener(nested_corpus(96, seed=21), cluener / "train.json")
    write_cluener(nested_corpus(32, seed=22), cluener / "dev.json")
    every = tmp_path / "every-type"  # the model of all the types at once
    zhie.fit("ner", cluener / "train.json", cluener / "dev.json", out=every, encoder="tiny", head="gp", max_length=48,
             config=TrainConfig(epochs=2, batch_size=16, lr=1e-3, head_lr=1e-3, seed=3), progress=False)
    out = tmp_path / "run"
    lines = {}
    for name in ("old", "extend", "naive"):
        (lines[name],) = step(tmp_path, "--step", name, "--out", str(out), *TINY)
    (lines["predictions"],) = step(tmp_path, "--step", "extend", "--old-types", "predictions", "--out", str(out), *TINY)
    (lines["slow"],) = step(tmp_path, "--step", "extend", "--out", str(out), *TINY, "--extend-lr", "2e-4")
    old = lines["old"]
    assert (old["step"], old["old_types"], old["new_types"], old["from"]) == ("old", ["LOC", "PER"], ["ORG"], None)
    assert old["train_texts"] == 96 and len(old["f1_per_epoch"]) == 2 and 0 <= old["dev_f1"] <= 1
    for name in ("extend", "naive", "predictions", "slow"):  # the same 96 texts, labelled for ORG only, from it
        line = lines[name]
        assert line["train_texts"] == 96 and line["from"] == str(out / "old" / "best")
        assert line["dev"].endswith("cluener/dev.json") and {"machine", "date", "command", "run"} <= line.keys()
    assert lines["extend"]["teacher_targets"] and not lines["naive"]["teacher_targets"]
    assert (lines["extend"]["old_targets"], lines["predictions"]["old_targets"]) == ("model", "predictions")
    assert lines["predictions"]["teacher_targets"] and lines["predictions"]["run"] == lines["extend"]["run"]
    assert (out / "extend-predictions" / "best").is_dir()  # a directory of its own beside extend/
    assert (out / "extend-lr0.0002" / "best").is_dir() and (lines["slow"]["lr"], lines["extend"]["lr"]) == (2e-4, 1e-3)
    assert lines["slow"]["head_lr"] == 1e-3  # --head-lr as given
    assert lines["extend"]["train_spans"] == lines["naive"]["train_spans"] < old["train_spans"]
    assert zhie.load(out / "naive" / "best").task.config.labels == ["LOC", "PER", "ORG"]

    again = step(tmp_path, "--step", "extend", "--out", str(out), *TINY)  # done: not trained again, the same line
    assert again == [lines["extend"]]

    evaluated = step(tmp_path, "--step", "eval", "--out", str(out), "--all-types", str(every), "--new-types", "ORG",
                     "--variant", f"slow={out / 'extend-lr0.0002' / 'best'}", "--quiet")
    assert [e["model"] for e in evaluated] == ["old", "extend", "extend-predictions", "naive", "all-types", "slow"]
    assert evaluated[-1]["trained"]["lr"] == 2e-4 and evaluated[1]["trained"]["lr"] == 1e-3
    for e in evaluated:
        assert set(e["per_type"]) <= {"LOC", "ORG", "PER"} and {"LOC", "PER"} <= set(e["per_type"])
        for figures in (*e["per_type"].values(), e["old_micro"], e["new_micro"], e["all_micro"]):
            assert {"precision", "recall", "f1"} <= figures.keys() and 0 <= figures["f1"] <= 1
        assert e["trained"]["seed"] == 3
    assert evaluated[0]["types"] == ["LOC", "PER"] and evaluated[0]["new_micro"]["f1"] == 0.0
    assert evaluated[1]["types"] == ["LOC", "PER", "ORG"]

    spec = importlib.util.spec_from_file_location("benchmarks_report", ROOT / "benchmarks" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    made = report.forgetting_table([*lines.values(), *evaluated]).splitlines()
    assert len(made) == 2 + 6 and made[0].startswith("| model |"), made
    assert made[5].startswith("| `slow`: extended at lr 0.0002 (head 0.001), 2 epochs | 3 |"), made  # before naive
    assert "naive" in made[6] and "at once" in made[7]
    elsewhere = [{**e, "run": str(tmp_path / "another-eval")} for e in (evaluated[0], evaluated[-2])]
    apart = report.forgetting_table([evaluated[1], *elsewhere])  # one seed's evaluations, in two runs: one block
    assert apart.splitlines()[2:] == [made[2], made[3], made[-1]], apart
    assert "all 3 at once" in made[-1] and made[-1].endswith("| – |")
    assert not report.forgetting_table([]).startswith("|")  # no evaluation, no table


def test_bad_variants_are_refused(tmp_path):
    env = {**os.environ, "ZHIE_RESULTS": str(tmp_path / "results"), "ZHIE_CAMPAIGN_DIR": str(tmp_path / "campaign"),
           "PYTHONPATH": str(ROOT / "src")}
    for flags, message in ((["--step", "eval", "--variant", "slow"], "--variant slow: give NAME=MODEL_DIR"),
                           (["--step", "eval", "--variant", "naive=x"], "naive is named twice"),
                           (["--step", "eval", "--variant", "a=x", "--variant", "a=y"], "a is named twice"),
                           (["--step", "naive", "--extend-lr", "1e-5"], "--extend-lr is an option of --step extend"),
                           (["--step", "old", "--variant", "a=x"], "--variant is an option of --step eval")):
        run = subprocess.run([sys.executable, str(SCRIPT), *flags, "--out", str(tmp_path / "run")],
                             capture_output=True, text=True, env=env, timeout=120)
        assert run.returncode in (1, 2) and message in run.stderr, (flags, run.stderr)
    assert not (tmp_path / "run" / "eval").exists() and not (tmp_path / "results").exists()


def test_old_types_is_refused_outside_the_extend_step(tmp_path):
    env = {**os.environ, "ZHIE_RESULTS": str(tmp_path / "results"), "ZHIE_CAMPAIGN_DIR": str(tmp_path / "campaign"),
           "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run([sys.executable, str(SCRIPT), "--step", "naive", "--old-types", "predictions", "--out",
                          str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2 and "--old-types predictions is an option of --step extend" in run.stderr, run.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "results").exists()
