"""Each option is declared once, on its dataclass field (:mod:`zhie.core.options`): ``zhie train``'s flags, their
defaults and what ``configure`` makes of them come from there, so that no default is written twice and drifts."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from zhie import tasks
from zhie.cli import build_parser, expand_run_config
from zhie.core.config_file import RUN_CONFIG
from zhie.core.options import add_flags, check_options, option, option_fields, values_from_flags
from zhie.core.spans import Span
from zhie.data import NerExample
from zhie.data.spo import SpoExample, Triple
from zhie.data.sts import Pair
from zhie.training import TrainConfig
from zhie.training.config import config_from_flags
from zhie.training.record import write_run_config

OWN_TASKS = sorted({tasks.get(name) for name in tasks.MODULES}, key=lambda cls: cls.name)
# zhie train TASK's flags that are no config field, and why: re's --schema names the file its predicates come from,
# similarity's --prefix follows the encoder when not given; multitask's options name its config file
NOT_FIELDS = {"re": {"schema"}, "similarity": {"prefix"}, "multitask": {"tasks_file", "weighting"}}
FLAGS = {"ner": ["--head", "--mode", "--max-length", "--flatten", "--crf-lr-multiplier", "--no-gp-prior-init"],
         "cws": ["--head", "--max-length", "--crf-lr-multiplier"],
         "re": ["--schema", "--head", "--variant", "--max-length"],
         "similarity": ["--loss", "--pooling", "--max-length", "--prefix"],
         "xner-evaluator": ["--max-length", "--pairs", "--no-balance", "--dev-pairs"],
         "multitask": ["--tasks", "--weighting"]}
PER = Span(0, 2, "PER", "张三")
# one training example per task, for configure: the config's fields derived from the data
EXAMPLES = {"ner": [NerExample("张三来了", [PER])], "cws": [NerExample("张三来了", [])],
            "re": [SpoExample("张三生于北京", [Triple(PER, "生于", Span(4, 6, "LOC", "北京"))])],
            "similarity": [Pair("一", "二", 0.0), Pair("三", "四", 1.0)],
            "xner-evaluator": [NerExample("张三 来了", [PER])]}


def required(cls) -> list[str]:
    data = ["--train", "a", "--dev", "b"] if cls.data_flags else ["--tasks", "mt.toml"]
    return ["train", cls.name, *data, "--out", "c"]


def test_the_training_flags_default_to_train_config_s_fields():
    args = build_parser().parse_args(required(tasks.get("ner")))
    for f in option_fields(TrainConfig):
        assert getattr(args, f.name) == f.default, f.name
    assert config_from_flags(args) == TrainConfig()


@pytest.mark.parametrize("cls", OWN_TASKS, ids=lambda cls: cls.name)
def test_a_task_s_flags_are_its_config_s_option_fields_with_their_defaults(cls):
    args = build_parser().parse_args(required(cls))
    declared = option_fields(cls.config_class, cls.option_names)
    for f in declared:
        assert getattr(args, f.name) == f.default, f"zhie train {cls.name}: --{f.name} defaults to another value"
    assert set(args.task_options) == {f.name for f in declared} | NOT_FIELDS.get(cls.name, set())
    own = argparse.ArgumentParser(add_help=False)
    cls.add_arguments(own)
    assert [name for a in own._actions for name in a.option_strings] == FLAGS[cls.name]  # the names users type


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_configure_with_no_option_given_makes_the_config_s_defaults(name):
    """From the command line (every flag at its default) and from Python (no option given)."""
    cls = tasks.get(name)
    args = build_parser().parse_args(required(cls))
    derived = {"ner": {"labels": ["PER"]}, "cws": {}, "re": {"predicates": ["生于"]},
               "similarity": {"label_max": 1.0}, "xner-evaluator": {"tags": ["O", "B-PER", "I-PER"]}}[name]
    flags = {dest: getattr(args, dest) for dest in args.task_options}
    for options in (flags, {}):
        assert cls.configure(EXAMPLES[name], encoder="tiny", **options) == cls.config_class(**derived)


@pytest.mark.parametrize("cls", OWN_TASKS, ids=lambda cls: cls.name)
def test_zhie_train_config_gives_a_run_s_options_back(cls, tmp_path):
    """A run's config.toml (as zhie.fit writes it), with the task's switches as they default and each turned, reruns
    with the same options."""
    own = argparse.ArgumentParser(add_help=False)
    cls.add_arguments(own)
    parser = build_parser()
    for switches in ([], [a.option_strings[0] for a in own._actions if a.nargs == 0]):
        args = parser.parse_args([*required(cls), *switches])
        data = {"train": "a", "dev": "b"} if cls.data_flags else {}
        options = {dest: getattr(args, dest) for dest in args.task_options}
        write_run_config(tmp_path, f"train {cls.name}", {**data, "out": "c"}, config_from_flags(args), None,
                         {cls.name: options})
        again = parser.parse_args(expand_run_config(["train", "--config", str(tmp_path / RUN_CONFIG)]))
        assert {dest: getattr(again, dest) for dest in again.task_options} == options
        assert config_from_flags(again) == config_from_flags(args)


def test_ner_s_mode_word_is_subword_tokens_tagged_by_word():
    config = tasks.get("ner").configure(EXAMPLES["ner"], encoder="tiny", mode="word", head="softmax")
    assert (config.mode, config.words) == ("subword", True)


def test_configure_refuses_what_is_no_option():
    with pytest.raises(TypeError, match="overlap: not an option of NerConfig"):
        tasks.get("ner").configure(EXAMPLES["ner"], encoder="tiny", overlap=8)
    with pytest.raises(TypeError, match="mode: not an option"):  # cws reads characters
        tasks.get("cws").configure([], encoder="tiny", mode="subword")


@dataclass
class Options:
    size: int = option(3, "a size", metavar="N")
    rate: float | None = option(None, "a rate", group="more")
    names: tuple[str, ...] = option((), "names")
    keep: bool = option(True, "drop it")
    loud: bool = option(False, "say more", flags=("--loud", "-l"))
    kind: str = option("a", "a kind", choices=("a", "b"), flags=("--kind", "--sort"))
    hidden: int = 7


def test_add_flags_names_types_and_switches():
    parser = argparse.ArgumentParser()
    add_flags(parser, Options)
    assert vars(parser.parse_args([])) == {"size": 3, "rate": None, "names": (), "keep": True, "loud": False,
                                           "kind": "a"}
    args = parser.parse_args(["--size", "5", "--rate", "0.5", "--names", "x", "y", "--no-keep", "-l", "--sort", "b"])
    assert values_from_flags(args, Options) == {"size": 5, "rate": 0.5, "names": ["x", "y"], "keep": False,
                                                "loud": True, "kind": "b"}
    assert "more" in [g.title for g in parser._action_groups] and "(default: 3)" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--kind", "c"])
    subset = argparse.ArgumentParser()
    add_flags(subset, Options, ("kind", "size"))
    assert vars(subset.parse_args([])) == {"kind": "a", "size": 3}
    with pytest.raises(ValueError, match="hidden: not an option of Options"):
        option_fields(Options, ("hidden",))
    assert check_options(Options, {"size": 1}) == {"size": 1}
    with pytest.raises(TypeError, match="hidden: not an option of Options"):
        check_options(Options, {"hidden": 1})
