"""``zhie demo``: a small Chinese NER corpus that zhie writes itself, then train, evaluate and predict.

The corpus is generated from templates and made-up names, places and organisations (never copied from a
dataset), so the demo runs on any machine with no data and no network.
"""

from __future__ import annotations

import random
from pathlib import Path

from zhie.core.spans import Span
from zhie.data import NerExample, write_ner_jsonl

SURNAMES = list("王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾萧田董袁潘于蒋蔡余杜叶程苏魏吕丁任沈")
GIVEN = list("伟芳娜敏静丽强磊军洋勇艳杰娟涛明超秀霞平刚桂英华玉萍红娥玲兰凤洁梅琳素云莲真"
             "环雪荣爱妹香月莺媛瑞凡佳嘉琼勤珍")
PLACE_HEADS = list("江河湖山海云天青平安宁长东南西北新福华金泉阳临清武")
PLACE_TAILS = ["市", "县", "镇", "省", "区", "港", "湾"]
ORG_HEADS = list("远华鼎盛科创新星海联达宏信恒通中天瑞丰汇银鑫隆博泰")
ORG_TAILS = ["公司", "集团", "大学", "银行", "研究院", "医院", "出版社", "电视台", "科技公司", "基金会"]
TEMPLATES = [
    "{PER}在{LOC}的{ORG}工作。",
    "{ORG}位于{LOC}，成立于二十年前。",
    "昨天{PER}和{PER}一起去了{LOC}。",
    "{PER}是{ORG}的负责人。",
    "记者从{ORG}获悉，{PER}将前往{LOC}考察。",
    "{LOC}的天气很好，{PER}决定出门散步。",
    "据{ORG}消息，{LOC}将举办一场展览。",
    "{PER}毕业于{ORG}，现在住在{LOC}。",
    "今年夏天，{ORG}在{LOC}开设了分部。",
    "{PER}说，{LOC}是一个美丽的地方。",
    "{PER}给{PER}打了电话，约在{LOC}见面。",
    "我们参观了{ORG}，还见到了{PER}。",
]


def _entity(rng: random.Random, label: str) -> str:
    if label == "PER":
        return rng.choice(SURNAMES) + "".join(rng.choices(GIVEN, k=rng.choice([1, 2])))
    if label == "LOC":
        return "".join(rng.choices(PLACE_HEADS, k=2)) + rng.choice(PLACE_TAILS)
    return "".join(rng.choices(ORG_HEADS, k=2)) + rng.choice(ORG_TAILS)


def make_corpus(n: int, seed: int) -> list[NerExample]:
    """``n`` template sentences with PER/LOC/ORG entities and exact character offsets."""
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        template = rng.choice(TEMPLATES)
        text, spans, rest = "", [], template
        while "{" in rest:
            head, _, tail = rest.partition("{")
            label, _, rest = tail.partition("}")
            text += head
            mention = _entity(rng, label)
            spans.append(Span(len(text), len(text) + len(mention), label, mention))
            text += mention
        examples.append(NerExample(text + rest, spans))
    return examples


def write_corpus(out: Path, n_train: int = 400, n_dev: int = 100) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    train, dev = out / "train.jsonl", out / "dev.jsonl"
    write_ner_jsonl(make_corpus(n_train, seed=1), train)
    write_ner_jsonl(make_corpus(n_dev, seed=2), dev)
    return train, dev


SAMPLES = [
    "罗志祥在临江市的恒信银行工作。",
    "据远鼎研究院消息，北宁县将举办一场展览。",
    "周杰和林娜一起去了安平镇。",
]
