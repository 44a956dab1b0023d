"""GPLinker: mention location, exact label round trip on CMeIE, sparse = dense loss, learning, CLI."""

import json

import pytest
import torch

import zhie
from zhie import encoders
from zhie.cli import main
from zhie.data.spo import locate, read_schema, read_spo
from zhie.heads import RelationLogits
from zhie.losses import multilabel_categorical_crossentropy
from zhie.model import Model
from zhie.tasks.relation import RelationConfig, RelationTask, RelationWindow
from zhie.training import TrainConfig

from .conftest import DATA

CMEIE = DATA / "re/cmeie"


def decode(task: RelationTask, logits: RelationLogits) -> list:
    """The task's decoding (numpy) of the logits a torch model gives."""
    arrays = {name: getattr(logits, name).float().numpy() for name in ("entity", "head_head", "tail_tail")}
    return task.decode(None, {task.head_name: arrays}, None)


def test_locate_takes_the_closest_occurrence_pair():
    text = "胰腺炎@研究显示，ERCP可以用于胰腺炎。"  # subject at 0 and 17, object at 9
    assert locate(text, "胰腺炎", "ERCP") == (17, 9)
    assert locate("甲乙甲乙", "甲", "乙") == (0, 1)  # ties: earliest pair
    assert locate("abc", "x", "b") == (-1, 1)


@pytest.mark.needs_data
def test_cmeie_reading_and_schema():
    train = read_spo(CMEIE / "train.jsonl")
    assert len(train) == 2900 and len(read_spo(CMEIE / "dev.jsonl")) == 685
    assert len(read_schema(CMEIE / "schema.json")) == len({json.loads(line)["predicate"] for line in
                                                           (CMEIE / "schema.json").read_text().splitlines()})
    for ex in train:
        for t in ex.triples:
            if t.located:
                assert ex.text[t.subject.start:t.subject.end] == t.subject.text
                assert ex.text[t.object.start:t.object.end] == t.object.text


def oracle_logits(batch, n_pred):
    """Logits that are +5 exactly on the label cells and -5 elsewhere (index 0 is padding)."""
    b, n = batch["input_ids"].shape

    def dense(labels, heads):
        x = torch.full((b, heads, n * n), -5.0)
        x.scatter_(2, labels, 5.0)
        x[:, :, 0] = -5.0
        return x.view(b, heads, n, n)

    return RelationLogits(dense(batch["entity_labels"], 2), dense(batch["head_head_labels"], n_pred),
                          dense(batch["tail_tail_labels"], n_pred))


@pytest.mark.needs_data
def test_label_encoding_and_decoding_round_trip_every_located_cmeie_triple():
    examples = read_spo(CMEIE / "train.jsonl")
    predicates = read_schema(CMEIE / "schema.json")
    _, tokenizer = encoders.tiny([ex.text for ex in examples])
    task = RelationTask(RelationConfig(predicates, max_length=512), tokenizer)
    items = task.encode(examples)
    assert len(items) == len(examples) and task.stats["triples_dropped"] == 0
    missing, extra, total = 0, 0, 0
    order = sorted(range(len(items)), key=lambda i: len(items[i].ids))  # batches of similar lengths: less padding
    for start in range(0, len(items), 64):
        part = order[start:start + 64]
        batch = task.collate([items[i] for i in part])
        rows = decode(task, oracle_logits(batch, len(predicates)))
        for ex, row in zip([examples[i] for i in part], rows):
            enc = task.text_tokenizer(ex.text)

            def chars(a, b, enc=enc):  # a mention's characters as tokens cover them (a leading BOM has no token)
                return enc.token_span_to_chars(*enc.char_span_to_tokens(a, b))

            decoded = {(*enc.token_span_to_chars(*t.subject), predicates[t.predicate],
                        *enc.token_span_to_chars(*t.object)) for t in row}
            gold = {(*chars(t.subject.start, t.subject.end), t.predicate, *chars(t.object.start, t.object.end))
                    for t in ex.triples if t.located}
            total += len(gold)
            missing += len(gold - decoded)
            extra += len(decoded - gold)
    assert total > 8000 and missing == 0
    # GPLinker's factorisation can link a subject and an object of two different gold triples that share their
    # head and tail cells; on CMeIE train that happens twice in 8,539 triples
    assert extra <= 2


def test_sparse_relation_loss_equals_dense_loss():
    torch.manual_seed(0)
    _, tokenizer = encoders.tiny(["北京大学在海淀区", "张三是李四的老师"])
    task = RelationTask(RelationConfig(["位于", "老师"], max_length=32), tokenizer)
    items = [RelationWindow([5, 6, 7, 8, 9, 10], entity=[(0, 0, 1), (1, 3, 4)], head_head=[(0, 0, 3)],
                            tail_tail=[(0, 1, 4)]),
             RelationWindow([5, 6, 7], entity=[(0, 0, 0), (1, 2, 2)], head_head=[(1, 0, 2)], tail_tail=[(1, 0, 2)])]
    batch = task.collate(items)
    encoder, _ = encoders.tiny(["北京大学在海淀区", "张三是李四的老师"])
    model = Model(encoder, task.build_heads(encoder.config.hidden_size))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.05)
    sparse = task.loss(model, batch)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])["re"]
    target = oracle_logits(batch, 2)
    dense = 0
    for name in ("entity", "head_head", "tail_tail"):
        y_pred = getattr(logits, name).flatten(2)
        y_true = (getattr(target, name).flatten(2) > 0).float()
        y_true[:, :, 0] = 0
        y_pred = y_pred.clone()
        y_pred[:, :, 0] = -1e12  # mask_zero: cell ([CLS], [CLS]) takes no part
        dense = dense + multilabel_categorical_crossentropy(y_pred, y_true).sum(1).mean()
    # the sparse form computes log(1 + sum_neg e^s) as a + log(1 - e^(b - a)): equal up to fp32 cancellation
    torch.testing.assert_close(sparse, dense, rtol=1e-4, atol=1e-4)


def test_decoding_caps_what_an_untrained_model_emits():
    """Half of all cells above 0 (an untrained model) would give ~L^4 R / 16 triples: the caps bound the work."""
    _, tokenizer = encoders.tiny(["北京大学在海淀区"])
    task = RelationTask(RelationConfig(["a", "b", "c"], max_spans=10, max_triples=20), tokenizer)
    g = torch.Generator().manual_seed(0)
    n = 40
    logits = RelationLogits(*(torch.randn(2, h, n, n, generator=g) for h in (2, 3, 3)))
    rows = decode(task, logits)
    assert all(len(row) == 20 for row in rows)
    for b, row in enumerate(rows):
        subjects = {t.subject for t in row}
        assert len(subjects) <= 10
        assert min(t.score for t in row) > 0.5  # sigmoid(2 * logit) of four cells above 0
        for t in row:
            (sh, st), p, (oh, ot) = t.subject, t.predicate, t.object
            st, ot = st - 1, ot - 1  # inclusive ends
            assert logits.entity[b, 0, sh + 1, st + 1] > 0 and logits.entity[b, 1, oh + 1, ot + 1] > 0
            assert logits.head_head[b, p, sh + 1, oh + 1] > 0 and logits.tail_tail[b, p, st + 1, ot + 1] > 0
    # a wide cap returns everything above 0, as the uncapped rule does
    task.config.max_spans, task.config.max_triples = 10**6, 10**9
    small = RelationLogits(*(torch.randn(1, h, 6, 6, generator=g) for h in (2, 3, 3)))
    expected = {(sh - 1, st - 1, p, oh - 1, ot - 1)
                for sh in range(6) for st in range(6) for oh in range(6) for ot in range(6) for p in range(3)
                if small.entity[0, 0, sh, st] > 0 and small.entity[0, 1, oh, ot] > 0
                and small.head_head[0, p, sh, oh] > 0 and small.tail_tail[0, p, st, ot] > 0}
    assert {(t.subject[0], t.subject[1] - 1, t.predicate, t.object[0], t.object[1] - 1)
            for t in decode(task, small)[0]} == expected


@pytest.fixture(scope="module")
def cmeie_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("re")
    lines = (CMEIE / "train.jsonl").read_text(encoding="utf-8").splitlines()
    lines = [line for line in lines if len(json.loads(line)["text"]) <= 80][:100]  # the first 100 short ones
    (out / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = TrainConfig(epochs=40, batch_size=16, lr=3e-3, head_lr=3e-3, warmup=0.05, seed=0, eval_every=10**9)
    zhie.fit("re", out / "train.jsonl", out / "train.jsonl", out=out / "run", schema=CMEIE / "schema.json",
             encoder="tiny", head="egp", max_length=82, config=config, resume=False, progress=False)
    return out


@pytest.mark.needs_data
def test_tiny_gplinker_learns_100_cmeie_documents(cmeie_model, capsys):
    pipe = zhie.load(cmeie_model / "run")
    metrics = pipe.evaluate(read_spo(cmeie_model / "train.jsonl"))
    assert metrics["f1"] >= 0.9, metrics
    assert main(["predict", str(cmeie_model / "run"), read_spo(cmeie_model / "train.jsonl")[0].text]) == 0
    (line,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert line["relations"]
    for rel in line["relations"]:
        assert set(rel) == {"subject", "predicate", "object", "score"}
        assert line["text"][rel["subject"]["start"]:rel["subject"]["end"]] == rel["subject"]["text"]
