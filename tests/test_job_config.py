"""One way to configure every job (issue 50): each job's flags are its dataclasses' fields with their defaults (no
default written twice), every job takes ``--config FILE`` and prints its settings with ``--print-config``, a run's
``config.toml`` reruns it into a new ``--out`` (the same model) and re-derives what zhie derived, and a flag that the
chosen job does not take is refused."""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.tiny_models import nested_corpus
from zhie import tasks
from zhie.cli import build_parser, expand_run_config, main
from zhie.core import config_file
from zhie.core.options import option_fields
from zhie.data import write_ner_jsonl
from zhie.deploy.export import ExportOptions
from zhie.deploy.serve import Batching, Limits, Retraining, ServeOptions
from zhie.training import TrainConfig
from zhie.training.config import RunOptions, default_lr
from zhie.training.mtmt import MTMT_BATCH, MtmtOptions
from zhie.training.pretrain_config import PretrainConfig
from zhie.training.students import StudentOptions

# each job: its command line before the flags, the dataclasses its flags come from, and the defaults it sets itself
# (declared once, in the job: an MTMT student's batch); the task's own flags that are no config field (test_options)
JOBS = {
    **{f"train {name}": (["train", name], [RunOptions, TrainConfig, tasks.get(name).config_class], {})
       for name in ("ner", "cws", "re", "similarity", "xner-evaluator", "multitask")},
    "distill student": (["distill", "student"], [StudentOptions, TrainConfig], {}),
    "distill mtmt": (["distill", "mtmt"], [MtmtOptions, TrainConfig], {"batch_size": MTMT_BATCH}),
    "pretrain": (["pretrain"], [PretrainConfig], {}),
    "export": (["export"], [ExportOptions], {}),
    "serve": (["serve"], [ServeOptions, Batching, Limits, Retraining], {}),
}
# the flags of a job that are no field of its dataclasses: re's --schema, similarity's --prefix, multitask's, and
# pretrain's data, encoder and output, which have no default (device: the machine's)
NOT_FIELDS = {"train re": {"schema"}, "train similarity": {"prefix"}, "train multitask": {"tasks_file", "weighting"},
              "pretrain": {"corpus", "encoder", "out", "device"}}


def job_parser(job: str):
    command, _, _ = JOBS[job]
    return build_parser(command).parse_args([*command, "--print-config"]).job_parser


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_job_s_flags_are_its_dataclasses_fields_with_their_defaults(job):
    _, classes, own = JOBS[job]
    declared = {f.name: f for cls in classes for f in fields(cls)}
    actions = job_parser(job).settings_actions()
    not_fields = NOT_FIELDS.get(job, set())
    assert set(actions) - not_fields <= set(declared), set(actions) - set(declared)
    for dest, action in actions.items():
        if dest in not_fields:
            continue
        expected = own.get(dest, declared[dest].default)
        assert action.default == expected, f"zhie {job} --{dest}: {action.default!r}, its field {expected!r}"
        assert declared[dest].default is not MISSING and action.help, dest


@pytest.mark.parametrize("job", sorted(JOBS))
def test_print_config_prints_every_setting_and_reads_back(job, tmp_path, capsys):
    command, _, _ = JOBS[job]
    assert main([*command, "--print-config"]) == 0
    text = capsys.readouterr().out
    (tmp_path / "job.toml").write_text(text, encoding="utf-8")
    name, settings = config_file.read(tmp_path / "job.toml")
    assert name == job
    parser = job_parser(job)
    defaults = {dest: a.default for dest, a in parser.settings_actions().items()}
    shown = {k: v for k, v in defaults.items() if v is not None}
    assert {k: (list(v) if isinstance(v, tuple) else v) for k, v in shown.items()} == settings
    # --config of it: the same settings
    args = build_parser(command).parse_args([*command, "--config", str(tmp_path / "job.toml"), "--print-config"])
    again = {k: (list(v) if isinstance(v, tuple) else v) for k, v in parser.settings(args).items()}
    assert again == {k: (list(v) if isinstance(v, tuple) else v) for k, v in defaults.items()}


def test_a_config_file_is_checked_as_the_flags_are(tmp_path, capsys):
    bad = {"heads = 'gp'": "heads: not a setting of zhie train ner",
           "head = 'span'": "head = 'span': choose one of",
           "[training]\nepochs = 'three'": "epochs = 'three'",
           'command = "distill student"': "is the configuration of `zhie distill student`, not of `zhie train ner`",
           "epochs = 2\n[training]\nepochs = 3": "epochs is set twice"}
    for text, message in bad.items():
        (tmp_path / "c.toml").write_text(text + "\n", encoding="utf-8")
        assert main(["train", "ner", "--config", str(tmp_path / "c.toml"), "--print-config"]) == 2
        assert message in capsys.readouterr().err, text


@pytest.fixture
def data(tmp_path):
    write_ner_jsonl(nested_corpus(24, seed=1), tmp_path / "train.jsonl")
    write_ner_jsonl(nested_corpus(8, seed=2), tmp_path / "dev.jsonl")
    return tmp_path


def weights(run: Path) -> dict:
    return {f"{file.name}:{k}": v for file in sorted((run / "best").glob("*.safetensors"))
            for k, v in load_file(file).items()}


def same_model(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)


TRAIN = ["--encoder", "tiny", "--max-length", "32", "--epochs", "1", "--batch-size", "8", "--seed", "3", "--quiet"]


def train_a(data: Path) -> Path:
    assert main(["train", "ner", "--train", str(data / "train.jsonl"), "--dev", str(data / "dev.jsonl"), *TRAIN,
                 "--out", str(data / "a"), "--head", "egp"]) == 0
    return data / "a" / "config.toml"


def test_a_train_run_reruns_from_its_config_toml_into_a_new_out(data, capsys):
    config = train_a(data)
    command, settings = config_file.read(config)
    assert command == "train ner" and "lr" not in settings  # the rate was derived: not a setting of the run
    assert main(["train", "--config", str(config), "--out", str(data / "b")]) == 0
    assert same_model(data / "a", data / "b")
    capsys.readouterr()
    assert main(["train", "--config", str(config)]) == 0  # its own --out: finished, and it says how to rerun
    err = capsys.readouterr().err
    assert "holds a finished run of this configuration, so nothing was trained" in err and "--out NEW" in err


def test_an_encoder_override_derives_its_own_rates(data):
    import tomllib

    config = train_a(data)  # the run keeps the rates it used apart, in [derived]
    derived = tomllib.loads(config.read_text(encoding="utf-8"))["derived"]
    assert (derived["lr"], derived["head_lr"]) == (2e-4, 2e-3)  # tiny is 128 wide
    wide = "new:bert:layers=1,hidden=768,heads=2,intermediate=64"
    assert main(["train", "--config", str(config), "--out", str(data / "w"), "--encoder", wide,
                 "--max-steps", "1"]) == 0
    record = json.loads((data / "w" / "best" / "training.json").read_text(encoding="utf-8"))["train_config"]
    assert (record["lr"], record["head_lr"]) == (default_lr(768), 10 * default_lr(768)) == (5e-5, 5e-4)


def test_a_distill_run_reruns_from_its_config_toml_into_a_new_out(data):
    train_a(data)
    teacher = data / "a" / "best"
    assert main(["distill", "student", "--teacher", str(teacher), "--train", str(data / "train.jsonl"), "--dev",
                 str(data / "dev.jsonl"), "--encoder-layers", "1", "--epochs", "1", "--batch-size", "8", "--quiet",
                 "--out", str(data / "s")]) == 0
    config = data / "s" / "config.toml"
    assert config_file.read(config)[0] == "distill student"
    assert main(["distill", "student", "--config", str(config), "--out", str(data / "s2")]) == 0
    assert same_model(data / "s", data / "s2")


def test_a_pretrain_run_reruns_from_its_config_toml_into_a_new_out(tmp_path):
    from tests.tiny_models import paragraphs

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(paragraphs(60, seed=6)) + "\n", encoding="utf-8")
    bert = "new:bert:layers=1,hidden=32,heads=2,intermediate=64"
    assert main(["pretrain", "--corpus", str(corpus), "--encoder", bert, "--out", str(tmp_path / "p"), "--steps", "2",
                 "--batch-size", "4", "--max-length", "64", "--heldout", "8", "--shuffle-buffer", "8", "--quiet"]) == 0
    config = tmp_path / "p" / "config.toml"
    command, settings = config_file.read(config)
    assert (command, settings["steps"], "warmup" in settings) == ("pretrain", 2, False)  # warmup: derived
    assert main(["pretrain", "--config", str(config), "--out", str(tmp_path / "q"), "--quiet"]) == 0
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in "pq")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


STUDENT_ONLY = {flag for f in option_fields(StudentOptions) for flag in [f"--{f.name.replace('_', '-')}"]}
MTMT_ONLY = {"--recognizer", "--evaluator", "--target", "--pairs", "--no-balance", "--loss-alpha", "--no-alpha",
             "--no-beta", "--no-gamma", "--no-similarity", "--head-lr-ratio"}


def flags_of(job: str) -> set[str]:
    return {s for a in job_parser(job)._actions for s in a.option_strings}


def test_each_distillation_job_refuses_the_other_s_flags(capsys):
    student, mtmt = flags_of("distill student"), flags_of("distill mtmt")
    assert MTMT_ONLY <= mtmt - student
    assert {"--teacher", "--temperature", "--hard-weight", "--unlabelled", "--targets-from", "--student", "--head-lr",
            "--adversarial", "--rdrop"} & mtmt == set()
    assert "--rdrop" not in student  # zhie train's, for one task's own loss
    base = {"distill student": ["--teacher", "t", "--train", "x", "--out", "o"],
            "distill mtmt": ["--recognizer", "r", "--evaluator", "e", "--target", "t", "--out", "o"]}
    for job, others in (("distill student", mtmt - student), ("distill mtmt", student - mtmt)):
        for flag in sorted(others):
            value = [] if flag.startswith("--no-") else ["1"]
            with pytest.raises(SystemExit) as exit:  # argparse's exit, as for any bad command line
                main([*job.split(), *base[job], flag, *value])
            assert exit.value.code == 2, flag
            err = capsys.readouterr().err
            assert f"unrecognized arguments: {flag}" in err and f"zhie {job} does not take it" in err, err


def test_the_old_spellings_still_run_with_a_deprecation_warning(tmp_path, capsys):
    assert expand_run_config(["distill", "--teacher", "t", "--train", "x"])[:2] == ["distill", "student"]
    assert expand_run_config(["distill", "--recognizer", "r", "--evaluator", "e"])[:2] == ["distill", "mtmt"]
    members = tmp_path / "mt.toml"
    members.write_text('[[tasks]]\nname = "ner"\ntask = "ner"\ntrain = "a"\ndev = "b"\n', encoding="utf-8")
    assert expand_run_config(["train", "multitask", "--config", str(members), "--out", "o"]) == [
        "train", "multitask", "--tasks", str(members), "--out", "o"]
    err = capsys.readouterr().err
    for old in ("zhie distill --teacher", "zhie distill --recognizer", "zhie train multitask --config MEMBERS"):
        assert f"`{old}" in err and "is deprecated; use" in err, old
