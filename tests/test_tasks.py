"""The task protocol: a new task is one class (here, in this file) that the CLI, zhie.fit and zhie.load find
through the registry; model directories written before the protocol still load."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

import zhie
from zhie import demo, tasks
from zhie.cli import build_parser, main
from zhie.core.options import option
from zhie.data import write_ner_jsonl
from zhie.data.base import DataError, iter_lines
from zhie.heads import Pooling
from zhie.tasks.base import HEAD_FILE, META_FILE, Task, model_inputs
from zhie.training import TrainConfig


# ------------------------------------------------------------------------------------------ a task in one class
class Classifier(nn.Module):
    """Head: the [CLS] vector through a linear layer -> class logits ``[b, classes]``."""

    def __init__(self, hidden_size: int, classes: int) -> None:
        super().__init__()
        self.pool = Pooling("cls")
        self.dense = nn.Linear(hidden_size, classes)

    def forward(self, hidden, attention_mask):
        return self.dense(self.pool(hidden, attention_mask))


@dataclass
class ClassifyConfig:
    labels: list[str]
    max_length: int = option(64, "tokens per text, special tokens included")
    mode: str = "subword"


@dataclass
class Labelled:
    text: str
    label: str


@dataclass
class Encoded:
    ids: list[int]
    label: int


@tasks.register
class ClassifyTask(Task):
    """Sentence classification from ``label TAB text`` lines: ``predict`` returns one label per text."""

    name = "classify-test"
    help = "sentence classification (the README's example task)"
    config_class = ClassifyConfig
    output_key = "label"
    metric = "accuracy"

    @classmethod
    def read(cls, path, format="auto"):
        examples = []
        for lineno, line in iter_lines(path):
            label, sep, text = line.partition("\t")
            if not sep:
                raise DataError(path, lineno, "expected 'label<TAB>text'")
            examples.append(Labelled(text, label))
        return examples

    @classmethod
    def configure(cls, examples, *, encoder, **options):
        return ClassifyConfig(sorted({ex.label for ex in examples}), **options)

    def build_heads(self, hidden_size):
        return {self.head_name: Classifier(hidden_size, len(self.config.labels))}

    def encode(self, examples):
        ids = self.tokenizer([ex.text for ex in examples], truncation=True, max_length=self.config.max_length)
        return [Encoded(row, self.config.labels.index(ex.label)) for row, ex in zip(ids["input_ids"], examples)]

    def collate(self, items):
        return {**model_inputs([it.ids for it in items], self.tokenizer.pad_token_id),
                "labels": torch.tensor([it.label for it in items])}

    def head_loss(self, head, logits, batch):
        return F.cross_entropy(logits.float(), batch["labels"])

    @torch.no_grad()
    def predict(self, model, texts, batch_size=32, max_tokens=None):
        model.eval()
        batch = model_inputs(self.tokenizer(texts, truncation=True, max_length=self.config.max_length)["input_ids"],
                             self.tokenizer.pad_token_id)
        logits = model(**batch)[self.head_name]
        return [self.config.labels[i] for i in logits.argmax(-1).tolist()]

    def to_json(self, prediction):
        return prediction

    def score(self, examples, predictions):
        return {"accuracy": sum(ex.label == p for ex, p in zip(examples, predictions)) / max(len(examples), 1)}


def test_a_task_in_one_class_trains_predicts_and_evaluates_through_the_registry(tmp_path, capsys):
    rng = random.Random(0)
    lines = [f"{label}\t{''.join(rng.choices('天气今日我们', k=4))}{word}{''.join(rng.choices('天气今日', k=3))}"
             for label, word in [("pos", "好"), ("neg", "坏")] * 40]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["train", "classify-test", "--train", str(tmp_path / "train.tsv"), "--dev", str(tmp_path / "train.tsv"),
                 "--encoder", "tiny", "--out", str(tmp_path / "run"), "--epochs", "10", "--batch-size", "16",
                 "--lr", "2e-3", "--quiet"]) == 0
    best = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert best["best"]["accuracy"] == 1.0
    assert main(["predict", str(tmp_path / "run"), "今日天气好", "今日天气坏"]) == 0
    assert [json.loads(x)["label"] for x in capsys.readouterr().out.splitlines()] == ["pos", "neg"]
    assert main(["eval", str(tmp_path / "run"), "--data", str(tmp_path / "train.tsv")]) == 0
    assert json.loads(capsys.readouterr().out) == {"accuracy": 1.0}
    assert isinstance(zhie.load(tmp_path / "run").task, ClassifyTask)


def test_the_four_tasks_are_registered_and_names_are_unique():
    assert {cls.name for cls in tasks.all_tasks()} >= {"ner", "cws", "re", "similarity"}
    assert tasks.get("sts") is tasks.get("similarity")
    with pytest.raises(ValueError, match="unknown task"):
        tasks.get("nope")

    class Clash(Task):
        name = "clash"
        aliases = ("ner",)

    with pytest.raises(ValueError, match="taken"):
        tasks.register(Clash)


# ------------------------------------------------------------------------------------------ format-1 directories
def to_format_1(model_dir, task: str, renames: dict[str, str], meta_renames: dict[str, str], extra=None) -> None:
    """Rewrite a model directory as zhie wrote it before the task protocol (no "format", old names)."""
    weights = load_file(str(model_dir / HEAD_FILE))
    old = {}
    for name, value in weights.items():
        prefix = next(p for p in renames if name.startswith(p))
        old[renames[prefix] + name[len(prefix):]] = value
    save_file({**old, **(extra or {})}, str(model_dir / HEAD_FILE))
    meta = json.loads((model_dir / META_FILE).read_text())
    meta = {meta_renames.get(k, k): v for k, v in meta.items() if k != "format"}
    (model_dir / META_FILE).write_text(json.dumps({**meta, "task": task}), encoding="utf-8")


@pytest.mark.parametrize("head", ["crf", "egp"])
def test_a_model_directory_of_the_previous_version_loads(head, tmp_path):
    write_ner_jsonl(demo.make_corpus(32, seed=0), tmp_path / "train.jsonl")
    zhie.fit("ner", tmp_path / "train.jsonl", tmp_path / "train.jsonl", out=tmp_path / "run", encoder="tiny",
             head=head, config=TrainConfig(epochs=1, batch_size=16, lr=1e-3,
                                           head_lr=1e-3), resume=False, progress=False)
    texts = [demo.SAMPLES[0]]
    before = zhie.load(tmp_path / "run").predict(texts)
    renames = {"heads.ner.crf.": "crf.", "heads.ner.": "head."}
    to_format_1(tmp_path / "run" / "best", "ner", renames, {"overlap": "stride"})
    assert "crf.transitions" in load_file(str(tmp_path / "run" / "best" / HEAD_FILE)) or head != "crf"
    assert zhie.load(tmp_path / "run").predict(texts) == before


def test_an_old_sentence_model_with_its_classifier_loads(tmp_path):
    data = tmp_path / "pairs.data"
    data.write_text("今天天气很好\t今天天气不错\t1\n我要吃饭\t今天天气不错\t0\n", encoding="utf-8")
    zhie.fit("sts", data, data, out=tmp_path / "run", encoder="tiny", loss="sbert",
             config=TrainConfig(epochs=1, batch_size=2), resume=False, progress=False)
    before = zhie.load(tmp_path / "run").predict(["今天天气很好"])
    to_format_1(tmp_path / "run" / "best", "sts", {}, {}, extra={"classifier.weight": torch.zeros(2, 384),
                                                                 "classifier.bias": torch.zeros(2)})
    pipe = zhie.load(tmp_path / "run")
    assert pipe.task.name == "similarity"
    torch.testing.assert_close(torch.from_numpy(pipe.predict(["今天天气很好"])), torch.from_numpy(before))


def test_an_old_gplinker_model_loads(tmp_path):
    text = "糖尿病患者常出现多饮、多尿。"
    spo = {"predicate": "临床表现", "subject": "糖尿病", "object": {"@value": "多饮"}}
    (tmp_path / "re.jsonl").write_text(json.dumps({"text": text, "spo_list": [spo]}, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
    zhie.fit("re", tmp_path / "re.jsonl", tmp_path / "re.jsonl", out=tmp_path / "run", encoder="tiny",
             config=TrainConfig(epochs=1, batch_size=1), resume=False, progress=False)
    before = zhie.load(tmp_path / "run")
    to_format_1(tmp_path / "run" / "best", "re", {"heads.re.": ""}, {"head": "variant", "overlap": "stride"})
    assert {k.split(".")[0] for k in load_file(str(tmp_path / "run" / "best" / HEAD_FILE))} == {
        "entity", "head_head", "tail_tail"}
    after = zhie.load(tmp_path / "run")
    assert after.task.config == before.task.config
    state, old_state = after.model.state_dict(), before.model.state_dict()
    assert all(torch.equal(state[k], old_state[k]) for k in state)


# ------------------------------------------------------------------------------------------ bad input to the CLI
@pytest.fixture(scope="module")
def ner_dir(tmp_path_factory):
    """A NER model directory (one training step on the demo corpus)."""
    out = tmp_path_factory.mktemp("ner")
    write_ner_jsonl(demo.make_corpus(16, seed=0), out / "train.jsonl")
    zhie.fit("ner", out / "train.jsonl", out / "train.jsonl", out=out / "run", encoder="tiny", head="gp",
             config=TrainConfig(max_steps=1, batch_size=16), resume=False, progress=False)
    return out / "run" / "best"


def _truncate(file):
    file.write_bytes(file.read_bytes()[:-100])


def _drop_a_head_weight(directory):
    weights = load_file(str(directory / HEAD_FILE))
    save_file({k: v for k, v in weights.items() if not k.endswith("dense.bias")}, str(directory / HEAD_FILE))


def _change_the_labels(directory):
    meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    (directory / META_FILE).write_text(json.dumps({**meta, "labels": ["A"]}), encoding="utf-8")


DAMAGES = {  # what is done to a model directory -> what `zhie predict` says of it
    "zhie.json not JSON": (lambda d: (d / META_FILE).write_text('{"task": "ner", "labels": ['),
                           f"{META_FILE}: not valid JSON"),
    "zhie.json not UTF-8": (lambda d: (d / META_FILE).write_bytes(b'{"task": "\xff"}'), f"{META_FILE}: not valid JSON"),
    "zhie.json a list": (lambda d: (d / META_FILE).write_text("[1]"), f"{META_FILE}: expected a JSON object"),
    "zhie.json without task": (lambda d: (d / META_FILE).write_text('{"labels": []}'),
                               f"{META_FILE}: expected a JSON object with the model's \"task\""),
    "model.safetensors truncated": (lambda d: _truncate(d / "model.safetensors"),
                                    "the encoder's weights (model.safetensors) cannot be read"),
    "head.safetensors truncated": (lambda d: _truncate(d / HEAD_FILE), f"{HEAD_FILE}: cannot be read"),
    "head.safetensors missing": (lambda d: (d / HEAD_FILE).unlink(), f"{HEAD_FILE}: missing from the model directory"),
    "a head weight missing": (_drop_a_head_weight, f"{HEAD_FILE}: missing ['heads.ner.dense.bias']"),
    "zhie.json of other weights": (_change_the_labels, "wrong shape ['heads.ner.dense.bias (384,), expected (128,)'"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_model_directory_is_one_clear_error(damage, ner_dir, tmp_path, capsys):
    import shutil

    model = shutil.copytree(ner_dir, tmp_path / "model")
    do, message = DAMAGES[damage]
    do(model)
    assert main(["predict", str(model), "北京"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zhie: error: ") and message in err and "Traceback" not in err, err


def test_an_unknown_device_is_one_clear_error(ner_dir):
    with pytest.raises(ValueError, match="cannot put the model on the device 'nowhere'.*use cpu"):
        zhie.load(ner_dir, device="nowhere")


def test_the_commands_over_a_model_take_a_device(ner_dir, capsys):
    """``--device cpu|cuda|cuda:N|auto`` (default auto: the GPU if there is one) on predict, eval, segment, embed,
    handed to the model's loading."""
    parser = build_parser()
    for command in (["predict", "m"], ["eval", "m", "--data", "d"], ["segment", "m"], ["embed", "m"]):
        assert parser.parse_args(command).device is None
        assert parser.parse_args([*command, "--device", "auto"]).device is None
        assert parser.parse_args([*command, "--device", "cuda:1"]).device == "cuda:1"
        with pytest.raises(SystemExit):
            parser.parse_args([*command, "--device", "gpu"])
        assert "use cpu, cuda, cuda:N or auto" in capsys.readouterr().err
    data = ner_dir.parents[1] / "train.jsonl"
    assert main(["predict", str(ner_dir), "北京", "--device", "cpu"]) == 0
    assert main(["eval", str(ner_dir), "--data", str(data), "--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(["predict", str(ner_dir), "--ray", "--device", "cpu", "--input", "in.txt", "--output", "out"]) == 2
    assert "with --ray, Ray places each worker's model" in capsys.readouterr().err
    if not torch.cuda.is_available():  # the device reaches the model: on a machine without a GPU, cuda is refused
        assert main(["predict", str(ner_dir), "北京", "--device", "cuda"]) == 2
        assert "cannot put the model on the device 'cuda'" in capsys.readouterr().err


@pytest.mark.parametrize("task, data", [("ner", "ner.jsonl"), ("cws", "cws.txt"), ("re", "re.jsonl"),
                                        ("sts", "pairs.tsv")])
def test_a_max_length_without_room_for_text_is_refused(task, data, tmp_path, capsys):
    files = {"ner.jsonl": '{"text": "北京", "entities": [{"start": 0, "end": 2, "label": "LOC"}]}',
             "cws.txt": "上海  市", "re.jsonl": '{"text": "北京是首都", "spo_list": [{"subject": "北京", '
                                               '"predicate": "是", "object": "首都"}]}',
             "pairs.tsv": "北京\t上海\t1"}
    (tmp_path / data).write_text(files[data] + "\n", encoding="utf-8")
    assert main(["train", task, "--train", str(tmp_path / data), "--dev", str(tmp_path / data), "--encoder", "tiny",
                 "--out", str(tmp_path / "run"), "--max-length", "2", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("zhie: error: --max-length 2: a window (a sentence) holds [CLS], [SEP]")


def test_a_missing_data_file_is_named_without_python_s_errno(tmp_path, capsys):
    missing = tmp_path / "train.jsonl"
    assert main(["train", "ner", "--train", str(missing), "--dev", str(missing), "--encoder", "tiny", "--out",
                 str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"zhie: error: {missing}: No such file or directory\n"


@pytest.mark.parametrize("task, line, says", [
    ("ner", '{"text": "北京"}', "no entity types: none of the 1 training examples has an entity; check --train"),
    ("re", '{"text": "北京是首都", "spo_list": []}', "no predicates: none of the 1 training examples has a triple"),
])
def test_training_data_without_labels_says_what_to_check(task, line, says, tmp_path, capsys):
    (tmp_path / "train.jsonl").write_text(line + "\n", encoding="utf-8")
    assert main(["train", task, "--train", str(tmp_path / "train.jsonl"), "--dev", str(tmp_path / "train.jsonl"),
                 "--encoder", "tiny", "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert capsys.readouterr().err.startswith(f"zhie: error: {says}")


def test_encoder_layers_out_of_range_names_the_flag_and_the_range(tmp_path, capsys):
    write_ner_jsonl(demo.make_corpus(4, seed=1), tmp_path / "train.jsonl")
    assert main(["train", "ner", "--train", str(tmp_path / "train.jsonl"), "--dev", str(tmp_path / "train.jsonl"),
                 "--encoder", "tiny", "--out", str(tmp_path / "run"), "--encoder-layers", "9", "--quiet"]) == 2
    assert capsys.readouterr().err == "zhie: error: --encoder-layers 9: the encoder has 2 layers; keep 1 to 2\n"


@pytest.mark.parametrize("flag", ["--max-texts", "--max-text-length"])
def test_serve_refuses_limits_that_would_refuse_every_request(flag, ner_dir, capsys):
    with pytest.raises(SystemExit) as stop:  # the parser alone: a server that started would never return
        build_parser().parse_args(["serve", str(ner_dir), flag, "0"])
    assert stop.value.code == 2 and f"argument {flag}: " in capsys.readouterr().err
