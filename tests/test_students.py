"""Same-language distillation (``zhie distill student``): the soft-target losses against hand computations, the
layers a student keeps, the ensemble, and tiny teachers of every task kind whose students must agree with them."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import zhie
from zhie import encoders
from zhie.data import write_ner_jsonl
from zhie.heads import SoftmaxTagger
from zhie.losses.distill import (
    dense_targets,
    similarity_matrix_loss,
    soft_cells,
    span_soft_loss,
    stack_cells,
    tag_soft_loss,
)
from zhie.model import Ensemble, Model
from zhie.training import TrainConfig, student_models, students, teachers
from zhie.training.student_models import student_layers
from zhie.training.students import dilation_list, distill_student

from .tiny_models import nested_corpus, relation_corpus, trained, write_pairs, write_segmented_corpus


# ------------------------------------------------------------------------------------------------ losses by hand
def test_span_soft_loss_is_the_soft_mce_of_the_tempered_logits_by_hand():
    s = torch.tensor([[[[1.0, -2.0], [-1e12, 0.5]]]])  # [1, 1, 2, 2]; one masked cell
    t = torch.tensor([[[[0.9, 0.0], [0.0, 0.3]]]])
    temp = 2.0
    got = span_soft_loss(s, t, temp)
    x = [1.0 / temp, -2.0 / temp, 0.5 / temp]
    q = [0.9, 0.0, 0.3]
    neg = math.log(1 + sum((1 - qi) * math.exp(xi) for xi, qi in zip(x, q)))
    pos = math.log(1 + sum(qi * math.exp(-xi) for xi, qi in zip(x, q)))
    assert got.shape == (1, 1)
    assert got.item() == pytest.approx((neg + pos) * temp ** 2, rel=1e-6)


def test_stored_span_cells_give_back_the_teachers_probabilities_above_the_floor():
    logits = torch.tensor([[[[2.0, -1.0, -9.0], [-1e12, 0.0, -5.0], [-1e12, -1e12, -3.0]]]]).repeat(2, 1, 1, 1)
    logits[1, 0, 0, 0] = -8.0
    rows = soft_cells(logits, temperature=1.0)
    cells, probs = stack_cells(rows)
    dense = dense_targets(cells, probs, logits)
    expected = torch.sigmoid(2 * logits)
    expected[expected < 1e-3] = 0
    assert torch.allclose(dense, expected, atol=1e-3)  # fp16 storage
    assert len(rows[0][0]) == 4 and len(rows[1][0]) == 3  # 2, -1, 0, -3 kept; -5, -9 and masked cells are not


def test_tag_soft_loss_is_t_squared_kl_over_the_masked_tokens():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    temp = 3.0
    got = tag_soft_loss(student, teacher, mask, temp)
    for b in range(2):
        kl = F.kl_div(F.log_softmax(student[b] / temp, -1), F.log_softmax(teacher[b] / temp, -1), log_target=True,
                      reduction="none").sum(-1)
        assert got[b].item() == pytest.approx((kl[mask[b]].mean() * temp ** 2).item(), rel=1e-5)


def test_similarity_matrix_loss_compares_pair_cosines_of_any_width():
    torch.manual_seed(1)
    s, t = torch.randn(3, 4), torch.randn(3, 6)
    cos = lambda v: [[F.cosine_similarity(v[i], v[j], dim=0).item() for j in range(3)] for i in range(3)]  # noqa: E731
    cs, ct = cos(s), cos(t)
    want = np.mean([(cs[i][j] - ct[i][j]) ** 2 for i in range(3) for j in range(3) if i != j])
    assert similarity_matrix_loss(s, t).item() == pytest.approx(want, rel=1e-5)
    assert similarity_matrix_loss(t * 5, t).item() == pytest.approx(0.0, abs=1e-6)


# ------------------------------------------------------------------------------------------------ layers, ensemble
def test_student_layers_first_spread_and_indices():
    assert student_layers("first", 4, 12) == [0, 1, 2, 3]
    assert student_layers("spread", 4, 12) == [2, 5, 8, 11]
    assert student_layers("spread", 3, 12) == [3, 7, 11]
    assert student_layers("spread", 1, 2) == [1]
    assert student_layers("0,5,11", None, 12) == [0, 5, 11]
    for keep, layers in (("first", None), ("spread", 13), ("0,x", None), ("1,2", 3)):
        with pytest.raises(ValueError):
            student_layers(keep, layers, 12)


def test_select_layers_keeps_those_layers_in_order_and_refuses_others():
    model, _ = encoders.tiny(["甲乙丙"], layers=3)
    layers = list(model.encoder.layer)
    encoders.select_layers(model, [0, 2])
    assert list(model.encoder.layer) == [layers[0], layers[2]] and model.config.num_hidden_layers == 2
    for bad in ([2, 1], [0, 0], [5], []):
        with pytest.raises(ValueError):
            encoders.select_layers(model, bad)


def test_ffn_activity_is_the_mean_absolute_activation_over_real_tokens():
    model, _ = encoders.tiny(["甲乙丙"], hidden_size=32, layers=2)
    model.eval()
    ids, mask = torch.tensor([[2, 5, 6, 3, 0], [2, 7, 3, 0, 0]]), torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    seen = []
    hook = model.encoder.layer[1].intermediate.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    activity = encoders.FfnActivity(model)
    activity.mask = mask
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    activity.close()
    hook.remove()
    expected = torch.cat([seen[0][0, :4], seen[0][1, :3]]).abs().mean(0)  # 7 real tokens, padding left out
    torch.testing.assert_close(activity.means()[1], expected)
    assert not model.encoder.layer[0].intermediate._forward_hooks  # closed: no hook left behind


def test_prune_ffn_keeps_the_most_important_neurons_and_the_layers_function_on_them():
    model, _ = encoders.tiny(["甲乙丙"], hidden_size=32, layers=2)
    model.eval()
    inner = model.config.intermediate_size  # 128
    ids, mask = torch.tensor([[2, 5, 6, 3]]), torch.ones(1, 4, dtype=torch.long)
    with torch.no_grad():  # half the neurons of each layer never contribute: their output weights are zero
        for layer in model.encoder.layer:
            layer.output.dense.weight[:, 1::2] = 0
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
    activity = [torch.rand(inner) + 0.5 for _ in model.encoder.layer]  # any activity: zero weights lose anyway
    kept_up = model.encoder.layer[0].intermediate.dense.weight[0::2].clone()
    encoders.prune_ffn(model, inner // 2, activity)
    assert model.config.intermediate_size == inner // 2
    assert torch.equal(model.encoder.layer[0].intermediate.dense.weight, kept_up)  # the even neurons, in order
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).last_hidden_state, expected)
    # among neurons that all contribute, the activity decides: the most active half stays
    model, _ = encoders.tiny(["甲乙丙"], hidden_size=32, layers=1)
    with torch.no_grad():
        model.encoder.layer[0].output.dense.weight.fill_(0.1)
    up = model.encoder.layer[0].intermediate.dense.weight.clone()
    encoders.prune_ffn(model, 3, [torch.tensor([0.0] * 100 + [5.0, 1.0, 9.0] + [0.0] * 25)])
    assert torch.equal(model.encoder.layer[0].intermediate.dense.weight, up[[100, 101, 102]])
    for bad in (0, inner + 1):
        with pytest.raises(ValueError, match="--ffn-width"):
            encoders.prune_ffn(model, bad, [torch.ones(3)])


def test_an_ensemble_answers_the_mean_of_its_members():
    heads = lambda: {"ner": SoftmaxTagger(128, 3)}  # noqa: E731
    a = Model(encoders.tiny(["甲乙丙"], seed=1)[0], heads()).eval()
    b = Model(encoders.tiny(["甲乙丙"], seed=2)[0], heads()).eval()
    ids, mask = torch.tensor([[2, 5, 6, 3]]), torch.ones(1, 4, dtype=torch.long)
    with torch.no_grad():
        got = Ensemble([a, b])(ids, mask)["ner"]
        assert torch.allclose(got, (a(ids, mask)["ner"] + b(ids, mask)["ner"]) / 2)


# ------------------------------------------------------------------------------------------------ students
def _config(epochs: int, lr: float = 2e-3) -> TrainConfig:
    return TrainConfig(epochs=epochs, batch_size=16, lr=lr, head_lr=lr, warmup=0.05, seed=0, eval_every=10**9)


def _agreement(teacher, student, texts) -> float:
    """The share of the teacher's predicted items (spans, words, triples) that the student predicts too."""
    key = lambda x: (x.start, x.end, x.label) if hasattr(x, "start") else (x.subject, x.predicate, x.object)  # noqa
    t = [{key(x) for x in row} for row in teacher.predict(texts)]
    s = [{key(x) for x in row} for row in student.predict(texts)]
    return sum(len(a & b) for a, b in zip(t, s)) / max(1, sum(len(a) for a in t))


def _exported_spans_agree(tmp_path, student, texts):
    """Export the student in ``tmp_path/s/best``, check that the export predicts the student's spans, and return both
    predictions (export first)."""
    from zhie.deploy.export import export

    export(tmp_path / "s" / "best", tmp_path / "onnx")
    onnx, torch_rows = zhie.load(tmp_path / "onnx").predict(texts), student.predict(texts)
    assert [[(x.start, x.end, x.label) for x in row] for row in onnx] == \
        [[(x.start, x.end, x.label) for x in row] for row in torch_rows]
    return onnx, torch_rows


@pytest.fixture(scope="module")
def ner_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("distill-data")
    write_ner_jsonl(nested_corpus(120, seed=1), d / "train.jsonl")
    write_ner_jsonl(nested_corpus(30, seed=2), d / "dev.jsonl")
    (d / "unlabelled.txt").write_text("\n".join(ex.text for ex in nested_corpus(150, seed=7)) + "\n",
                                      encoding="utf-8")
    return d


@pytest.mark.parametrize("head", ["gp", "crf"])
def test_a_one_layer_student_agrees_with_its_ner_teacher(ner_files, tmp_path, head):
    teacher = trained(f"ner-{head}")
    result = distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "s", dev=ner_files / "dev.jsonl",
                             unlabelled=[ner_files / "unlabelled.txt"], keep_layers="spread", encoder_layers=1,
                             config=_config(6), progress=False)
    assert result["finished"]
    student = zhie.load(tmp_path / "s" / "best")
    assert student.model.encoder.config.num_hidden_layers == 1
    texts = [ex.text for ex in nested_corpus(40, seed=9)]
    assert _agreement(zhie.load(teacher), student, texts) >= 0.9
    record = json.loads((tmp_path / "s" / "best" / "training.json").read_text(encoding="utf-8"))
    assert record["options"]["distilled_from"]["teachers"] == [str(teacher)]
    assert str(teacher) in (tmp_path / "s" / "best" / "README.md").read_text(encoding="utf-8")


def test_stored_targets_are_read_back_and_another_teacher_is_refused(ner_files, tmp_path, monkeypatch):
    teacher = trained("ner-gp")
    args = dict(out=tmp_path / "s", dev=ner_files / "dev.jsonl", unlabelled=[ner_files / "unlabelled.txt"],
                encoder_layers=1, config=_config(1), progress=False)
    distill_student([teacher], ner_files / "train.jsonl", **args)
    first = torch.load(tmp_path / "s" / teachers.TARGETS, weights_only=False)

    def no_teacher(*a, **k):
        raise AssertionError("the teacher ran again although its targets were stored")

    monkeypatch.setattr(teachers, "teacher_targets", no_teacher)
    distill_student([teacher], ner_files / "train.jsonl", **args)  # resumes: reads the stored targets
    again = torch.load(tmp_path / "s" / teachers.TARGETS, weights_only=False)
    assert [les.item for les in again["lessons"]] == [les.item for les in first["lessons"]]
    assert all(torch.equal(a.target[1], b.target[1]) for a, b in zip(again["lessons"], first["lessons"]))
    with pytest.raises(ValueError, match="resuming would mix two runs"):
        distill_student([teacher], ner_files / "train.jsonl", temperature=2.0, **args)
    with pytest.raises(ValueError, match=r"(?s)would mix two runs.*student\.hard_weight: 0\.5 -> 0\.9.*--no-resume"):
        distill_student([teacher], ner_files / "train.jsonl", hard_weight=0.9, **args)  # the same targets, other recipe


def test_an_ensemble_of_one_teacher_twice_stores_that_teachers_targets(ner_files, tmp_path):
    teacher = trained("ner-gp")
    common = dict(dev=ner_files / "dev.jsonl", encoder_layers=1, config=_config(1), progress=False)
    distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "one", **common)
    distill_student([teacher, teacher], ner_files / "train.jsonl", out=tmp_path / "two", **common)
    one, two = (torch.load(tmp_path / d / teachers.TARGETS, weights_only=False)["lessons"] for d in ("one", "two"))
    assert all(torch.equal(a.target[0], b.target[0]) and torch.allclose(a.target[1].float(), b.target[1].float())
               for a, b in zip(one, two))


def test_a_segmenter_student_agrees_with_its_teacher(tmp_path):
    teacher = trained("cws")
    data = write_segmented_corpus(tmp_path / "train.txt")
    distill_student([teacher], data, out=tmp_path / "s", dev=data, encoder_layers=1, config=_config(4),
                    progress=False)
    texts = ["".join(line.split()) for line in data.read_text(encoding="utf-8").splitlines()[:40]]
    assert _agreement(zhie.load(teacher), zhie.load(tmp_path / "s" / "best"), texts) >= 0.9


def test_a_relation_student_agrees_with_its_teacher(tmp_path):
    teacher = trained("re")
    lines = [json.dumps(r, ensure_ascii=False) for r in relation_corpus(100, seed=3)]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "more.txt").write_text("\n".join(r["text"] for r in relation_corpus(200, seed=12)), encoding="utf-8")
    distill_student([teacher], tmp_path / "train.jsonl", out=tmp_path / "s", dev=tmp_path / "train.jsonl",
                    unlabelled=[tmp_path / "more.txt"], encoder_layers=1, keep_layers="spread", config=_config(6),
                    progress=False)
    texts = [r["text"] for r in relation_corpus(30, seed=11)]
    assert _agreement(zhie.load(teacher), zhie.load(tmp_path / "s" / "best"), texts) >= 0.9


def test_a_sentence_embedding_student_keeps_the_teachers_similarities(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.tsv")
    zhie.fit("similarity", pairs, pairs, out=tmp_path / "t", encoder="tiny", max_length=32, pooling="mean",
             config=_config(6), resume=False, progress=False)  # a teacher whose similarities spread (-0.4 to 1)
    distill_student([tmp_path / "t" / "best"], pairs, out=tmp_path / "s", dev=pairs, encoder_layers=1,
                    keep_layers="spread", config=_config(6), progress=False)
    a, b = (list(x) for x in zip(*(line.split("\t")[:2] for line in pairs.read_text(encoding="utf-8").splitlines())))
    t = zhie.load(tmp_path / "t" / "best").similarity(a, b)
    assert np.corrcoef(t, zhie.load(tmp_path / "s" / "best").similarity(a, b))[0, 1] >= 0.99  # cut alone: 0.987
    # it matches the teacher's similarities as they are: a temperature would be a flag that does nothing
    with pytest.raises(ValueError, match="--temperature 2.0: a similarity student matches its teacher's outputs"):
        distill_student([tmp_path / "t" / "best"], pairs, out=tmp_path / "s2", temperature=2.0, progress=False)
    stored = torch.load(tmp_path / "s" / teachers.TARGETS, weights_only=False)
    assert "temperature" not in stored["identity"]  # nor is it part of the stored outputs' fingerprint


def test_a_student_with_narrower_feed_forward_blocks_agrees_saves_and_resumes(ner_files, tmp_path, monkeypatch):
    teacher = trained("ner-gp")
    args = dict(out=tmp_path / "s", dev=ner_files / "dev.jsonl", unlabelled=[ner_files / "unlabelled.txt"],
                encoder_layers=2, ffn_width=128, config=_config(6), progress=False)
    distill_student([teacher], ner_files / "train.jsonl", **args)
    student = zhie.load(tmp_path / "s" / "best")
    config = student.model.encoder.config
    assert config.intermediate_size == 128 < zhie.load(teacher).model.encoder.config.intermediate_size
    assert all(layer.intermediate.dense.out_features == 128 for layer in student.model.encoder.encoder.layer)
    texts = [ex.text for ex in nested_corpus(40, seed=9)]
    assert _agreement(zhie.load(teacher), student, texts) >= 0.9
    stored = torch.load(tmp_path / "s" / teachers.TARGETS, weights_only=False)
    assert len(stored["ffn_activity"]) == zhie.load(teacher).model.encoder.config.num_hidden_layers
    monkeypatch.setattr(teachers, "teacher_targets", lambda *a, **k: pytest.fail("the teacher ran again"))
    distill_student([teacher], ner_files / "train.jsonl", **args)  # finished: the stored activity is enough
    # reused outputs without the head activity: measured by a pass of the encoder alone, the targets not run again
    distill_student([teacher], ner_files / "train.jsonl", **{**args, "out": tmp_path / "h", "ffn_width": None,
                                                             "attention_heads": 1, "targets_from": tmp_path / "s",
                                                             "config": _config(1)})
    reused = torch.load(tmp_path / "h" / teachers.TARGETS, weights_only=False)
    assert len(reused["head_activity"]) == len(stored["ffn_activity"])
    assert all(torch.equal(a.target[1], b.target[1]) for a, b in zip(reused["lessons"], stored["lessons"]))
    with pytest.raises(ValueError, match="student.ffn_width: 128 -> 64"):
        distill_student([teacher], ner_files / "train.jsonl", **{**args, "ffn_width": 64})
    with pytest.raises(ValueError, match="--ffn-width narrows the teacher's layers"):
        distill_student([teacher], ner_files / "train.jsonl", **{**args, "student": "conv", "out": tmp_path / "c"})


@pytest.mark.parametrize("head", ["gp", "egp"])
def test_a_convolutional_student_agrees_with_its_teacher_and_exports(ner_files, tmp_path, head):

    teacher = trained("ner-gp")
    distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "s", dev=ner_files / "dev.jsonl",
                    unlabelled=[ner_files / "unlabelled.txt"], student="conv", encoder_layers=3, width=64,
                    head=head, config=_config(8), progress=False)
    student = zhie.load(tmp_path / "s" / "best")
    assert student.model.encoder.config.model_type == "zhie_conv" and student.task.config.head == head
    texts = [ex.text for ex in nested_corpus(40, seed=9)]
    assert _agreement(zhie.load(teacher), student, texts) >= 0.9
    onnx, torch_rows = _exported_spans_agree(tmp_path, student, texts)
    assert all(abs(a.score - b.score) < 1e-4 for r, q in zip(onnx, torch_rows) for a, b in zip(r, q))


def test_a_narrow_student_starts_from_the_teachers_embeddings_agrees_and_exports(ner_files, tmp_path):
    """``--student narrow``: its embeddings' outputs are the teacher's at the start (copied, then projected to its own
    width); trained, it agrees with the teacher and its export predicts what it predicts; a width that is not a
    multiple of 64 and a teacher without BERT's embeddings are refused."""
    from zhie.encoders.conv import conv_student
    from zhie.training.student_models import narrow_student

    teacher = trained("ner-gp")
    encoder = zhie.load(teacher).model.encoder.eval()
    narrow = narrow_student(encoder, 64, 2, seed=0).eval()
    assert (narrow.config.model_type, narrow.config.hidden_size, narrow.config.num_hidden_layers) == ("albert", 64, 2)
    ids = torch.tensor([[0, 5, 9, 14, 2]])
    with torch.no_grad():
        assert torch.equal(narrow.embeddings(ids), encoder.embeddings(ids))
    with pytest.raises(ValueError, match="multiple of 64"):
        narrow_student(encoder, 96, 2, seed=0)
    with pytest.raises(ValueError, match="use --student conv"):
        narrow_student(conv_student(encoder, hidden_size=32, layers=1), 64, 2, seed=0)

    with pytest.raises(ValueError, match="multiple of 64"):  # refused before the teacher runs
        distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "w", student="narrow", width=96,
                        config=_config(1), progress=False)
    assert not (tmp_path / "w" / teachers.TARGETS).exists()

    distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "s", dev=ner_files / "dev.jsonl",
                    unlabelled=[ner_files / "unlabelled.txt"], student="narrow", encoder_layers=2, width=64,
                    head="egp", config=_config(8), progress=False)
    student = zhie.load(tmp_path / "s" / "best")
    assert student.model.encoder.config.hidden_size == 64 and student.task.config.head == "egp"
    recipe = json.loads((tmp_path / "s" / "best" / "training.json").read_text())["options"]["distilled_from"]
    assert (recipe["student"], recipe["layers"], recipe["width"]) == ("narrow", 2, 64)
    texts = [ex.text for ex in nested_corpus(40, seed=9)]
    assert _agreement(zhie.load(teacher), student, texts) >= 0.9
    _exported_spans_agree(tmp_path, student, texts)


def test_a_bigram_table_of_zeros_keeps_the_bert_and_padding_never_changes_a_row():
    """:func:`zhie.encoders.student_bert.student_bert` with a bigram table: the BERT's function exactly while the table
    is zeros; with a table that has learnt, each token's row changes its output, and a right-padded row's outputs are
    the row's alone; other encoders are refused."""
    from zhie.encoders.conv import conv_student
    from zhie.encoders.student_bert import student_bert

    encoder = zhie.load(trained("ner-gp")).model.encoder.eval()
    table = student_bert(encoder, bigrams=97).eval()
    ids = torch.tensor([[2, 5, 9, 14, 3, 0, 0], [2, 7, 8, 6, 11, 12, 3]])
    mask = (torch.arange(7) < torch.tensor([[5], [7]])).long()
    with torch.no_grad():
        before = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(table(input_ids=ids, attention_mask=mask).last_hidden_state, before, rtol=0, atol=0)
        table.bigram_embeddings.weight.normal_(std=0.5)
        after = table(input_ids=ids, attention_mask=mask).last_hidden_state
        alone = table(input_ids=ids[:1, :5], attention_mask=mask[:1, :5]).last_hidden_state
    assert (after - before)[mask.bool()].abs().amax(-1).min() > 1e-3
    torch.testing.assert_close(after[:1, :5], alone, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="use --student conv"):
        student_bert(conv_student(encoder, hidden_size=32, layers=1), bigrams=97)


def test_head_activity_is_each_heads_mean_contribution_norm_and_pruning_keeps_the_strongest():
    """:class:`HeadActivity`: per layer and head, the mean over real tokens of ``||W_O[:, h] c_h||`` (by hand from the
    attention's context vectors); :func:`student_bert` keeps the strongest heads in their order, and with every head
    kept computes what the BERT computes; a layer whose other heads give nothing computes the same with only its
    strongest."""
    from zhie.encoders.student_bert import HeadActivity, student_bert

    model, _ = encoders.tiny(["甲乙丙"], hidden_size=32, layers=2, heads=4)  # heads of 8
    model.eval()
    ids, mask = torch.tensor([[2, 5, 6, 3, 0], [2, 7, 3, 0, 0]]), torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    seen = []
    dense = model.encoder.layer[1].attention.output.dense
    hook = dense.register_forward_hook(lambda m, i, o: seen.append(i[0].detach()))
    activity = HeadActivity(model)
    activity.mask = mask
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    activity.close()
    hook.remove()
    context = torch.cat([seen[0][0, :4], seen[0][1, :3]])  # 7 real tokens, [7, 32]
    expected = torch.stack([(context[:, h * 8:(h + 1) * 8] @ dense.weight[:, h * 8:(h + 1) * 8].T).norm(dim=-1).mean()
                            for h in range(4)])
    torch.testing.assert_close(activity.means()[1], expected)
    assert not dense._forward_hooks

    with torch.no_grad():
        whole = student_bert(model, heads=(4, activity.means())).eval()
        torch.testing.assert_close(whole(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   model(input_ids=ids, attention_mask=mask).last_hidden_state)
        for layer in model.encoder.layer:  # heads 0 and 2 give nothing to the layer's output
            for h in (0, 2):
                layer.attention.output.dense.weight[:, h * 8:(h + 1) * 8] = 0
        scores = [torch.tensor([0.1, 5.0, 0.2, 3.0])] * 2
        pruned = student_bert(model, heads=(2, scores)).eval()
        assert pruned.encoder.layer[0].attention.self.query.out_features == 16
        assert pruned.config.attention_heads_kept == 2 and pruned.config.num_attention_heads == 4
        torch.testing.assert_close(pruned.encoder.layer[1].attention.self.value.weight,
                                   torch.cat([model.encoder.layer[1].attention.self.value.weight[8:16],
                                              model.encoder.layer[1].attention.self.value.weight[24:32]]))
        torch.testing.assert_close(pruned(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   model(input_ids=ids, attention_mask=mask).last_hidden_state, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="keep 1 to 4"):
        student_bert(model, heads=(5, scores))


def test_a_cut_student_with_bigrams_and_fewer_heads_learns_saves_and_exports(ner_files, tmp_path):
    teacher = trained("ner-gp")
    for bad, message in ((dict(bigrams=-3), "--bigrams -3"), (dict(attention_heads=9), "--attention-heads 9"),
                         (dict(attention_heads=1, student="conv"), "it is for --student cut")):
        with pytest.raises(ValueError, match=message):  # refused before the teacher runs
            distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "n", encoder_layers=1,
                            config=_config(1), progress=False, **bad)
        assert not (tmp_path / "n" / teachers.TARGETS).exists()
    distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "s", dev=ner_files / "dev.jsonl",
                    unlabelled=[ner_files / "unlabelled.txt"], encoder_layers=1, keep_layers="spread", bigrams=97,
                    attention_heads=1, config=_config(6), progress=False)
    student = zhie.load(tmp_path / "s" / "best")
    config = student.model.encoder.config
    assert (config.model_type, config.bigram_buckets, config.attention_heads_kept, config.num_hidden_layers) == (
        "zhie_student_bert", 97, 1, 1)
    assert student.model.encoder.bigram_embeddings.weight.abs().sum() > 0  # the table learnt
    assert len(torch.load(tmp_path / "s" / teachers.TARGETS, weights_only=False)["head_activity"]) == 2
    recipe = json.loads((tmp_path / "s" / "distill.json").read_text())
    assert (recipe["student"], recipe["bigrams"], recipe["attention_heads"], recipe["kept_layers"]) == (
        "cut", 97, 1, [1])
    texts = [ex.text for ex in nested_corpus(40, seed=9)]
    assert _agreement(zhie.load(teacher), student, texts) >= 0.9
    _exported_spans_agree(tmp_path, student, texts)


def test_a_student_head_must_give_the_teachers_output_type_and_a_cut_may_take_a_fresh_one(ner_files, tmp_path):
    """Another head than the teacher's must give the same output type; a cut student with one keeps the teacher's
    layers and gets the head afresh, and learns it from the teacher's span logits."""
    teacher = trained("ner-gp")
    with pytest.raises(ValueError, match="same output type"):
        distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "conv", student="conv",
                        encoder_layers=1, head="crf", config=_config(1), progress=False)
    distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "s", dev=ner_files / "dev.jsonl",
                    unlabelled=[ner_files / "unlabelled.txt"], encoder_layers=1, keep_layers="spread", head="egp",
                    config=_config(8), progress=False)
    student, teacher_pipe = zhie.load(tmp_path / "s" / "best"), zhie.load(teacher)
    assert student.task.config.head == "egp" and type(student.model.heads["ner"]).__name__ == "EfficientGlobalPointer"
    torch.testing.assert_close(student.model.encoder.embeddings.word_embeddings.weight,
                               teacher_pipe.model.encoder.embeddings.word_embeddings.weight, rtol=0.1, atol=0.1)
    texts = [ex.text for ex in nested_corpus(40, seed=9)]
    assert _agreement(teacher_pipe, student, texts) >= 0.9


def test_a_convolutional_students_dilations_and_bigrams_are_its_own_and_in_its_recipe(ner_files, tmp_path):
    teacher = trained("ner-gp")
    distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "s", student="conv", encoder_layers=2,
                    width=32, dilations=[1, 3], bigrams=97, config=_config(1), progress=False)
    config = zhie.load(tmp_path / "s" / "best").model.encoder.config
    assert config.dilations == [1, 3] and config.bigram_buckets == 97
    recipe = json.loads((tmp_path / "s" / "distill.json").read_text())
    assert recipe["dilations"] == [1, 3] and recipe["bigrams"] == 97
    with pytest.raises(ValueError, match="--bigrams adds a table of character bigrams to a convolutional or a cut"):
        distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "b", student="narrow", width=64,
                        bigrams=8, config=_config(1), progress=False)
    with pytest.raises(ValueError, match="--student conv"):
        distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "c", encoder_layers=1, dilations=[1, 2],
                        config=_config(1), progress=False)
    with pytest.raises(ValueError, match="dilations"):  # refused before the teacher runs
        distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "z", student="conv", dilations=[0],
                        config=_config(1), progress=False)
    assert not (tmp_path / "z" / teachers.TARGETS).exists()
    assert dilation_list("1,2,4,8") == [1, 2, 4, 8]
    with pytest.raises(argparse.ArgumentTypeError, match="separated by commas"):
        dilation_list("1 2")


def test_a_fresh_student_starts_again_from_the_teachers_pretrained_encoder(tmp_path):
    from zhie.tasks.encoder_prep import prepare_encoder

    texts = [ex.text for ex in nested_corpus(30, seed=4)]
    base, full = encoders.load("tiny", texts=texts, seed=3)  # stands for a pre-trained encoder on disk
    base.save_pretrained(tmp_path / "enc")
    full.save_pretrained(tmp_path / "enc")
    teacher, tokenizer = prepare_encoder(str(tmp_path / "enc"), texts=texts[:3], keep_tokens="data")
    assert len(tokenizer) < len(full)  # the teacher reads a cut of the vocabulary, in its own ids
    with torch.no_grad():  # its fine-tuning
        for p in teacher.parameters():
            p.add_(0.5)
    fresh = student_models.fresh_encoder(teacher, tokenizer, str(tmp_path / "enc"), seed=0)
    rows = full.convert_tokens_to_ids(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
    torch.testing.assert_close(fresh.get_input_embeddings().weight, base.get_input_embeddings().weight[rows],
                               rtol=0, atol=0)
    before = dict(base.named_parameters())
    for name, weight in fresh.named_parameters():
        if "word_embeddings" not in name:
            torch.testing.assert_close(weight, before[name], rtol=0, atol=0)
    other, other_tokens = encoders.load("tiny", texts=["abc def"], seed=1)  # an encoder the teacher did not come from
    other.save_pretrained(tmp_path / "other")
    other_tokens.save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="not fine-tuned from"):
        student_models.fresh_encoder(teacher, tokenizer, str(tmp_path / "other"), seed=0)


def test_a_fresh_student_of_a_random_encoder_is_initialised_anew_and_learns_from_its_teacher(ner_files, tmp_path):
    teacher = trained("ner-gp")
    distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "s", dev=ner_files / "dev.jsonl",
                    unlabelled=[ner_files / "unlabelled.txt"], student="fresh", config=_config(8), progress=False)
    teacher_pipe, student = zhie.load(teacher), zhie.load(tmp_path / "s" / "best")
    shape = [{k: v for k, v in m.model.encoder.config.to_dict().items() if k != "_name_or_path"}
             for m in (student, teacher_pipe)]
    assert shape[0] == shape[1]
    assert json.loads((tmp_path / "s" / "distill.json").read_text())["origin"] == "tiny"
    texts = [ex.text for ex in nested_corpus(40, seed=9)]
    assert _agreement(teacher_pipe, student, texts) >= 0.9
    with pytest.raises(ValueError, match="keeps the teacher's architecture"):
        distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "f", student="fresh", encoder_layers=1,
                        config=_config(1), progress=False)


def test_a_run_reuses_the_teacher_outputs_of_an_earlier_run_of_the_same_teacher_and_data(ner_files, tmp_path,
                                                                                          monkeypatch):
    teacher = trained("ner-gp")
    args = dict(dev=ner_files / "dev.jsonl", unlabelled=[ner_files / "unlabelled.txt"], encoder_layers=1,
                config=_config(1), progress=False)
    distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "first", **args)

    def no_teacher(*_args, **_kwargs):
        raise AssertionError("the teacher ran again")

    monkeypatch.setattr(teachers, "teacher_targets", no_teacher)
    distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "conv", student="conv", width=32,
                    targets_from=tmp_path / "first", **args)
    first, again = (torch.load(tmp_path / d / teachers.TARGETS, weights_only=False) for d in ("first", "conv"))
    assert again["identity"] == first["identity"] and len(again["lessons"]) == len(first["lessons"])
    with pytest.raises(ValueError, match="other temperature"):
        distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "t2", temperature=2.0,
                        targets_from=tmp_path / "first", **args)
    with pytest.raises(ValueError, match="no stored teacher outputs"):
        distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "none", targets_from=tmp_path / "t2",
                        **args)
    # other dev texts are other items (texts in dev are left out of the unlabelled ones): not the same outputs
    write_ner_jsonl(nested_corpus(6, seed=21), tmp_path / "other_dev.jsonl")
    with pytest.raises(ValueError, match="its teacher outputs come from other data"):
        distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "d2", targets_from=tmp_path / "first",
                        **{**args, "dev": tmp_path / "other_dev.jsonl"})


def test_stored_teacher_outputs_load_without_running_code(ner_files, tmp_path):
    """A run directory copied in from elsewhere (--targets-from, or a resumed --out) cannot run code as its stored
    teacher outputs load: only tensors, plain values and zhie's own item classes are read."""
    import os

    class Boom:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'ran'}",)

    copied = tmp_path / "copied"
    (copied / teachers.TARGETS).parent.mkdir(parents=True)
    torch.save({"identity": {}, "lessons": [Boom()]}, copied / teachers.TARGETS)
    with pytest.raises(ValueError, match="not teacher outputs that zhie loads"):
        distill_student([trained("ner-gp")], ner_files / "train.jsonl", out=tmp_path / "s", targets_from=copied,
                        encoder_layers=1, config=_config(1), progress=False)
    assert not (tmp_path / "ran").exists()


# ------------------------------------------------------------------------------------------------ hidden states
def test_the_hidden_state_loss_is_the_mean_squared_difference_over_the_tokens_by_hand():
    student = torch.tensor([[[1.0, 2.0], [3.0, -1.0], [9.0, 9.0]]])  # [1, 3, 2]; the third token is padding
    teacher = torch.tensor([[[0.0, 2.0], [1.0, 1.0], [0.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert students.hidden_loss(student, teacher, mask).item() == pytest.approx((1 + 0 + 4 + 4) / 4)


def test_the_objective_adds_the_weighted_hidden_state_loss_through_its_projection():
    teacher = zhie.load(trained("ner-gp"))
    task, model = teacher.task, teacher.model.eval()
    width = model.encoder.config.hidden_size
    items = task.encode(nested_corpus(4, seed=3))
    batch = task.collate(items)
    with torch.no_grad():
        hidden, outputs = model.hidden_and_outputs(batch["input_ids"], batch["attention_mask"], heads=[task.head_name])
        torch.testing.assert_close(hidden, model.encoder(input_ids=batch["input_ids"],
                                                         attention_mask=batch["attention_mask"]).last_hidden_state)
        target = torch.randn_like(hidden)
        batch = task.soft_batch(batch, task.soft_targets(outputs[task.head_name], batch, 1.0))
        batch["teacher_hidden"] = target
        plain = students.DistillObjective(task, 0.5, 1.0)(model, batch)
        objective = students.DistillObjective(task, 0.5, 1.0, hidden_weight=0.3, widths=(width, width))
        assert torch.equal(objective.projection.weight, torch.eye(width))  # equal widths: starts as the identity
        want = plain + 0.3 * students.hidden_loss(hidden, target, batch["attention_mask"])
        torch.testing.assert_close(objective(model, batch), want)
    assert students.DistillObjective(task, 0.5, 1.0, 1.0, (width, 7)).projection.weight.shape == (7, width)


def test_a_student_matching_the_teachers_hidden_states_stores_them_once_and_agrees(ner_files, tmp_path, monkeypatch):
    teacher = trained("ner-gp")
    args = dict(dev=ner_files / "dev.jsonl", unlabelled=[ner_files / "unlabelled.txt"], student="conv",
                encoder_layers=3, width=64, head="egp", config=_config(8), progress=False)
    distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "first", **{**args, "config": _config(1)})
    calls = []
    real = teachers.teacher_hidden
    monkeypatch.setattr(teachers, "teacher_targets", lambda *a, **k: pytest.fail("the teacher's outputs ran again"))
    monkeypatch.setattr(teachers, "teacher_hidden", lambda *a, **k: calls.append(1) or real(*a, **k))
    distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "s", hidden_weight=1.0,
                    targets_from=tmp_path / "first", **args)  # the stored outputs, and one pass for the states
    stored = torch.load(tmp_path / "s" / teachers.TARGETS, weights_only=False)
    lesson = stored["lessons"][0]
    assert calls == [1] and lesson.hidden.dtype == torch.float16
    assert lesson.hidden.shape == (len(lesson.item.ids) + 2, zhie.load(teacher).model.encoder.config.hidden_size)
    assert json.loads((tmp_path / "s" / "distill.json").read_text())["hidden_weight"] == 1.0
    student = zhie.load(tmp_path / "s" / "best")
    assert _agreement(zhie.load(teacher), student, [ex.text for ex in nested_corpus(40, seed=9)]) >= 0.9
    distill_student([teacher], ner_files / "train.jsonl", out=tmp_path / "s", hidden_weight=1.0, **args)
    assert calls == [1]  # a finished run reads its stored states back
    with pytest.raises(ValueError, match="one --teacher"):
        distill_student([teacher, teacher], ner_files / "train.jsonl", out=tmp_path / "e", hidden_weight=1.0, **args)


def test_the_distill_command_trains_a_student_adversarially_when_asked(ner_files, tmp_path):
    """``zhie distill student … --adversarial fgm``: the student's training config records FGM and the student differs
    from the one trained the same way without it (the perturbed second pass changes every step); the MTMT student
    refuses the flag (argparse's exit: it is no flag of ``zhie distill mtmt``)."""
    from zhie.cli import main

    teacher = trained("ner-gp")
    common = ["distill", "student", "--teacher", str(teacher), "--train", str(ner_files / "train.jsonl"),
              "--encoder-layers", "1", "--epochs", "1", "--lr", "2e-3", "--seed", "0", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert main([*common, "--out", str(tmp_path / "fgm"), "--adversarial", "fgm", "--adv-epsilon", "0.5"]) == 0
    record = json.loads((tmp_path / "fgm" / "best" / "training.json").read_text(encoding="utf-8"))
    assert (record["train_config"]["adversarial"], record["train_config"]["adv_epsilon"]) == ("fgm", 0.5)
    plain, fgm = (zhie.load(tmp_path / d / "best").model.encoder.encoder.layer[0].output.dense.weight
                  for d in ("plain", "fgm"))
    assert not torch.allclose(plain, fgm)
    with pytest.raises(SystemExit) as refused:
        main(["distill", "mtmt", "--recognizer", str(teacher), "--evaluator", str(teacher), "--target",
              str(ner_files / "unlabelled.txt"), "--out", str(tmp_path / "m"), "--adversarial", "fgm"])
    assert refused.value.code == 2
