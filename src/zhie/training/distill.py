"""``zhie distill``: the student of cross-lingual NER by multi-task, multi-teacher distillation (MTMT, ACL 2022;
spec §10.3), a job on the training engine.

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
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

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
from zhie.tasks.pipeline import load_pipeline
from zhie.tasks.xner import XnerEvaluatorTask, pair_inputs, selected_rows, word_inputs, word_outputs

from .checkpoint import claims_out
from .config import ADVERSARIAL, TrainConfig
from .loop import train
from .record import finish, run_record, saver, write_summary
from .students import STUDENTS

__all__ = ["add_command", "cmd_distill", "distill"]

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
            out: str | os.PathLike, dev: str | os.PathLike | None = None, format: str = "auto",
            encoder: str = "e5-small", encoder_layers: int | None = None, pairs: int | None = None,
            balanced: bool = True, loss_alpha: float = 0.5, alpha: bool = True, beta: bool = True, gamma: bool = True,
            similarity: bool = True, config=None, head_lr_ratio: float = 1e-3, resume: bool = True,
            progress: bool = True) -> dict:
    """Train an MTMT student on the unlabelled ``target`` texts from the ``recognizer`` and ``evaluator`` model
    directories (spec §10.3); the best student on ``dev`` (labelled target data, used only to pick the evaluation),
    or the last one without ``dev``, is an ordinary NER model directory in ``out/best``. Returns the loop's summary.

    ``pairs`` word pairs (default: as many as the target has words) are drawn by :func:`zhie.losses.mtmt.sample_pairs`,
    class-balanced on the recogniser's predicted tags unless ``balanced=False``. ``config`` is the loop's
    :class:`~zhie.training.TrainConfig`; the head learns at ``config.lr * head_lr_ratio`` (official: 1/1000).
    ``alpha``/``beta``/``gamma``/``similarity`` switch the weights and the similarity task (ablations; all four off
    is single-teacher distillation, TSL).
    """
    config = config or TrainConfig(lr=2e-5)
    config = dataclasses.replace(config, head_lr=config.lr * head_lr_ratio)
    device = local_device()  # under torchrun each process's own GPU
    rec, ev = load_pipeline(recognizer, device=str(device)), load_pipeline(evaluator, device=str(device))
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
    evaluator = Evaluator(student, dev_examples) if dev_examples is not None else None
    files = {"target": str(target), **({"dev": str(dev)} if dev is not None else {})}  # the teachers: in options
    record = run_record(files, encoder=str(encoder), config=config, options=summary) if is_main_process() else {}
    result = train(model, items, collate=teachers.collate, loss_fn=objective, config=config, out_dir=out,
                   evaluate=evaluator, metric=student.metric, save_best=saver(student, record, evaluator),
                   lengths=lengths, resume=resume, progress=progress)
    if is_main_process():
        finish(out / "best", result, student.describe())
    return result


def dilation_list(text: str) -> list[int]:
    """``--dilations 1,2,4,8`` as ``[1, 2, 4, 8]``; argparse reports the ``ValueError`` of anything else."""
    try:
        return [int(d) for d in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,2,4,8") from None


def add_command(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``zhie distill``: a smaller student of a trained model (``--teacher``, :mod:`zhie.training.students`), or the
    MTMT student of cross-lingual NER (``--recognizer`` and ``--evaluator``); the flags are the two functions'
    arguments."""
    p = commands.add_parser("distill", help="a smaller, faster student of a trained model (--teacher), or the MTMT "
                                            "student of cross-lingual NER (--recognizer, --evaluator; spec 10.3)")
    same = p.add_argument_group("a student of a trained model (any task)")
    same.add_argument("--teacher", action="append", default=[], metavar="DIR",
                      help="the trained model directory; repeat for an ensemble of seeds (outputs averaged)")
    same.add_argument("--train", default=None, help="the labelled training file (the teacher's task reads it)")
    same.add_argument("--unlabelled", action="append", default=[], metavar="FILE",
                      help="unlabelled text, one per line or JSON lines with 'text', that the teacher labels; "
                           "repeat for several files (texts also in --dev are left out)")
    same.add_argument("--max-unlabelled", type=int, default=None, help="read at most this many unlabelled texts")
    same.add_argument("--keep-layers", default="first",
                      help="which teacher layers the student keeps: first (the first --encoder-layers), spread "
                           "(evenly spaced, ending with the last) or indices such as 2,5,8,11")
    same.add_argument("--student", default="cut", choices=list(STUDENTS),
                      help="cut: the teacher with fewer layers (--keep-layers); conv: a convolutional encoder of "
                           "--encoder-layers blocks (default 4) of --width channels over the teacher's embeddings; "
                           "narrow: a transformer of --encoder-layers layers (default 4) of --width over the "
                           "teacher's embeddings; fresh: the teacher's architecture started again from the encoder it "
                           "was fine-tuned from (born-again distillation)")
    same.add_argument("--width", type=int, default=256,
                      help="--student conv: channels of each block; narrow: hidden size (a multiple of 64)")
    same.add_argument("--dilations", type=dilation_list, default=None, metavar="D,D,...",
                      help="--student conv: the blocks' dilations, cycled (default 1,2,4,1: each token sees 17 "
                           "characters after 4 blocks; 1,2,4,8 sees 31 at the same cost)")
    same.add_argument("--bigrams", type=int, default=0, metavar="N",
                      help="--student conv or cut: add a learnt table of character bigrams hashed into N rows (e.g. "
                           "65536; default 0, none): one more gather per token; a cut student's starts at zero")
    same.add_argument("--ffn-width", type=int, default=None, metavar="N",
                      help="--student cut: keep the N most important feed-forward neurons of each kept layer (their "
                           "mean activation on the training text times their output weights' norm; e5-small has "
                           "1536): a narrower, faster transformer")
    same.add_argument("--attention-heads", type=int, default=None, metavar="K",
                      help="--student cut: keep the K attention heads of each kept layer that contribute most to its "
                           "output on the training text (e5-small has 12 of 32 dimensions): a narrower, faster "
                           "transformer")
    same.add_argument("--head", default=None,
                      help="another head of the teacher's output type (egp for a gp teacher: ~10x cheaper; softmax "
                           "for crf), fresh (give it a --head-lr such as 1e-3); default the teacher's (a cut student "
                           "keeps its weights)")
    same.add_argument("--hard-weight", type=float, default=0.5,
                      help="weight of the task's own loss on gold (and teacher-predicted) labels; the soft-target "
                           "loss gets 1 minus it")
    same.add_argument("--temperature", type=float, default=1.0, help="softens the teacher's and student's outputs")
    same.add_argument("--hidden-weight", type=float, default=0.0, metavar="W",
                      help="add W x the mean squared difference between the student's last hidden states (through a "
                           "learnt linear map) and the teacher's (TinyBERT's hidden-state loss; one --teacher; "
                           "default 0, off)")
    same.add_argument("--adversarial", default=None, choices=ADVERSARIAL,
                      help="adversarial training of the student on its word embeddings (as zhie train's; FGM took the "
                           "CLUENER teachers from 76.4-76.7 to 77.6 dev F1)")
    same.add_argument("--adv-epsilon", type=float, default=1.0,
                      help="--adversarial: FGM's perturbation norm, PGD's radius (default 1.0)")
    same.add_argument("--targets-from", default=None, metavar="RUN",
                      help="reuse the teacher outputs stored by an earlier zhie distill run (its --out directory) of "
                           "the same teachers, data and settings, instead of running the teachers again")
    mtmt = p.add_argument_group("cross-lingual NER (MTMT)")
    mtmt.add_argument("--recognizer", default=None, help="word-level NER model (zhie train ner --mode word)")
    mtmt.add_argument("--evaluator", default=None, help="similarity evaluator (zhie train xner-evaluator)")
    mtmt.add_argument("--target", default=None,
                      help="unlabelled target-language text (a NER file's labels are unused)")
    mtmt.add_argument("--encoder", default="e5-small", help="the student's initial encoder")
    mtmt.add_argument("--pairs", type=int, default=None, help="word pairs per epoch (default: one per target word)")
    mtmt.add_argument("--no-balance", dest="balanced", action="store_false",
                      help="draw partners uniformly instead of half with the same predicted tag")
    mtmt.add_argument("--loss-alpha", type=float, default=0.5, help="weight of the similarity loss")
    for name, what in (("alpha", "recogniser-confidence weight"), ("beta", "evaluator-confidence weight"),
                       ("gamma", "teacher-agreement weight"), ("similarity", "similarity task")):
        mtmt.add_argument(f"--no-{name}", dest=name, action="store_false", help=f"turn off the {what} (ablation)")
    mtmt.add_argument("--head-lr-ratio", type=float, default=1e-3, help="head learning rate / --lr (official 1/1000)")
    p.add_argument("--dev", default=None, help="labelled development file: picks the best evaluation")
    p.add_argument("--format", default="auto", choices=["auto", "text", *FORMATS],
                   help="format of the data files (MTMT: text, one sentence a line, for --target only)")
    p.add_argument("--out", required=True, help="run directory; best/ is an ordinary model directory")
    p.add_argument("--encoder-layers", type=int, default=None,
                   help="the student's encoder layers (--teacher: how many of the teacher's it keeps)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=None, help="default: 16 with --teacher, 32 for MTMT")
    p.add_argument("--lr", type=float, default=None, help="encoder learning rate (default: 1e-4 with --teacher, "
                                                          "2e-5 for MTMT)")
    p.add_argument("--head-lr", type=float, default=None, help="--teacher: the heads' learning rate (default: --lr)")
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return p


def cmd_distill(args) -> None:
    mtmt = args.recognizer is not None or args.evaluator is not None or args.target is not None
    if bool(args.teacher) == mtmt:
        raise ValueError("zhie distill takes either --teacher DIR (a smaller student of a trained model) or "
                         "--recognizer, --evaluator and --target (the MTMT student), not both and not neither")
    if mtmt and None in (args.recognizer, args.evaluator, args.target):
        raise ValueError("the MTMT student needs --recognizer, --evaluator and --target")
    if not mtmt and args.train is None:
        raise ValueError("--teacher needs --train, the labelled training file (the teacher's task reads it)")
    batch_size = args.batch_size or (32 if mtmt else 16)
    lr = args.lr or (2e-5 if mtmt else 1e-4)
    if mtmt and args.adversarial is not None:
        raise ValueError("--adversarial trains a student of --teacher; the MTMT student does not take it")
    config = TrainConfig(epochs=args.epochs, batch_size=batch_size, lr=lr, warmup=args.warmup,
                         eval_every=args.eval_every, seed=args.seed, head_lr=None if mtmt else args.head_lr,
                         adversarial=args.adversarial, adv_epsilon=args.adv_epsilon)
    if mtmt:
        result = distill(args.recognizer, args.evaluator, args.target, out=args.out, dev=args.dev, format=args.format,
                         encoder=args.encoder, encoder_layers=args.encoder_layers, pairs=args.pairs,
                         balanced=args.balanced, loss_alpha=args.loss_alpha, alpha=args.alpha, beta=args.beta,
                         gamma=args.gamma, similarity=args.similarity, config=config,
                         head_lr_ratio=args.head_lr_ratio, resume=not args.no_resume, progress=not args.quiet)
    else:
        from .students import distill_student

        result = distill_student(args.teacher, args.train, out=args.out, dev=args.dev, unlabelled=args.unlabelled,
                                 max_unlabelled=args.max_unlabelled, format=args.format, keep_layers=args.keep_layers,
                                 encoder_layers=args.encoder_layers, student=args.student, width=args.width,
                                 ffn_width=args.ffn_width, attention_heads=args.attention_heads,
                                 dilations=args.dilations, bigrams=args.bigrams, head=args.head,
                                 hard_weight=args.hard_weight, hidden_weight=args.hidden_weight,
                                 temperature=args.temperature, targets_from=args.targets_from, config=config,
                                 resume=not args.no_resume,
                                 progress=not args.quiet)
    if is_main_process():
        print(json.dumps({"best": result["best"], "best_step": result.get("best_step"),
                          "model": str(Path(args.out) / "best")}, ensure_ascii=False))
