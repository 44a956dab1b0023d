"""Multi-task training (issue 13): config errors, a tiny NER + CWS model that learns both through the CLI, one encoder
pass per prediction batch for every member, each scheme's weights and encoder gradient against its formula, sampled
members drawn as often as their probabilities and from the seed and step alone, a log bounded between evaluations."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

import zhie
from zhie.cli import main
from zhie.data import read_ner, write_ner_jsonl
from zhie.data.cws import read_segmented, write_segmented
from zhie.model import Model
from zhie.tasks.base import prepare_encoder, seeded
from zhie.tasks.multitask import ConfigError, MultiTask, read_config
from zhie.training import TrainConfig
from zhie.training.report import read_metrics

from .conftest import DATA
from .tiny_models import multitask_config, write_multitask_data, write_relation_data

CONFIG = """
[weighting]
scheme = "{scheme}"
{extra}

[[tasks]]
name = "ner"
task = "ner"
train = "ner.json"
dev = "ner.json"
options = {{head = "crf", max_length = 64}}

[[tasks]]
name = "seg"
task = "cws"
train = "cws.txt"
dev = "cws.txt"
batch_size = 16
options = {{max-length = 64}}
"""


@pytest.fixture(scope="module")
def made_up(tmp_path_factory):
    """24 made-up sentences for each of a NER, a CWS and a similarity member (:func:`write_multitask_data`), and
    ``mt.toml``: :data:`CONFIG` on the first two."""
    out = write_multitask_data(tmp_path_factory.mktemp("made_up"))
    (out / "mt.toml").write_text(CONFIG.format(scheme="real-time", extra=""), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """48 CLUENER sentences and 48 SXU sentences, and a config naming them (the real sample a tiny model learns)."""
    out = tmp_path_factory.mktemp("mt")
    write_ner_jsonl(read_ner(DATA / "ner/cluener/train.json")[:48], out / "ner.json")
    write_segmented(read_segmented(DATA / "cws/sxu/train.txt")[:48], out / "cws.txt")
    (out / "mt.toml").write_text(CONFIG.format(scheme="real-time", extra=""), encoding="utf-8")
    return out


# ------------------------------------------------------------------------------------------ config errors
BAD = [
    ('[[tasks]]\nname = "ner"\ntask = "ner"\ntrain = "ner.json"\ndev = "ner.json"\n', "at least two"),
    (CONFIG.format(scheme="real-time", extra="").replace('batch_size = 16', 'batch_sise = 16'),
     "task 'seg': batch_sise: not a key"),
    (CONFIG.format(scheme="real-time", extra="").replace('name = "seg"', 'name = "ner"'), "task 'ner': name: two"),
    (CONFIG.format(scheme="real-time", extra="").replace('train = "cws.txt"', 'train = "nope.txt"'),
     "task 'seg': train: "),
    (CONFIG.format(scheme="real-time", extra="").replace('head = "crf"', 'head = "lstm"'),
     "task 'ner': options.head: expected one of"),
    (CONFIG.format(scheme="real-time", extra="").replace('max-length = 64', 'max-length = "64"'),
     "task 'seg': options.max-length: expected an integer"),
    (CONFIG.format(scheme="real-time", extra="").replace('max-length = 64', 'window = 64'),
     "task 'seg': options.window: not an option of the cws task"),
    (CONFIG.format(scheme="real-time", extra="").replace('task = "cws"', 'task = "pos"'),
     "task 'seg': task: unknown task 'pos'"),
    (CONFIG.format(scheme="softmax", extra=""), "weighting.scheme: 'softmax' is not one of"),
    (CONFIG.format(scheme="main-auxiliary", extra='main = "pos"'), "weighting.main: 'pos' is not the name"),
    ("tasks = [", "not valid TOML"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_a_bad_config_names_the_file_the_member_and_the_key(made_up, tmp_path, text, message):
    config = made_up / "bad.toml"
    config.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.toml:(\d+:)? .*" + message.replace("(", r"\(")):  # a line: TOML's own
        read_config(config)


def test_the_cli_refuses_a_bad_config_with_a_non_zero_exit(made_up, tmp_path, capsys):
    config = made_up / "bad.toml"
    config.write_text(CONFIG.format(scheme="real-time", extra="").replace('head = "crf"', 'head = "lstm"'))
    assert main(["train", "multitask", "--config", str(config), "--out", str(tmp_path / "run"), "--encoder", "tiny",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "bad.toml" in err and "task 'ner'" in err and "options.head" in err
    # main-auxiliary chosen on the command line needs `main` in the file
    assert main(["train", "multitask", "--config", str(made_up / "mt.toml"), "--weighting", "main-auxiliary",
                 "--out", str(tmp_path / "run"), "--encoder", "tiny", "--quiet"]) == 2
    assert "mt.toml" in (err := capsys.readouterr().err) and "main" in err


def test_yaml_configs_without_pyyaml_say_to_use_toml(made_up, monkeypatch):
    (made_up / "mt.yaml").write_text("tasks: []\n", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "yaml", None)  # `import yaml` raises ImportError
    with pytest.raises(ConfigError, match="mt.yaml: YAML configs need PyYAML.*TOML"):
        read_config(made_up / "mt.yaml")


def test_a_yaml_config_reads_like_the_toml_one(made_up):
    yaml = pytest.importorskip("yaml")
    import tomllib

    (made_up / "same.yaml").write_text(yaml.safe_dump(tomllib.loads((made_up / "mt.toml").read_text())))
    assert read_config(made_up / "same.yaml") == read_config(made_up / "mt.toml")


# ------------------------------------------------------------------------------------------ learning, one pass
@pytest.fixture(scope="module")
def run(data_dir):
    out = data_dir / "run"
    assert main(["train", "multitask", "--config", str(data_dir / "mt.toml"), "--out", str(out), "--encoder", "tiny",
                 "--epochs", "10", "--batch-size", "16", "--lr", "3e-3", "--warmup", "0.05", "--seed", "0",
                 "--eval-every", "20", "--log-every", "4", "--quiet"]) == 0
    return out


@pytest.mark.needs_data
def test_a_tiny_model_learns_ner_and_cws_together_through_the_cli(run, data_dir, capsys):
    pipe = zhie.load(run)
    assert [m.head_name for m in pipe.task.members] == ["ner", "seg"]
    ner = pipe.member("ner").evaluate(read_ner(data_dir / "ner.json"))
    seg = pipe.member("seg").evaluate(read_segmented(data_dir / "cws.txt"))
    assert ner["micro"]["f1"] >= 0.9 and seg["f1"] >= 0.95, (ner["micro"], seg)

    text = read_ner(data_dir / "ner.json")[0].text
    assert main(["predict", str(run), text]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["text"] == text and set(line["tasks"]) == {"ner", "seg"}
    assert "".join(w["text"] for w in line["tasks"]["seg"]) == text
    assert all(text[e["start"]:e["end"]] == e["text"] for e in line["tasks"]["ner"])

    assert main(["eval", str(run), "--task", "seg", "--data", str(data_dir / "cws.txt")]) == 0
    assert json.loads(capsys.readouterr().out)["f1"] == pytest.approx(seg["f1"])
    assert main(["eval", str(run), "--data", str(data_dir / "cws.txt")]) == 2  # which member?
    assert "--task NAME" in capsys.readouterr().err
    assert main(["eval", str(run), "--task", "pos", "--data", str(data_dir / "cws.txt")]) == 2
    assert "no member task 'pos'" in capsys.readouterr().err


@pytest.mark.needs_data
def test_predict_runs_the_encoder_once_per_batch_for_every_member(run, data_dir):
    pipe = zhie.load(run)
    texts = [ex.text for ex in read_ner(data_dir / "ner.json")[:6]]  # each fits one 64-token window
    calls = []
    hook = pipe.model.encoder.register_forward_hook(lambda module, args, output: calls.append(1))
    try:
        predictions = pipe.predict(texts, batch_size=4)
    finally:
        hook.remove()
    assert len(calls) == 2  # ceil(6 / 4), not one pass per member
    for name in ("ner", "seg"):  # the same as each member alone (up to float rounding of the scores)
        alone = pipe.member(name).predict(texts, batch_size=4)
        assert [[(s.start, s.end, s.label) for s in p[name]] for p in predictions] == \
            [[(s.start, s.end, s.label) for s in spans] for spans in alone]


@pytest.mark.needs_data
def test_every_batch_logs_each_task_loss_and_the_weights_applied(run):
    records = read_metrics(run / "metrics.jsonl")
    rows = [row for r in records for row in r["per_batch"]]
    assert [row["batch"] for row in rows] == list(range(1, records[-1]["step"] + 1))
    for row in rows:  # real-time normalisation: α_i = 1 / L_i
        for name in ("ner", "seg"):
            assert row["weights"][name] * row["losses"][name] == pytest.approx(1.0, rel=1e-5)
    assert set(records[-1]["task_losses"]) == {"ner", "seg"}
    assert records[-1]["dev"]["score"] == pytest.approx(
        (records[-1]["dev"]["ner/f1"] + records[-1]["dev"]["seg/f1"]) / 2)
    steps, start = read_metrics(run / "metrics.jsonl", kind="step"), 0  # the means of each window of steps
    assert [r["step"] for r in steps] == sorted({*range(4, records[-1]["step"] + 1, 4), records[-1]["step"]})
    for record in steps:
        window = [row for row in rows if start < row["batch"] <= record["step"]]
        for key, name in (("task_losses", "losses"), ("task_weights", "weights")):
            assert record[key] == pytest.approx({n: sum(r[name][n] for r in window) / len(window)
                                                 for n in ("ner", "seg")}, rel=1e-6)
        start = record["step"]


# ------------------------------------------------------------------------------------------ sampling, MGDA-UB, paths
def _config(data, tmp_path, scheme: str, extra: str = "", tail: str = "") -> object:
    config = tmp_path / "mt.toml"
    config.write_text(CONFIG.format(scheme=scheme, extra=extra).replace('"ner.json"', f'"{data}/ner.json"')
                      .replace('"cws.txt"', f'"{data}/cws.txt"') + tail, encoding="utf-8")
    return config


# ------------------------------------------------------------------------------------------ weights, sampling, the log
def built(config, seed: int = 0):
    """What zhie.fit builds before training: the task (its items encoded), the model and the objective."""
    train, dev = MultiTask.read_splits(None, None, tasks_file=config)
    task_config = MultiTask.configure(train, encoder="tiny", tasks_file=config)
    encoder, tokenizer = prepare_encoder("tiny", texts=MultiTask.texts(train + dev), mode=task_config.mode)
    task = MultiTask(task_config, tokenizer)
    task.loop_config(TrainConfig(seed=seed))
    task.encode(train)
    with seeded(0):
        model = Model(encoder, task.build_heads(encoder.config.hidden_size))
        objective = task.objective(encoder.config.hidden_size)
    return task, model, objective


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


@pytest.mark.parametrize("weighting", ['scheme = "equal"', 'scheme = "real-time"', 'scheme = "prior"',
                                       'scheme = "generalised-mean"\ngamma = 2.0', 'scheme = "grad-normalise"',
                                       'scheme = "mgda"', 'scheme = "main-auxiliary"\nmain = "seg"',
                                       'scheme = "uncertainty"'])
def test_the_objective_moves_the_encoder_by_the_weighted_task_gradients(made_up, tmp_path, weighting):
    """One step of every scheme: each member's loss and encoder gradient computed here on its own, the weights from
    them by each scheme's formula (MGDA and main-auxiliary for two tasks in closed form); the logged losses and
    weights are these, and the objective's gradient over the encoder is ``Σ α_i ∇L_i``. The batch is drawn from torch's
    generator (as in training), seeded here: one whose two gradients conflict, so main-auxiliary projects."""
    task, model, objective = built(multitask_config(made_up, tmp_path, weighting))
    model.eval()  # no dropout: the same losses here as in the objective
    with seeded(0):
        batch = task.collate([0])
    total = objective(model, batch)
    (row,) = objective.log()["per_batch"]
    params = list(model.encoder.parameters())
    losses, grads = [], []
    for member, member_loss in zip(task.members, objective.member_losses):
        prefix = member.head_name + "/"
        loss = member_loss(model, {k[len(prefix):]: v for k, v in batch.items() if k.startswith(prefix)})
        losses.append(loss.item())
        grads.append(flat(torch.autograd.grad(loss, params)).double())
    (ner, seg), (g1, g2) = losses, grads
    scheme = weighting.split('"')[1]
    if scheme == "equal":
        alpha = [0.5, 0.5]
    elif scheme == "real-time":
        alpha = [1 / ner, 1 / seg]
    elif scheme == "prior":  # each member's own prior loss over its items in batches of 4
        alpha = [1 / m.prior_loss(items, 4) for m, items in zip(task.members, task.member_items)]
    elif scheme == "generalised-mean":  # the gradient of sqrt((ner² + seg²) / 2)
        mean = math.sqrt((ner ** 2 + seg ** 2) / 2)
        alpha = [ner / (2 * mean), seg / (2 * mean)]
    elif scheme == "grad-normalise":
        alpha = [1 / g1.norm().item(), 1 / g2.norm().item()]
    elif scheme == "mgda":  # the point of the segment [g1, g2] nearest 0
        a = ((g2 - g1) @ g2 / (g1 - g2).norm() ** 2).clamp(0, 1).item()
        alpha = [a, 1 - a]
    elif scheme == "main-auxiliary":  # seg is the main task; ner is projected only when it conflicts
        alpha = [max(0.0, -(g1 @ g2).item()) / (g1 @ g1).item(), 1.0]
    else:  # uncertainty: exp(-s_i) / 2 with s_i starting at 0
        alpha = [0.5, 0.5]
    assert [row["losses"]["ner"], row["losses"]["seg"]] == pytest.approx(losses, rel=1e-5)
    assert [row["weights"]["ner"], row["weights"]["seg"]] == pytest.approx(alpha, rel=1e-4, abs=1e-9)
    total_grad = flat(torch.autograd.grad(total, params)).double()
    expected = alpha[0] * g1 + alpha[1] * g2
    assert (total_grad - expected).norm() <= 1e-4 * expected.norm()
    if scheme == "main-auxiliary":
        assert g1 @ g2 < 0  # a conflict: ner's gradient is projected onto the plane normal to seg's
        # neither loss increases to first order: g_i · ∇ >= 0, up to float32 rounding relative to |g_i| |∇| (ner's is 0
        # in exact arithmetic, and its rounding in the sums over the ~10^5 encoder parameters is about 1e-9 of it)
        assert all(g @ total_grad >= -1e-6 * g.norm() * total_grad.norm() for g in (g1, g2))


@pytest.mark.parametrize("mode, p_ner", [("proportional", 9 / (9 + 24)), ("temperature", 3 / (3 + 24 ** 0.5))])
def test_sampled_steps_draw_each_member_as_often_as_its_probability(made_up, tmp_path, mode, p_ner):
    """NER's sampling_weight 9 against CWS's 24 items, T = 2 for temperature: p ∝ s^(1/T). 4,000 draws, the share of
    NER within 4 standard deviations; the draws are a function of the seed and the step number alone."""
    config = multitask_config(made_up, tmp_path, 'scheme = "real-time"', sampling=f'mode = "{mode}"\ntemperature = 2.0')
    config.write_text(config.read_text().replace('batch_size = 4\n', 'batch_size = 4\nsampling_weight = 9\n', 1))
    task, _, _ = built(config)
    assert len(task.member_items[1]) == 24
    n = 4000
    draws = [task.sampled_member(k) for k in range(n)]
    assert abs(draws.count(0) / n - p_ner) < 4 * math.sqrt(p_ner * (1 - p_ner) / n)
    again, _, _ = built(config)
    assert [again.sampled_member(k) for k in range(200)] == draws[:200]  # the same in every process
    other_seed, _, _ = built(config, seed=1)
    assert [other_seed.sampled_member(k) for k in range(200)] != draws[:200]


def test_sampled_training_takes_the_drawn_members_each_with_its_own_loss(made_up, tmp_path):
    """``equal`` on sampled steps weighs the drawn member's loss by 1 (one task per step); the members trained are
    those drawn from the run's seed, counted in ``task_batches``."""
    config = multitask_config(made_up, tmp_path, 'scheme = "equal"', sampling='mode = "proportional"')
    zhie.fit("multitask", out=tmp_path / "run", encoder="tiny", tasks_file=config,
             config=TrainConfig(max_steps=8, batch_size=4, lr=1e-3, head_lr=1e-3, seed=3), resume=False, progress=False)
    (record,) = read_metrics(tmp_path / "run/metrics.jsonl")
    rows = record["per_batch"]
    task, _, _ = built(config, seed=3)
    names = ["ner", "seg"]
    assert [list(row["losses"]) for row in rows] == [[names[task.sampled_member(k)]] for k in range(8)]
    assert all(list(row["weights"].values()) == [1.0] for row in rows)
    drawn = [name for row in rows for name in row["losses"]]
    assert record["task_batches"] == {name: drawn.count(name) for name in names} and set(drawn) == set(names)
    assert record["task_weights"] == {"ner": 1.0, "seg": 1.0}


def test_the_log_keeps_evenly_spaced_batches_and_exact_means(made_up, tmp_path):
    """1,000 batches between two evaluations: at most 101 rows in the record and in the checkpoint (every k-th batch,
    k a power of 2, and the last), the means and counts over all 1,000; the state a checkpoint keeps gives the same
    record and the same next sampled member back."""
    config = multitask_config(made_up, tmp_path, 'scheme = "real-time"', sampling='mode = "proportional"')
    task, _, objective = built(config)
    for b in range(1, 1001):
        present = torch.tensor([b % 3 == 0, b % 3 != 0])
        objective.record(torch.tensor([b, 2.0 * b]) * present, torch.tensor([1.0, 0.5]) * present, present)
    task.draws = 1000
    state = objective.get_extra_state()
    assert len(state["rows"]) <= 101
    _, _, resumed = built(config)
    resumed.set_extra_state(state)
    assert resumed.task.draws == 1000
    log, log_resumed = objective.log(), resumed.log()
    assert log == log_resumed and objective.log() == {}  # reported once
    batches = [row["batch"] for row in log["per_batch"]]
    assert 50 <= len(batches) <= 101 and batches[-1] == 1000
    steps = {b - a for a, b in zip(batches, batches[1:-1])}
    assert len(steps) == 1 and steps.pop() in (8, 16)  # evenly spaced, a power of 2 apart
    ner = range(3, 1001, 3)
    assert log["task_batches"] == {"ner": len(ner), "seg": 1000 - len(ner)}
    assert log["task_losses"]["ner"] == pytest.approx(sum(ner) / len(ner))
    assert log["task_weights"] == {"ner": 1.0, "seg": 0.5}


@pytest.mark.parametrize("tail, message", [
    ('\n[sampling]\nmode = "temperature"\n', "the mgda scheme needs every task's loss"),
    ('\n[sampling]\nmode = "round-robin"\n', "sampling.mode: 'round-robin' is not one of"),
    ('\n[sampling]\ntemperature = 0\n', "sampling.temperature: expected a positive number"),
    ('\n[sampling]\nshuffle = true\n', "sampling.shuffle: not a key of"),
])
def test_sampling_errors_name_the_key(made_up, tmp_path, tail, message):
    config = _config(made_up, tmp_path, "mgda", tail=tail)
    with pytest.raises(ConfigError, match="mt.toml: " + message):
        zhie.fit("multitask", out=tmp_path / "run", encoder="tiny", tasks_file=config,
                 config=TrainConfig(max_steps=1), resume=False, progress=False)


def test_gradients_over_separate_encoder_outputs_are_orthogonal_blocks():
    from zhie.multitask.objective import MultiTaskLoss
    from zhie.multitask.weighting import MGDA

    torch = pytest.importorskip("torch")
    h1, h2 = torch.randn(3, 4, requires_grad=True), torch.randn(2, 4, requires_grad=True)
    losses = torch.stack([(h1 ** 2).sum(), (h2 * 3).sum()])
    g = MultiTaskLoss.gradients(losses, [[h1], [h2]])
    assert g.shape == (2, 20)
    assert torch.allclose(g[0, :12], 2 * h1.detach().reshape(-1)) and torch.all(g[0, 12:] == 0)
    assert torch.allclose(g[1, 12:], torch.full((8,), 3.0)) and torch.all(g[1, :12] == 0)
    # MGDA on orthogonal gradients: α_i ∝ 1/‖g_i‖²
    inverse = 1 / g.norm(dim=1) ** 2
    assert torch.allclose(MGDA().weights(losses, g), inverse / inverse.sum(), atol=1e-6)
    shared = torch.randn(5, requires_grad=True)
    both = torch.stack([(shared ** 2).sum(), shared.sum()])
    assert torch.allclose(MultiTaskLoss.gradients(both, [[shared], [shared]]),
                          torch.stack([2 * shared.detach(), torch.ones(5)]))


def test_mgda_over_encoder_outputs_trains_and_weights_by_inverse_squared_norms(made_up, tmp_path):
    config = _config(made_up, tmp_path, "mgda", extra='gradients = "encoder-output"')
    zhie.fit("multitask", out=tmp_path / "run", encoder="tiny", tasks_file=config,
             config=TrainConfig(max_steps=3, batch_size=8, lr=1e-3, head_lr=1e-3), resume=False, progress=False)
    rows = [row for r in read_metrics(tmp_path / "run/metrics.jsonl") for row in r["per_batch"]]
    assert len(rows) == 3 and all(sum(row["weights"].values()) == pytest.approx(1, abs=1e-5) for row in rows)
    assert zhie.load(tmp_path / "run").task.config.gradients == "encoder-output"


def test_a_relation_members_schema_path_is_relative_to_the_config(made_up, tmp_path):
    relations, schema = write_relation_data(tmp_path)  # a schema.json beside the data too
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/schema.json").write_text(schema.read_text(encoding="utf-8"), encoding="utf-8")
    text = (f'[[tasks]]\nname = "re"\ntask = "re"\ntrain = "{relations}"\ndev = "{relations}"\n'
            f'options = {{schema = "schema.json"}}\n\n'
            f'[[tasks]]\nname = "seg"\ntask = "cws"\ntrain = "{made_up}/cws.txt"\ndev = "{made_up}/cws.txt"\n')
    (tmp_path / "sub/mt.toml").write_text(text, encoding="utf-8")
    specs, _ = read_config(tmp_path / "sub/mt.toml")
    assert specs[0].options["schema"] == str(tmp_path / "sub/schema.json")
    (tmp_path / "sub/mt.toml").write_text(text.replace("schema.json", "nope.json"), encoding="utf-8")
    with pytest.raises(ConfigError, match="task 're': options.schema: .*nope.json does not exist"):
        read_config(tmp_path / "sub/mt.toml")


def test_a_run_reads_its_config_once(made_up, tmp_path, monkeypatch):
    """zhie.fit asks for the config three times (read_splits, configure, data_files): the file is read once, and read
    again once it changes."""
    from zhie.multitask import config as mtconfig

    reads, load = [], mtconfig.load_file
    monkeypatch.setattr(mtconfig, "load_file", lambda path: reads.append(path) or load(path))
    config = _config(made_up, tmp_path, "equal")
    train, _ = MultiTask.read_splits(None, None, tasks_file=config)
    assert MultiTask.configure(train, encoder="tiny", tasks_file=config).weighting == "equal"
    assert set(MultiTask.data_files(None, None, tasks_file=config)) == {"config", "ner/train", "ner/dev", "seg/train",
                                                                        "seg/dev"}
    assert len(reads) == 1
    config.write_text(config.read_text(encoding="utf-8").replace('"equal"', '"mgda"'), encoding="utf-8")
    assert read_config(config)[1] == {"scheme": "mgda"} and len(reads) == 2


def test_a_config_that_is_not_utf8_names_the_file(tmp_path):
    config = tmp_path / "mt.toml"
    config.write_bytes('[weighting]\nscheme = "equal"  # 权重\n'.encode("gb18030"))
    with pytest.raises(ConfigError, match=r"mt\.toml:2: not valid UTF-8 .*; save it as UTF-8"):
        read_config(config)
