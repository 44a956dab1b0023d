"""benchmarks/campaign.py: a plan of two tiny training runs, the second killed mid-training with its runner (as at
the end of a session) and resumed by the next ``run``, gives the same rows as the plan run without a break, with no
path of the machine in them."""

from __future__ import annotations

import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = ROOT / "benchmarks" / "campaign.py"

ROW = '''
import json, os, sys
from pathlib import Path

import zhie
from zhie import demo
from zhie.data import write_ner_jsonl
from zhie.training import TrainConfig
from zhie.training.report import read_metrics

n, out = int(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
write_ner_jsonl(demo.make_corpus(n, seed=1), out / "train.jsonl")
write_ner_jsonl(demo.make_corpus(20, seed=2), out / "dev.jsonl")
checkpoint = out / "run" / "checkpoint.pt"
if checkpoint.exists():
    import torch
    print("resumed at step", torch.load(checkpoint, weights_only=False)["progress"]["step"], file=sys.stderr)
config = TrainConfig(epochs=3, batch_size=4, lr=2e-3, head_lr=2e-3, seed=int(sys.argv[4]), save_every=1)
result = zhie.fit("ner", out / "train.jsonl", out / "dev.jsonl", out=out / "run", encoder="tiny", head="gp",
                  max_length=32, config=config, resume=True, progress=False)
history = read_metrics(out / "run" / "metrics.jsonl")
row = {"n": n, "best": result["best"], "steps": result["steps"], "losses": [h["train_loss"] for h in history],
       "out": str(out), "script": str(Path(__file__).resolve())}
results = Path(os.environ["ZHIE_RESULTS"])
with (results / "tiny.jsonl").open("a") as f:
    f.write(json.dumps(row) + "\\n")
'''


def _repo(path: Path) -> Path:
    """A git repository holding the row script, and a plan of two rows at its commit."""
    path.mkdir()
    (path / "benchmarks").mkdir()
    (path / "benchmarks" / "row.py").write_text(ROW)
    git = ["git", "-C", str(path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "rows"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    rows = [("tiny/short", 12, 1), ("tiny/long", 80, 2)]
    (path / "plan.toml").write_text(f'commit = "{commit}"\n' + "".join(
        f'\n[[row]]\nkey = "{key}"\ncommand = "{{python}} benchmarks/row.py {n} {{run_dir}} --seed {seed}"\n'
        f"estimate_cpu_min = 1\n" for key, n, seed in rows))
    return path


def _runner(repo: Path, work: Path, action: str = "run") -> list[str]:
    return [sys.executable, str(CAMPAIGN), action, "--plan", str(repo / "plan.toml"), "--results",
            str(work / "campaign.jsonl"), "--dir", str(work / "dir"), "--repo", str(repo)]


def _rows(work: Path) -> list[dict]:
    """The finished rows without what depends on the clock."""
    lines = [json.loads(line) for line in (work / "campaign.jsonl").read_text().splitlines()]
    clock = ("cpu_s", "cpu_s_complete", "wall_s", "sessions", "load_avg", "finished")
    return [{k: v for k, v in line.items() if k not in clock} for line in lines]


@pytest.mark.skipif(sys.platform != "linux", reason="the runner ties a row's life to its own with prctl (Linux)")
def test_interrupted_plan_resumes_to_the_same_rows(tmp_path):
    repo = _repo(tmp_path / "repo")
    whole, broken = tmp_path / "whole", tmp_path / "broken"

    subprocess.run(_runner(repo, whole), check=True, capture_output=True)

    runner = subprocess.Popen(_runner(repo, broken), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = broken / "dir" / "runs" / "tiny__long" / "run" / "checkpoint.pt"
    deadline = time.time() + 300
    while not checkpoint.exists() and runner.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    runner.send_signal(signal.SIGKILL)  # the session ends: no chance to clean up; the row dies with its runner
    runner.wait()
    time.sleep(1.0)  # the row's process ends on its parent's death (PR_SET_PDEATHSIG)
    state = torch.load(checkpoint, weights_only=False)
    assert not state["progress"]["finished"] and 0 < state["progress"]["step"] < 60, "not stopped mid-training"
    assert [row["key"] for row in _rows(broken)] == ["tiny/short"]
    status = subprocess.run(_runner(repo, broken, "status"), check=True, capture_output=True, text=True).stdout
    assert "1 done, 1 left" in status and "left     tiny/long" in status and "1 session so far" in status

    resumed = subprocess.run(_runner(repo, broken), check=True, capture_output=True, text=True).stderr
    assert f"resumed at step {state['progress']['step']}" in resumed
    assert _rows(broken) == _rows(whole)
    line = json.loads((broken / "campaign.jsonl").read_text().splitlines()[1])
    assert line["sessions"] == 2 and line["seed"] == 2 and not line["cpu_s_complete"]
    # no path of this machine: the run directory as RESULTS.md names it, the script relative to the repository
    assert (line["results"][0]["out"], line["results"][0]["script"]) == ("RUNS/tiny__long", "benchmarks/row.py")
    assert not checkpoint.exists()  # a finished row keeps its model, not its resumable state
    status = subprocess.run(_runner(repo, broken, "status"), check=True, capture_output=True, text=True).stdout
    assert "2 done, 0 left" in status


def test_bad_plan_is_refused_with_its_place(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text('commit = "abc1234"\n[[row]]\nkey = "x"\ncommand = "true"\n[[row]]\nkey = "x"\ncommand = "true"\n')
    done = subprocess.run([sys.executable, str(CAMPAIGN), "status", "--plan", str(plan), "--dir", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and f"{plan}: row 2: key 'x' appears twice" in done.stderr


def test_rows_run_on_a_gpu_are_imported_only_as_the_plan_wrote_them(tmp_path):
    """gpu_campaign.py's lines join campaign.jsonl when their key, commit and command are the plan's (without the
    checkpoints and the pruned e5-small the GPU machine runs with), its directories named as here (``RUNS/``); a
    row that failed or is already in stays out;
    anything else is refused with its line, and nothing is appended."""
    commit = "a" * 40
    command = "{python} benchmarks/ner.py --quiet --out {run_dir} --save-every 100 --dataset cluener --head egp"
    plan = tmp_path / "plan.toml"
    plan.write_text(f'commit = "{commit}"\n' + "".join(
        f'[[row]]\nkey = "c/x/s{seed}"\ncommand = "{command} --seed {seed}"\n' for seed in (1, 2, 3)) +
        '[[row]]\nkey = "g/y"\ncommand = "{python} benchmarks/export.py --model m"\n')
    results = tmp_path / "campaign.jsonl"
    results.write_text(json.dumps({"key": "c/x/s3", "cpu_s": 60.0, "commit": commit}) + "\n")
    listed = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(CAMPAIGN.parent)!r}); "
                             f"import campaign; print(campaign.gpu_rows(campaign.Path({str(plan)!r}), "
                             f"campaign.Path({str(results)!r}), None))"], capture_output=True, text=True).stdout
    device = "benchmarks/ner.py --quiet --out '{run_dir}' --dataset cluener --head egp --seed %d"
    assert listed.strip() == str([(f"c/x/s{s}", commit, device % s) for s in (1, 2)])  # not s3 (done), not export

    def ran(seed, rc=0, command=None, at=commit):
        ran_as = f"python benchmarks/ner.py --out /gpu/runs/c__x__s{seed} --encoder /gpu/runs/e5-small-pruned"
        row = [{"machine": "NVIDIA H100 80GB HBM3", "dev_f1": 0.7, "teachers": [f"/gpu/runs/c__x__s{seed}/best"],
                "command": ran_as}]
        return {"key": f"c/x/s{seed}", "commit": at, "rc": rc, "wall_s": 300, "parallel": 16, "runs": "/gpu/runs",
                "command": command or device % seed, "results": row if rc == 0 else []}

    def import_(*lines):
        (tmp_path / "gpu_rows.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        return subprocess.run([sys.executable, str(CAMPAIGN), "import", str(tmp_path / "gpu_rows.jsonl"), "--plan",
                               str(plan), "--results", str(results)], capture_output=True, text=True)

    before = results.read_text()
    for bad, says in [(ran(1, command=(device % 1).replace("egp", "gp")), "ran `benchmarks/ner.py"),
                      (ran(1, at="b" * 40), "at bbbbbbbbbb, the plan says"),
                      ({**ran(1), "key": "c/y/s1"}, "no row of the plan has this key"),
                      ({"key": "c/x/s1"}, "no command, commit, rc, results, wall_s")]:
        done = import_(ran(2), bad)
        assert done.returncode == 2 and f"gpu_rows.jsonl: line 2 ({bad['key']}): " in done.stderr
        assert says in done.stderr
        assert results.read_text() == before
    done = import_(ran(1), ran(2, rc=1), ran(3))
    assert done.returncode == 0 and "1 rows appended" in done.stdout
    assert "line 2 (c/x/s2): exit 1, skipped" in done.stderr and "line 3 (c/x/s3): already in" in done.stderr
    line = json.loads(results.read_text().splitlines()[-1])
    assert (line["key"], line["seed"], line["command"], line["device"], line["cpu_s"]) == (
        "c/x/s1", 1, f"{command} --seed 1", "NVIDIA H100 80GB HBM3", None)
    # the GPU machine's directories named as this machine's rows name theirs
    assert line["device_command"] == "python benchmarks/ner.py --out RUNS/c__x__s1 --encoder .gpu-pack/e5-small-pruned"
    assert line["results"][0]["teachers"] == ["RUNS/c__x__s1/best"]
    status = subprocess.run([sys.executable, str(CAMPAIGN), "status", "--plan", str(plan), "--results", str(results),
                             "--dir", str(tmp_path)], capture_output=True, text=True).stdout
    assert "done     c/x/s1  (5 min on NVIDIA H100 80GB HBM3" in status and "left     c/x/s2" in status


def _benchmark(name: str):
    """The module ``benchmarks/<name>.py``, imported in-process (the scripts import their siblings by name)."""
    sys.path.insert(0, str(CAMPAIGN.parent))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(CAMPAIGN.parent))


STAGED = '''
import os, sys, time
from pathlib import Path

words = sys.argv
out = Path(words[words.index("--out") + 1])
if "--save-every" in words:  # a training's resumable state, which a finished row must not keep
    (out / "model").mkdir(exist_ok=True)
    (out / "model" / "checkpoint.pt").touch()
with Path(os.environ["ZHIE_RESULTS"], "rows.jsonl").open("a") as results:
    (out / "stage1").touch()  # a finished stage: its line is written again by every run, as mtmt.py's are
    results.write('{"stage": 1}\\n')
    results.flush()
    if not (out / "stage2").exists():  # no checkpoint of stage 2 to resume from
        if "--save-every" in words:
            (out / "stage2").touch()
        time.sleep(30)
    results.write('{"stage": 2}\\n')
'''


def test_a_gpu_row_cut_by_the_time_limit_resumes_only_with_save_every(tmp_path, monkeypatch):
    """gpu_campaign.py starts a cut row afresh at the next call, unless rows checkpoint (``--save-every``): then it
    resumes in its directory, and the row's results are those of the call that finished it, each line once; a
    finished row's checkpoints are removed."""
    gpu_campaign = _benchmark("gpu_campaign")
    (tmp_path / "carry" / "tree").mkdir(parents=True)
    (tmp_path / "carry" / "tree" / "staged.py").write_text(STAGED)
    monkeypatch.setattr(gpu_campaign, "CARRY", tmp_path / "carry")
    monkeypatch.setenv("ZHIE_DATA", str(tmp_path))
    runs = tmp_path / "runs"

    def call(save_every):
        gpu_campaign.run_row("b/x/s1", "staged.py --out '{run_dir}'", runs, tmp_path / "enc", "c" * 40, 1,
                             time.time() + 3, save_every)
        done = runs / "b__x__s1" / "done.json"
        return done.exists(), (runs / "b__x__s1" / "results" / "rows.jsonl").read_text().splitlines()

    assert call(None) == (False, ['{"stage": 1}'])  # cut in stage 2
    assert call(None) == (False, ['{"stage": 1}'])  # started afresh: cut again
    assert call(5) == (False, ['{"stage": 1}'])  # the first call with checkpoints: cut once more
    assert (runs / "b__x__s1" / "model" / "checkpoint.pt").exists()
    assert call(5) == (True, ['{"stage": 1}', '{"stage": 2}'])  # resumed: finished, each line once
    # a finished row keeps no checkpoint: a student reading it as its teacher would train the teacher again
    assert not (runs / "b__x__s1" / "model" / "checkpoint.pt").exists()
    assert json.loads((runs / "b__x__s1" / "done.json").read_text())["wall_s"] >= 3  # its seconds in both calls


def test_a_gpu_row_that_reads_another_rows_directory_runs_after_it_in_its_chain(tmp_path):
    """gpu_campaign.py's chains: a student that reads its teacher's row directory (``{runs}/KEY/``), and one that
    reuses that student's outputs, run one after another behind the teacher; a later row that reads the teacher runs
    in a chain of its own (and waits); rows that read nothing run side by side;
    a row whose key only begins like another's directory is not chained to it."""
    gpu_campaign = _benchmark("gpu_campaign")
    rows = [("s/pd/teacher/s1", "benchmarks/ner.py --out {run_dir}"),
            ("s/pd/teacher/s10", "benchmarks/ner.py --out {run_dir}"),
            ("s/pd/student/s1",
             "benchmarks/students.py --teacher {runs}/s__pd__teacher__s1/pd-gp/best --out {run_dir}"),
            ("s/pd/conv/s1", "benchmarks/students.py --teacher {runs}/s__pd__teacher__s1/pd-gp/best "
                             "--targets-from {runs}/s__pd__student__s1/student --out {run_dir}")]
    rows.append(("s/pd/ensemble/s1", "benchmarks/students.py --teacher {runs}/s__pd__teacher__s1/pd-gp/best "
                                     "--teacher {runs}/s__pd__teacher__s10/pd-gp/best --out {run_dir}"))
    # a second row that reads the teacher of seed 1, after its chain went on: a chain of its own, beside the student
    rows.append(("s/pd/other/s1",
                 "benchmarks/students.py --teacher {runs}/s__pd__teacher__s1/pd-gp/best --out {run_dir}"))
    chains = [[key for key, _ in chain] for _, chain in gpu_campaign.chains(rows, 20)]
    assert sorted(chains) == [["s/pd/other/s1"], ["s/pd/teacher/s1", "s/pd/student/s1", "s/pd/conv/s1"],
                              ["s/pd/teacher/s10", "s/pd/ensemble/s1"]]
    # ... and before it starts, it waits for the rows of other chains that it reads: none failed, none cut
    keys = [key for key, _ in rows]
    assert gpu_campaign.reads(rows[4][1], keys) == ["s/pd/teacher/s1", "s/pd/teacher/s10"]
    for rc, expected in ((0, True), (1, False)):
        for key in ("s/pd/teacher/s1", "s/pd/teacher/s10"):
            (tmp_path / key.replace("/", "__")).mkdir(exist_ok=True)
            (tmp_path / key.replace("/", "__") / "done.json").write_text(json.dumps({"rc": rc if "s10" in key else 0}))
        assert gpu_campaign.wait_for(gpu_campaign.reads(rows[4][1], keys), tmp_path, time.time() + 1) is expected
    (tmp_path / "s__pd__teacher__s10" / "done.json").unlink()  # still running when time runs out
    assert gpu_campaign.wait_for(["s/pd/teacher/s10"], tmp_path, time.time() + 0.5) is False


def test_active_learning_rows_of_one_strategy_and_seed_run_in_one_chain_on_a_gpu_machine():
    """gpu_campaign.py's chains for active learning's rows, which write their rounds into one directory per dataset
    and seed (``--out {runs}/al-...``): a longer curve of a strategy runs after the shorter one whose rounds it
    continues (teacher-labelled text or not: both are that strategy's rounds), other strategies and seeds side by
    side, each further chain on a directory ``stagger`` seconds later; every script the plan sends to a GPU machine
    has the datasets it reads packed."""
    gpu_campaign, campaign, device_pack = (_benchmark(n) for n in ("gpu_campaign", "campaign", "device_pack"))

    def al(strategy, seed, sizes, more=""):
        return (f"al/c/{strategy}{more.replace(' ', '')}/{sizes}/s{seed}",
                f"benchmarks/active_learning.py --dataset cluener --strategy {strategy} --sizes 200,{sizes}{more} "
                f"--seed {seed} --out {{runs}}/al-cluener-s{seed}")

    rows = [al("random", 1, 1000), al("uncertainty", 1, 1000), al("random", 1, 4000), al("random", 2, 1000),
            al("uncertainty", 1, 4000, " --teacher-labelled 2000")]
    timed = {tuple(key for key, _ in chain): delay for delay, chain in gpu_campaign.chains(rows, 20)}
    assert timed == {(rows[0][0], rows[2][0]): 0, (rows[1][0], rows[4][0]): 20, (rows[3][0],): 0}
    assert campaign.device_command("{python} " + rows[0][1] + " --save-every 100") == shlex.join(rows[0][1].split())
    assert set(campaign.GPU_SCRIPTS) <= set(device_pack.NEEDS)


def test_gpu_rows_after_a_failed_row_they_read_are_marked_failed_at_once(tmp_path, monkeypatch):
    """gpu_campaign.py: a student whose teacher row failed does not run, nor wait for the time limit, and a row that
    reads that student is marked failed too; a Python without a module zhie's training needs is named before any row
    starts."""
    gpu_campaign = _benchmark("gpu_campaign")
    (tmp_path / "carry" / "tree").mkdir(parents=True)
    (tmp_path / "carry" / "tree" / "fail.py").write_text("raise SystemExit(1)\n")
    monkeypatch.setattr(gpu_campaign, "CARRY", tmp_path / "carry")
    monkeypatch.setenv("ZHIE_DATA", str(tmp_path))
    rows = [("s/t/s1", "fail.py --out {run_dir}"), ("s/a/s1", "fail.py --teacher {runs}/s__t__s1/best --out {run_dir}"),
            ("s/b/s1", "fail.py --targets-from {runs}/s__a__s1/student --out {run_dir}")]
    (delay, chain), = gpu_campaign.chains(rows, 20)
    start = time.time()
    gpu_campaign.run_chain(delay, chain, [k for k, _ in rows], tmp_path / "runs", tmp_path / "enc", "c" * 40, 1,
                           start + 60, None)
    assert time.time() - start < 30
    done = {k: json.loads((tmp_path / "runs" / k.replace("/", "__") / "done.json").read_text()) for k, _ in rows}
    assert [done[k]["rc"] for k, _ in rows] == [1, -1, -1] and "skipped" not in done["s/t/s1"]
    assert gpu_campaign.missing_modules(["json", "zhie_no_such_module"]) == ["zhie_no_such_module"]


def test_mtmt_table_pairs_only_systems_that_distilled_the_same_teachers(tmp_path, monkeypatch):
    """report.py's MTMT table: a system is paired with direct transfer and TSL of its seed only when they came from
    one campaign row (the row trains the seed's teachers: another row of that seed distils other teachers)."""
    report = _benchmark("report")

    def result(system, seed, f1):
        return {"system": system, "seed": seed, "f1": f1, "precision": f1, "recall": f1}

    lines = [{"key": f"b/mtmt/s{s}", "results": [result("direct", s, 0.70 + s / 100), result("tsl", s, 0.71 + s / 100),
                                                  result("mtmt", s, 0.73 + s / 100)]} for s in (1, 2)]
    lines.append({"key": "b/mtmt-ablations/s1", "results": [result("mtmt-no-alpha", 1, 0.80)]})
    (tmp_path / "campaign.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    table = {row.split(" | ")[0].strip("| "): row.split(" | ") for row in report.campaign_mtmt_table().splitlines()[2:]}
    assert table["mtmt"][2:5] == ["74.50 ± 0.71", "3.00 ± 0.00", "2.00 ± 0.00"]
    assert table["mtmt-no-alpha"][2:5] == ["80.00", "–", "–"]


def test_a_students_teacher_is_trained_when_missing_or_not_yet_finished(tmp_path, monkeypatch):
    """``benchmarks/students.py --train-teacher``: a teacher trains when its directory is missing, and resumes when its
    run still holds a checkpoint (a stopped session's teacher has a ``best`` of an early epoch); a finished one, whose
    checkpoint the campaign removed, is used as it is."""
    import argparse

    students = _benchmark("students")
    ran = []
    monkeypatch.setattr(students.subprocess, "run", lambda command, check: ran.append(command[-1]))
    run = [tmp_path / name for name in ("missing", "stopped", "finished")]
    for directory in run[1:]:
        (directory / "cluener-gp" / "best").mkdir(parents=True)
    (run[1] / "cluener-gp" / "checkpoint.pt").write_bytes(b"")
    args = argparse.Namespace(teacher=[str(d / "cluener-gp" / "best") for d in run], dataset="cluener",
                              train_teacher=["--seed 1"] * 3)
    assert students.teachers(args, tmp_path / "train.json", tmp_path / "dev.json") == [
        d / "cluener-gp" / "best" for d in run]
    assert ran == [str(run[0]), str(run[1])]


def test_stored_teacher_outputs_are_reused_where_they_exist_and_computed_where_not(tmp_path, capsys):
    """``benchmarks/students.py --targets-from RUN``: a row on a fresh machine, where the run that stored the
    teacher's outputs is gone, labels the items again instead of failing after its teacher trained; the row records
    which happened."""
    students = _benchmark("students")
    stored = tmp_path / "stored"
    (stored / students.TARGETS).parent.mkdir(parents=True)
    (stored / students.TARGETS).write_bytes(b"")
    assert students.stored_targets(str(stored)) == str(stored) and capsys.readouterr().err == ""
    assert students.stored_targets(str(tmp_path / "gone")) is None
    assert "no stored teacher outputs there" in capsys.readouterr().err
    assert students.stored_targets(None) is None


def test_a_measured_command_reports_its_own_peak_memory_not_the_benchmarks():
    """``common.run_measured``: a benchmark that holds ~400 MB runs a command that touches 64 MB; the command's peak
    is reported (a child forked by the benchmark itself would report at least the benchmark's size), with its wall
    time, and a failing command exits with its error output."""
    common = _benchmark("common")
    held = bytearray(400 * 2**20)
    held[::4096] = b"\1" * len(held[::4096])  # resident, not only reserved
    touch = "b = bytearray(64 * 2**20); b[::4096] = b'\\1' * len(b[::4096]); import time; time.sleep(0.2)"
    wall, peak_mb = common.run_measured([sys.executable, "-c", touch])
    assert 64 < peak_mb < 200 and wall >= 0.2
    with pytest.raises(SystemExit, match="exit 3.*went wrong"):
        common.run_measured([sys.executable, "-c", "import sys; sys.stderr.write('went wrong'); sys.exit(3)"])
    del held


def test_a_benchmark_line_names_no_path_of_this_machine(tmp_path, monkeypatch, capsys):
    """A benchmark run by hand (not through the campaign, whose lines are rewritten) writes its line with the campaign's
    runs as RUNS/, the repository's files relative to it and what lies beside it as ../, in the file and on stdout."""
    common = _benchmark("common")
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    root, beside = common.ROOT, common.ROOT.parent
    row = {"model": f"{common.CAMPAIGN_DIR / 'runs'}/s__x__s1/student/best", "data": f"{beside}/shared/data/x.json",
           "command": f"python benchmarks/tradeoff.py --out {root}/runs/t --peer jiagu={beside}/peers/bin/python"}
    common.append_result("t", row)
    written = (tmp_path / "t.jsonl").read_text()
    assert json.loads(written) == {
        "model": "RUNS/s__x__s1/student/best", "data": "../shared/data/x.json",
        "command": "python benchmarks/tradeoff.py --out runs/t --peer jiagu=../peers/bin/python"}
    assert capsys.readouterr().out == written


def test_a_result_line_names_no_path_of_this_machine(tmp_path, monkeypatch):
    """common.portable_paths, where every result line's paths are rewritten: the run directories as RUNS/, the datasets
    as ../shared/data/ wherever ZHIE_DATA put them (the campaign's rows run in worktrees, whose ../ is not the
    repository's), the worktree's own files relative to it."""
    monkeypatch.setenv("ZHIE_DATA", str(tmp_path / "elsewhere" / "data"))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("common", None)
    common = importlib.import_module("common")
    try:
        runs, tree = tmp_path / "campaign" / "runs", tmp_path / "campaign" / "worktrees" / "abc"
        line = json.dumps({"dev": f"{tmp_path}/elsewhere/data/ner/cluener/dev.json", "out": f"{runs}/x__s1/best",
                           "script": f"{tree}/benchmarks/ner.py"})
        assert json.loads(common.portable_paths(line, runs, tree, beside=False)) == {
            "dev": "../shared/data/ner/cluener/dev.json", "out": "RUNS/x__s1/best", "script": "benchmarks/ner.py"}
    finally:
        sys.modules.pop("common", None)


def test_a_rows_seed_is_its_own_not_that_of_a_quoted_command_it_passes_on():
    """The seed of a result line is the row's ``--seed``, not the one inside a quoted inner command (a students
    row's ``--train-teacher '... --seed 1'``)."""
    campaign = _benchmark("campaign")
    row = ("{python} benchmarks/students.py --teacher {runs}/t/best --train-teacher '--dataset cluener --epochs 3 "
           "--seed 1' --student conv --seed 2 --out {run_dir}")
    assert campaign.seed_of(row) == 2
    assert campaign.seed_of('{python} benchmarks/x.py --train-teacher "--seed 7" --seeds 3') == 3
    assert campaign.seed_of("{python} benchmarks/ner.py --seed=4 --out {run_dir}") == 4
    assert campaign.seed_of("{python} benchmarks/ner.py --out {run_dir}") is None


def test_a_benchmark_started_by_one_holding_the_machine_lock_passes_it(tmp_path):
    """``students.py`` holds the lock and trains its teacher by ``ner.py``, which takes the lock too: the child must
    pass the lock its parent holds, not wait for the parent to end (it waited forever)."""
    nested = ("import sys; sys.path.insert(0, sys.argv[1]); from common import machine_lock\n"
              "with machine_lock(): print('child ran')")
    parent = ("import subprocess, sys; sys.path.insert(0, sys.argv[1]); from common import machine_lock\n"
              "with machine_lock():\n"
              f"    subprocess.run([sys.executable, '-c', {nested!r}, sys.argv[1]], check=True, timeout=60)")
    env = {key: value for key, value in os.environ.items() if key != "ZHIE_MACHINE_LOCK_HELD"}
    done = subprocess.run([sys.executable, "-c", parent, str(CAMPAIGN.parent)], capture_output=True, text=True,
                          timeout=120, env={**env, "ZHIE_CAMPAIGN_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "child ran" in done.stdout and "waiting for another benchmark" not in done.stderr
