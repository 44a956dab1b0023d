"""Multi-task training (issue 13): config errors, a tiny NER + CWS model that learns both through the CLI, one encoder
pass per prediction batch for every member, the scheme's weights logged per batch."""

from __future__ import annotations

import json
import math
import sys

import pytest

import zhie
from zhie.cli import main
from zhie.data import read_ner, write_ner_jsonl
from zhie.data.cws import read_segmented, write_segmented
from zhie.tasks.multitask import ConfigError, read_config
from zhie.training import TrainConfig
from zhie.training.report import read_metrics

from .conftest import DATA

needs_data = pytest.mark.skipif(not DATA.exists(), reason="../shared/data is not here")

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
def data_dir(tmp_path_factory):
    """48 CLUENER sentences and 48 SXU sentences, and a config naming them."""
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


@needs_data
@pytest.mark.parametrize("text, message", BAD)
def test_a_bad_config_names_the_file_the_member_and_the_key(data_dir, tmp_path, text, message):
    config = data_dir / "bad.toml"
    config.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match="bad.toml: .*" + message.replace("(", r"\(")):
        read_config(config)


@needs_data
def test_the_cli_refuses_a_bad_config_with_a_non_zero_exit(data_dir, tmp_path, capsys):
    config = data_dir / "bad.toml"
    config.write_text(CONFIG.format(scheme="real-time", extra="").replace('head = "crf"', 'head = "lstm"'))
    assert main(["train", "multitask", "--config", str(config), "--out", str(tmp_path / "run"), "--encoder", "tiny",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "bad.toml" in err and "task 'ner'" in err and "options.head" in err
    # main-auxiliary chosen on the command line needs `main` in the file
    assert main(["train", "multitask", "--config", str(data_dir / "mt.toml"), "--weighting", "main-auxiliary",
                 "--out", str(tmp_path / "run"), "--encoder", "tiny", "--quiet"]) == 2
    assert "mt.toml" in (err := capsys.readouterr().err) and "main" in err


@needs_data
def test_yaml_configs_without_pyyaml_say_to_use_toml(data_dir, monkeypatch):
    (data_dir / "mt.yaml").write_text("tasks: []\n", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "yaml", None)  # `import yaml` raises ImportError
    with pytest.raises(ConfigError, match="mt.yaml: YAML configs need PyYAML.*TOML"):
        read_config(data_dir / "mt.yaml")


@needs_data
def test_a_yaml_config_reads_like_the_toml_one(data_dir):
    yaml = pytest.importorskip("yaml")
    import tomllib

    (data_dir / "same.yaml").write_text(yaml.safe_dump(tomllib.loads((data_dir / "mt.toml").read_text())))
    assert read_config(data_dir / "same.yaml") == read_config(data_dir / "mt.toml")


# ------------------------------------------------------------------------------------------ learning, one pass
@pytest.fixture(scope="module")
def run(data_dir):
    out = data_dir / "run"
    assert main(["train", "multitask", "--config", str(data_dir / "mt.toml"), "--out", str(out), "--encoder", "tiny",
                 "--epochs", "10", "--batch-size", "16", "--lr", "3e-3", "--warmup", "0.05", "--seed", "0",
                 "--eval-every", "20", "--log-every", "4", "--quiet"]) == 0
    return out


@needs_data
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


@needs_data
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


@needs_data
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


@needs_data
@pytest.mark.parametrize("scheme, extra", [("mgda", ""), ("main-auxiliary", 'main = "seg"'), ("prior", ""),
                                           ("generalised-mean", "gamma = 2.0"), ("uncertainty", "")])
def test_each_scheme_trains_and_logs_its_weights(data_dir, tmp_path, scheme, extra):
    config = tmp_path / "mt.toml"
    config.write_text(CONFIG.format(scheme=scheme, extra=extra).replace('"ner.json"', f'"{data_dir}/ner.json"')
                      .replace('"cws.txt"', f'"{data_dir}/cws.txt"'), encoding="utf-8")
    zhie.fit("multitask", out=tmp_path / "run", encoder="tiny", config_file=config,
             config=TrainConfig(max_steps=3, batch_size=8, lr=1e-3), resume=False, progress=False)
    rows = [row for r in read_metrics(tmp_path / "run/metrics.jsonl") for row in r["per_batch"]]
    assert len(rows) == 3
    for row in rows:
        w, loss = row["weights"], row["losses"]
        assert all(math.isfinite(v) and v >= 0 for v in [*w.values(), *loss.values()])
        if scheme == "mgda":
            assert w["ner"] + w["seg"] == pytest.approx(1.0, abs=1e-5)
        if scheme == "main-auxiliary":
            assert w["seg"] == 1.0
        if scheme == "generalised-mean":  # α_i ∝ L_i^(γ-1)
            assert w["ner"] / w["seg"] == pytest.approx(loss["ner"] / loss["seg"], rel=1e-4)
        if scheme == "uncertainty":  # exp(-s_i) / 2 with s_i starting at 0
            assert rows[0]["weights"] == {"ner": 0.5, "seg": 0.5}
        if scheme == "prior":  # 1 / L_i^prior, fixed
            assert w == rows[0]["weights"]


# ------------------------------------------------------------------------------------------ sampling, MGDA-UB, paths
def _config(data_dir, tmp_path, scheme: str, extra: str = "", tail: str = "") -> object:
    config = tmp_path / "mt.toml"
    config.write_text(CONFIG.format(scheme=scheme, extra=extra).replace('"ner.json"', f'"{data_dir}/ner.json"')
                      .replace('"cws.txt"', f'"{data_dir}/cws.txt"') + tail, encoding="utf-8")
    return config


@needs_data
@pytest.mark.parametrize("mode, scheme", [("proportional", "real-time"), ("temperature", "uncertainty")])
def test_sampled_steps_draw_one_member_each_with_its_probability(data_dir, tmp_path, mode, scheme):
    config = _config(data_dir, tmp_path, scheme, tail=f'\n[sampling]\nmode = "{mode}"\ntemperature = 2.0\n')
    zhie.fit("multitask", out=tmp_path / "run", encoder="tiny", config_file=config,
             config=TrainConfig(epochs=100, max_steps=40, batch_size=8, lr=1e-3), resume=False,
             progress=False)
    rows = [row for r in read_metrics(tmp_path / "run/metrics.jsonl") for row in r["per_batch"]]
    assert len(rows) == 40 and all(len(row["losses"]) == len(row["weights"]) == 1 for row in rows)
    if scheme == "real-time":  # the sampled member's own weight, 1 / L_i
        assert all(math.prod(row["weights"].values()) * math.prod(row["losses"].values()) == pytest.approx(1, rel=1e-5)
                   for row in rows)
    pipe = zhie.load(tmp_path / "run")
    c = pipe.task.config
    assert (c.sampling, c.temperature) == (mode, 2.0)
    n = [48, 48]  # one item per sentence in both members; a sampling weight replaces the count
    assert c.probabilities(n) == pytest.approx([0.5, 0.5])
    c.members[0]["sampling_weight"] = 9.0
    t = 1.0 if mode == "proportional" else 2.0
    assert c.probabilities(n)[0] == pytest.approx(9 ** (1 / t) / (9 ** (1 / t) + 48 ** (1 / t)))
    seen = {name for row in rows for name in row["losses"]}
    assert seen == {"ner", "seg"}


@needs_data
@pytest.mark.parametrize("tail, message", [
    ('\n[sampling]\nmode = "temperature"\n', "the mgda scheme needs every task's loss"),
    ('\n[sampling]\nmode = "round-robin"\n', "sampling.mode: 'round-robin' is not one of"),
    ('\n[sampling]\ntemperature = 0\n', "sampling.temperature: expected a positive number"),
    ('\n[sampling]\nshuffle = true\n', "sampling.shuffle: not a key of"),
])
def test_sampling_errors_name_the_key(data_dir, tmp_path, tail, message):
    config = _config(data_dir, tmp_path, "mgda", tail=tail)
    with pytest.raises(ConfigError, match="mt.toml: " + message):
        zhie.fit("multitask", out=tmp_path / "run", encoder="tiny", config_file=config,
                 config=TrainConfig(max_steps=1), resume=False, progress=False)


def test_gradients_over_separate_encoder_outputs_are_orthogonal_blocks():
    from zhie.multitask.weighting import MGDA
    from zhie.tasks.multitask import MultiTaskLoss

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


@needs_data
def test_mgda_over_encoder_outputs_trains_and_weights_by_inverse_squared_norms(data_dir, tmp_path):
    config = _config(data_dir, tmp_path, "mgda", extra='gradients = "encoder-output"')
    zhie.fit("multitask", out=tmp_path / "run", encoder="tiny", config_file=config,
             config=TrainConfig(max_steps=3, batch_size=8, lr=1e-3), resume=False, progress=False)
    rows = [row for r in read_metrics(tmp_path / "run/metrics.jsonl") for row in r["per_batch"]]
    assert len(rows) == 3 and all(sum(row["weights"].values()) == pytest.approx(1, abs=1e-5) for row in rows)
    assert zhie.load(tmp_path / "run").task.config.gradients == "encoder-output"


@needs_data
def test_a_relation_members_schema_path_is_relative_to_the_config(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/schema.json").write_text((DATA / "re/cmeie/schema.json").read_text(encoding="utf-8"))
    text = (f'[[tasks]]\nname = "re"\ntask = "re"\ntrain = "{DATA}/re/cmeie/dev.jsonl"\n'
            f'dev = "{DATA}/re/cmeie/dev.jsonl"\noptions = {{schema = "schema.json"}}\n\n'
            f'[[tasks]]\nname = "seg"\ntask = "cws"\ntrain = "{DATA}/cws/sxu/test.txt"\n'
            f'dev = "{DATA}/cws/sxu/test.txt"\n')
    (tmp_path / "sub/mt.toml").write_text(text, encoding="utf-8")
    specs, _ = read_config(tmp_path / "sub/mt.toml")
    assert specs[0].options["schema"] == str(tmp_path / "sub/schema.json")
    (tmp_path / "sub/mt.toml").write_text(text.replace("schema.json", "nope.json"), encoding="utf-8")
    with pytest.raises(ConfigError, match="task 're': options.schema: .*nope.json does not exist"):
        read_config(tmp_path / "sub/mt.toml")
