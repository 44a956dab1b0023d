"""``zhie distill mtmt``: the student of cross-lingual NER by multi-task, multi-teacher distillation (MTMT, ACL 2022;
spec §10.3), a job on the training engine; its options are :class:`MtmtOptions`' fields.

The teachers are two saved models (:mod:`zhie.tasks.xner`): the entity recogniser, an ordinary word-level NER model
on the labelled source language, and the similarity evaluator (task ``xner-evaluator``). The student (:func:`distill`)
is one fresh encoder + one linear head, trained on unlabelled target-language pairs with
:func:`zhie.losses.mtmt.mtmt_loss`; it is saved as an ordinary word-level NER model directory, so ``zhie
predict``/``eval``/``serve`` take it as they are.

The teachers run in eval mode (their outputs are fixed) on each process's own device: the recogniser once over the
target sentences before the student trains, for the predicted tags that the pairs are drawn by, then both on each
batch of pairs, inside the batch's ``collate``: the recogniser's probabilities and the evaluator's similarity at the
batch's words are computed per batch and never held for the whole target set.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from zhie.core.options import add_config_flags, option, option_fields, values_from_flags
from zhie.core.text import TextTokenizer
from zhie.data import FORMATS, read_ner
from zhie.data.base import read_texts
from zhie.dist import is_main_process, local_device
from zhie.losses.mtmt import mtmt_loss, sample_pairs, sigmoid_cosine
from zhie.model import Model
from zhie.tasks.base import Evaluator
from zhie.tasks.batching import seeded
from zhie.tasks.encoder_prep import prepare_encoder
from zhie.tasks.ner import NerTask
from zhie.tasks.xner import XnerEvaluatorTask, pair_inputs, selected_rows, word_inputs, word_outputs

from .checkpoint import claims_out
from .config import RunOptions, TrainConfig, add_job_flags, config_from_flags
from .loop import train
from .record import finish, run_record, saver, write_run_config, write_summary
from .teachers import load_teachers, teacher_identity

__all__ = ["MtmtOptions", "add_command", "distill"]

MTMT_LR = 2e-5  # the student encoder's learning rate when none is given (the official recipe's)
MTMT_BATCH = 32  # pairs per batch when none is given


@dataclass
class MtmtOptions:
    """The options of ``zhie distill mtmt`` (:func:`distill`'s keywords take their defaults from here)."""

    recognizer: str | None = option(None, "word-level NER model (zhie train ner --mode word)", required=True)
    evaluator: str | None = option(None, "similarity evaluator (zhie train xner-evaluator)", required=True)
    target: str | None = option(None, "unlabelled target-language text (a NER file's labels are unused)",
                                required=True)
    dev: str | None = option(None, "labelled development file: picks the best evaluation")
    out: str | None = option(None, "run directory; best/ is an ordinary model directory", required=True)
    format: str = option("auto", "format of the data files (text: one sentence a line, for --target only)",
                         choices=("auto", "text", *FORMATS))
    encoder: str = option(RunOptions.encoder, "the student's initial encoder")
    encoder_layers: int | None = option(None, "keep only the student encoder's first N layers")
    pairs: int | None = option(None, "word pairs per epoch (default: one per target word)")
    balanced: bool = option(True, "draw partners uniformly instead of half with the same predicted tag",
                            flags=("--no-balance",))
    loss_alpha: float = option(0.5, "weight of the similarity loss")
    alpha: bool = option(True, "turn off the recogniser-confidence weight (ablation)")
    beta: bool = option(True, "turn off the evaluator-confidence weight (ablation)")
    gamma: bool = option(True, "turn off the teacher-agreement weight (ablation)")
    similarity: bool = option(True, "turn off the similarity task (ablation)")
    head_lr_ratio: float = option(1e-3, "head learning rate / --lr (official 1/1000)")


OPTIONS = MtmtOptions  # the defaults of distill's keywords
# the training options an MTMT student takes: not --head-lr (--head-lr-ratio), adversarial training or R-Drop
TRAINING = [f.name for f in option_fields(TrainConfig)
            if f.name not in ("head_lr", "adversarial", "adv_epsilon", "adv_alpha", "adv_steps", "rdrop")]

@dataclass
class DistillPair:
    """One training item of the student: two target sentences (their indices) and a word of each (its index)."""

    a: int
    a_word: int
    b: int
    b_word: int


class MtmtObjective(nn.Module):
    """``objective(model, batch)``: the student's loss (:func:`zhie.losses.mtmt.mtmt_loss`) on a batch of pairs.

    One encoder pass over the 2B sentences; at the selected words the head's dropout gives ``h`` (the official
    student's ``output``), its linear layer the logits, ``p^S = softmax(logits)`` and ``s^S = σ(cos(h_1, h_2))``.
    """

    def __init__(self, head_name: str, loss_alpha: float = 0.5, alpha: bool = True, beta: bool = True,
                 gamma: bool = True, similarity: bool = True) -> None:
        super().__init__()
        self.head_name = head_name
        self.switches = {"loss_alpha": loss_alpha, "alpha": alpha, "beta": beta, "gamma": gamma,
                         "similarity": similarity}

    def forward(self, model, batch: dict[str, Tensor]) -> Tensor:
        hidden = model.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        head = model.heads[self.head_name]
        h = head.dropout(selected_rows(hidden, batch["positions"]))
        probs = head.dense(h).float().softmax(-1)
        half = batch["teacher_sim"].shape[0]
        return mtmt_loss(probs[:half], probs[half:], sigmoid_cosine(h[:half], h[half:]),
                         batch["teacher_probs"][:half], batch["teacher_probs"][half:], batch["teacher_sim"],
                         **self.switches)


def read_target(path: str | os.PathLike, format: str = "auto") -> list[str]:
    """Texts of the unlabelled target set: ``format="text"`` one per line (or JSON lines with "text"); otherwise a
    NER file read as ``zhie train ner`` would (its labels unused)."""
    return read_texts(path) if format == "text" else [ex.text for ex in read_ner(path, format)]


class Teachers:
    """The recogniser and the evaluator on ``device`` in eval mode, and every target sentence's inputs
    (:func:`word_inputs`) for the student, the recogniser and the evaluator (``inputs[0]``, ``[1]``, ``[2]``): a word
    whose first sub-word is missing for any of the three tokenizers has -1 in the student's, so that it is never
    selected."""

    def __init__(self, recognizer: tuple[NerTask, Model], evaluator: tuple[XnerEvaluatorTask, Model],
                 student_tt: TextTokenizer, texts: list[str], max_length: int, device: torch.device) -> None:
        self.tasks = (recognizer[0], evaluator[0])
        self.models = tuple(model.to(device).eval() for _, model in (recognizer, evaluator))
        self.tokenizers = (student_tt, *(task.text_tokenizer for task in self.tasks))
        self.device = device
        rec_in, ev_in = ([word_inputs(task.text_tokenizer, t, task.config.max_length) for t in texts]
                         for task in self.tasks)
        student_in = []
        for t, (_, rh), (_, eh) in zip(texts, rec_in, ev_in):
            ids, heads = word_inputs(student_tt, t, max_length)
            student_in.append((ids, [h if min(h, r, e) >= 0 else -1 for h, r, e in zip(heads, rh, eh)]))
        self.inputs = (student_in, rec_in, ev_in)

    def tags(self, batch_size: int = 64, chunk: int = 4096) -> list[list[int | None]]:
        """The recogniser's predicted tag of every selectable word (``None``: not selectable), ``chunk`` sentences at a
        time (their outputs are not kept)."""
        task, model = self.tasks[0], self.models[0]
        tags = []
        for start in range(0, len(self.inputs[0]), chunk):
            logits = word_outputs(model, task.head_name, task.text_tokenizer, self.inputs[1][start:start + chunk],
                                  batch_size)
            tags += [[int(y[w].argmax()) if h >= 0 else None for w, h in enumerate(heads)]
                     for (_, heads), y in zip(self.inputs[0][start:start + chunk], logits)]
        return tags

    def pairs(self, items: list[DistillPair], k: int) -> dict[str, Tensor]:
        """:func:`pair_inputs` of ``items`` for model ``k`` (0: the student, 1: the recogniser, 2: the evaluator)."""
        inputs = self.inputs[k]
        return pair_inputs(self.tokenizers[k], [inputs[it.a][0] for it in items], [inputs[it.b][0] for it in items],
                           [inputs[it.a][1][it.a_word] for it in items], [inputs[it.b][1][it.b_word] for it in items])

    @torch.no_grad()
    def collate(self, items: list[DistillPair]) -> dict[str, Tensor]:
        """The student's batch of ``items`` with the teachers' outputs at its words, computed here (on the teachers'
        device): ``teacher_probs`` ``[2B, C]`` (the first sentences, then the second ones), ``teacher_sim`` ``[B]``."""
        batch = self.pairs(items, 0)
        outputs = []
        for k, (task, model) in enumerate(zip(self.tasks, self.models), 1):
            inputs = {key: value.to(self.device) for key, value in self.pairs(items, k).items()}
            output = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                           heads=[task.head_name])[task.head_name]
            outputs.append(selected_rows(output, inputs["positions"]))
        logits, vectors = outputs
        batch["teacher_probs"] = logits.softmax(-1)
        batch["teacher_sim"] = sigmoid_cosine(vectors[:len(items)], vectors[len(items):])
        return batch


@claims_out
def distill(recognizer: str | os.PathLike, evaluator: str | os.PathLike, target: str | os.PathLike, *,
            out: str | os.PathLike, dev: str | os.PathLike | None = OPTIONS.dev, format: str = OPTIONS.format,
            encoder: str = OPTIONS.encoder, encoder_layers: int | None = OPTIONS.encoder_layers,
            pairs: int | None = OPTIONS.pairs, balanced: bool = OPTIONS.balanced,
            loss_alpha: float = OPTIONS.loss_alpha,
            alpha: bool = OPTIONS.alpha, beta: bool = OPTIONS.beta, gamma: bool = OPTIONS.gamma,
            similarity: bool = OPTIONS.similarity, config=None, head_lr_ratio: float = OPTIONS.head_lr_ratio,
            resume: bool = True, progress: bool = True) -> dict:
    """Train an MTMT student on the unlabelled ``target`` texts from the ``recognizer`` and ``evaluator`` model
    directories (spec §10.3); the best student on ``dev`` (labelled target data, used only to pick the evaluation),
    or the last one without ``dev``, is an ordinary NER model directory in ``out/best``. Returns the loop's summary.

    ``pairs`` word pairs (default: as many as the target has words) are drawn by :func:`zhie.losses.mtmt.sample_pairs`,
    class-balanced on the recogniser's predicted tags unless ``balanced=False``. ``config`` is the loop's
    :class:`~zhie.training.TrainConfig` (its ``lr`` None: :data:`MTMT_LR`); the head learns at ``lr * head_lr_ratio``
    (official: 1/1000).
    ``alpha``/``beta``/``gamma``/``similarity`` switch the weights and the similarity task (ablations; all four off
    is single-teacher distillation, TSL).
    """
    given = config or TrainConfig(batch_size=MTMT_BATCH)
    lr = MTMT_LR if given.lr is None else given.lr
    config = dataclasses.replace(given, lr=lr, head_lr=lr * head_lr_ratio)
    device = local_device()  # under torchrun each process's own GPU
    rec, ev = load_teachers([recognizer], device), load_teachers([evaluator], device)
    if not (isinstance(rec.task, NerTask) and rec.task.config.words):
        raise ValueError(f"{recognizer} is not a word-level NER model; train the recogniser with "
                         "`zhie train ner --mode word --head softmax`")
    if not isinstance(ev.task, XnerEvaluatorTask):
        raise ValueError(f"{evaluator} is a {ev.task.name!r} model; train the evaluator with "
                         "`zhie train xner-evaluator`")
    texts = read_target(target, format)
    dev_examples = read_ner(dev, "auto" if format == "text" else format) if dev is not None else None
    enc, tokenizer = prepare_encoder(str(encoder), texts=texts, mode="subword", keep_tokens="all",
                                     layers=encoder_layers, seed=config.seed)
    student = NerTask(dataclasses.replace(rec.task.config), tokenizer)
    teachers = Teachers((rec.task, rec.model), (ev.task, ev.model), student.text_tokenizer, texts,
                        student.config.max_length, device)
    tags = teachers.tags()
    n_words = sum(t is not None for row in tags for t in row)
    chosen = sample_pairs(tags, pairs or n_words, balanced=balanced, seed=config.seed)
    items = [DistillPair(i, w, j, v) for (i, w), (j, v), _ in chosen]
    lengths = [max(len(teachers.inputs[0][it.a][0]), len(teachers.inputs[0][it.b][0])) for it in items]
    with seeded(config.seed):
        model = Model(enc, student.build_heads(enc.config.hidden_size))
    objective = MtmtObjective(student.head_name, loss_alpha, alpha, beta, gamma, similarity)

    out = Path(out)
    summary = {"recognizer": str(recognizer), "evaluator": str(evaluator), "target": str(target), "dev": str(dev),
               "encoder": str(encoder), "encoder_layers": enc.config.num_hidden_layers, "target_texts": len(texts),
               "target_words": n_words, "pairs": len(items), "same_tag_pairs": sum(same for _, _, same in chosen),
               **objective.switches, "balanced": balanced, "head_lr": config.head_lr}
    if is_main_process():
        write_summary(out / "distill.json", summary, progress)
        write_run_config(out, "distill mtmt", {"recognizer": str(recognizer), "evaluator": str(evaluator),
                                               "target": str(target), "dev": dev, "out": str(out), "format": format,
                                               "encoder": str(encoder), "encoder_layers": encoder_layers,
                                               "pairs": pairs, "balanced": balanced, "loss_alpha": loss_alpha,
                                               "alpha": alpha, "beta": beta, "gamma": gamma, "similarity": similarity,
                                               "head_lr_ratio": head_lr_ratio},
                         given, {"lr": config.lr, "head_lr": config.head_lr})
    scorer = Evaluator(student, dev_examples) if dev_examples is not None else None
    files = {"target": str(target), **({"dev": str(dev)} if dev is not None else {})}  # the teachers: in options
    record = run_record(files, encoder=str(encoder), config=config, options=summary) if is_main_process() else {}
    # what the run is: the teachers' weights, the data and every setting (a resume with another is refused)
    identity = teacher_identity([recognizer, evaluator], files, {
        "format": format, "encoder": str(encoder), "encoder_layers": encoder_layers, "pairs": pairs,
        "balanced": balanced, "head_lr_ratio": head_lr_ratio, **objective.switches})
    result = train(model, items, collate=teachers.collate, loss_fn=objective, config=config, out_dir=out,
                   evaluate=scorer, metric=student.metric, save_best=saver(student, record, scorer),
                   lengths=lengths, resume=resume, progress=progress, identity=identity)
    if is_main_process():
        finish(out / "best", result, student.describe())
    return result


def add_command(jobs: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``zhie distill mtmt``: :class:`MtmtOptions`' flags and the training flags that an MTMT student takes."""
    p = jobs.add_parser("mtmt", help="the student of cross-lingual NER from a recogniser and an evaluator (spec 10.3)")
    add_job_flags(p, MtmtOptions, TRAINING, defaults={"batch_size": MTMT_BATCH})
    p.set_defaults(handler=cmd_distill_mtmt)
    return add_config_flags(p, "distill mtmt", {"training": TRAINING})


def cmd_distill_mtmt(args) -> dict:
    options = values_from_flags(args, MtmtOptions)
    return distill(options.pop("recognizer"), options.pop("evaluator"), options.pop("target"), **options,
                   config=config_from_flags(args), resume=not args.no_resume, progress=not args.quiet)
