"""``zhie train ner --from MODEL``: a trained NER model given new entity types without forgetting its own (issue 52).

The result is one model of every type, the old model's first (their indices kept), then the types only the new
training data has (sorted). It starts from the old model: its encoder, vocabulary and settings, and its head, whose
rows of the old types are copied (:func:`copy_head`: the new types append rows at the end of each per-type output, so
the old ones keep their place); the new types' rows are initialised as a fresh head's are (GP: at the prior of the new
data).

What each type learns from, on the new training texts (:class:`ExtendObjective`):

* the types that the new data labels (every new type, and an old type that it labels too): the gold labels, as in any
  training; where the new data labels an old type, gold wins over the old model for that type everywhere (an
  annotation that labels a type is taken to label all of its mentions);
* the old types that the new data does not label: the old model's outputs as soft targets, as ``zhie distill student``
  learns from a teacher (:func:`zhie.training.teachers.teacher_lessons`: computed once, stored in
  ``OUT/teacher/targets.pt``; :func:`zhie.losses.distill.span_soft_loss` at temperature 1), since the new data's
  silence on them is no evidence that a text has none. With ``old_types="predictions"`` (``--old-types
  predictions``) the same stored outputs teach as 0/1 labels instead: the spans the old model predicts (probability
  over 0.5, a logit over 0: its decoder's threshold), as if they were gold (pseudo-labels).

The two are one soft multilabel cross-entropy over every type, whose target is the old model's probabilities for the
old types and 0/1 for the gold ones (the soft loss with 0/1 targets is the head's own loss). Heads: ``gp`` and
``egp`` (span logits per type). A ``crf`` or ``softmax`` model takes new data of its own types only (a warm start):
its tags share one softmax per token, so gold and soft targets cannot be split by type.

``old_types="gold"`` (``--old-types gold``) is naive fine-tuning, the baseline that the run above is measured against
(``benchmarks/forgetting.py``): every type learns from the new data's gold labels, so an old type that it does not
label learns to be absent (0 in every cell); the old model teaches nothing, and the run trains on the head's own loss
(:func:`training`).

New data with no new type is plain continued training (a warm start): the old model, trained on the new data's gold
labels. What the run must share with the old model (refused otherwise, with the reason): the task (a NER model), the
encoder (``--encoder``, if given, is the one the old model was trained from), the head and tokenisation (``--head``,
``--mode``, if given, are the old model's), the vocabulary and layers (no ``--keep-tokens``, ``--encoder-layers``,
``--unshare-layers``). A task setting left at its default takes the old model's (``--max-length``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from zhie.model import Model
from zhie.tasks.modeldir import META_FILE, read_meta, resolve_model_dir

from .config import OLD_TYPES

__all__ = ["Extension", "ExtendObjective", "copy_head", "prepare", "training"]

logger = logging.getLogger(__name__)

SPAN_HEADS = ("gp", "egp")  # the heads whose types can be added (span logits per type)
STRUCTURAL = ("head", "mode")  # the old model's, never another one


@dataclass
class Extension:
    """What a run of :func:`zhie.fit` with ``from_model`` starts from: the old model directory, its task and model,
    the new config (old types first), the types only the new data has, and the types that learn from the new data's
    gold labels (those it labels; every type with ``old_types="gold"``)."""

    path: Path
    task: object  # the old model's NerTask
    model: Model
    config: object  # the new NerConfig
    options: dict  # the task options the run uses (a default left: the old model's value)
    encoder: str  # the encoder the old model was trained from (its training.json), or the one given
    new_labels: list[str]
    gold_labels: list[str]
    old_types: str  # what teaches the old types (OLD_TYPES): the old model's probabilities, its predictions, or gold

    @property
    def adds_types(self) -> bool:
        return bool(self.new_labels)

    @property
    def teaches(self) -> bool:
        """Whether the old model teaches types on the new texts (its soft targets): the run adds types and some type
        does not learn from gold labels."""
        return self.adds_types and len(self.gold_labels) < len(self.config.labels)


def prepare(cls, from_model: str | os.PathLike, examples: list, *, encoder: str, default_encoder: str,
            options: dict, keep_tokens: str, default_keep_tokens: str, encoder_layers: int | None,
            unshare_layers: bool, old_types: str) -> Extension:
    """Check that the model ``from_model`` can be extended by ``cls``'s training ``examples`` with ``options`` (the
    module's docstring lists what must match) and load it. ``old_types``: what teaches the old types that the
    examples do not label, ``"model"`` (the old model) or ``"gold"`` (the examples' labels: naive fine-tuning)."""
    from zhie.tasks.ner import NerTask

    if old_types not in OLD_TYPES:
        raise ValueError(f"--old-types {old_types}: choose one of {', '.join(OLD_TYPES)}")
    path = resolve_model_dir(from_model)
    if not (path / META_FILE).is_file():
        raise ValueError(f"--from {from_model}: not a model directory (no {META_FILE} there, nor in its best/); name "
                         "the model a `zhie train ner` run wrote (runs/x/best, or the run directory runs/x)")
    kind = read_meta(path)["task"]
    if not issubclass(cls, NerTask):
        raise ValueError(f"--from extends a NER model with new entity types: zhie train ner takes it, not zhie train "
                         f"{cls.name}")
    if kind != cls.name:
        raise ValueError(f"--from {from_model}: a {kind} model; zhie train ner --from extends a NER model (another "
                         "task kind's model cannot take entity types)")
    given = [flag for flag, changed in (("--keep-tokens", keep_tokens != default_keep_tokens),
                                        ("--encoder-layers", encoder_layers is not None),
                                        ("--unshare-layers", unshare_layers)) if changed]
    if given:
        raise ValueError(f"--from {from_model}: the run takes the model's encoder, vocabulary and layers as they are; "
                         f"leave out {', '.join(given)}")
    trained_from = _trained_encoder(path)
    if encoder != default_encoder and trained_from is not None and encoder != trained_from:
        raise ValueError(f"--encoder {encoder}: the model in {from_model} was trained from the encoder {trained_from}; "
                         "--from continues with its encoder and tokenizer (leave out --encoder)")
    task, model = NerTask.load(path)
    old = task.config
    merged = _merged_options(old, options, from_model)
    found = sorted({s.label for ex in examples for s in ex.spans})
    if not found:
        raise ValueError(f"no entity types: none of the {len(examples)} training examples has an entity; check --train "
                         "and --format")
    new = [label for label in found if label not in old.labels]
    fields = {k: v for k, v in merged.items() if k != "mode"}  # mode: the old model's (checked)
    config = dataclasses.replace(old, labels=[*old.labels, *new], **fields)
    if new and old.head not in SPAN_HEADS:
        raise ValueError(f"--from {from_model}: a {old.head} model; new entity types ({', '.join(new)}) are added to "
                         f"{' and '.join(SPAN_HEADS)} models only (a tagger's types share one softmax per token); "
                         "train a new model on data of every type, or give new data of the model's own types only")
    kept = [label for label in old.labels if label not in found]
    if new and old_types == "gold":
        logger.info("--from %s: %d new type(s) %s after its %d (%s); --old-types gold: the gold labels teach every "
                    "type, %s as absent from the new texts (naive fine-tuning: the old model teaches nothing)",
                    from_model, len(new), ", ".join(new), len(old.labels), ", ".join(old.labels),
                    ", ".join(kept) or "no old type")
    elif new:
        logger.info("--from %s: %d new type(s) %s after its %d (%s); the old model teaches %s on the new texts (%s), "
                    "the gold labels teach %s", from_model, len(new), ", ".join(new), len(old.labels),
                    ", ".join(old.labels), ", ".join(kept) or "no type",
                    "its predicted spans as labels" if old_types == "predictions" else "its probabilities",
                    ", ".join(found))
    else:
        logger.info("--from %s: the training data has no entity type that the model lacks: this is continued "
                    "training (a warm start) of the model on the new data's labels, with no soft targets", from_model)
        if kept:
            logger.warning("the training data labels none of the model's types %s: continued training learns them "
                           "as absent from its texts", ", ".join(kept))
    return Extension(path, task, model, config, {**options, **merged},
                     trained_from if encoder == default_encoder and trained_from else encoder, new,
                     list(config.labels) if old_types == "gold" else found, old_types)


def _trained_encoder(path: Path) -> str | None:
    """The encoder that the model in ``path`` was trained from, as its ``training.json`` names it (None: not said)."""
    record = path / "training.json"
    try:
        return json.loads(record.read_text(encoding="utf-8")).get("encoder")
    except (OSError, ValueError):
        return None


def _merged_options(old, options: dict, from_model) -> dict:
    """The task ``options`` of the run: each as given, or the old model's where it is left at its default; a head or
    tokenisation other than the old model's is refused."""
    from zhie.tasks.ner import NerConfig

    defaults = {f.name: f.default for f in dataclasses.fields(NerConfig)}
    merged = {}
    for name, value in options.items():
        mine = ("word" if old.words else old.mode) if name == "mode" else getattr(old, name, value)
        if value == mine or value == defaults.get(name):
            merged[name] = mine
        elif name in STRUCTURAL:
            raise ValueError(f"--{name} {value}: the model in {from_model} has --{name} {mine}; --from keeps the "
                             f"model's {'head' if name == 'head' else 'tokenisation'} (leave out --{name}, or train a "
                             "new model)")
        else:
            merged[name] = value
    return merged


@torch.no_grad()
def copy_head(old: nn.Module, new: nn.Module) -> None:
    """The old head's parameters into ``new``, a head of the same kind with as many or more types: a parameter of the
    same shape whole, another one's leading part along the dimensions that grew (the old types' rows: GP's ``heads x
    2d`` projection, EGP's ``2 x heads`` bias channels, a tagger's tags and transitions); the rest stays as ``new``
    was initialised."""
    state = new.state_dict()
    for name, value in old.state_dict().items():
        target = state[name]
        if value.dim() != target.dim() or any(a > b for a, b in zip(value.shape, target.shape)):
            raise ValueError(f"head parameter {name}: {tuple(value.shape)} does not fit in {tuple(target.shape)}")
        target[tuple(slice(0, n) for n in value.shape)] = value
    new.load_state_dict(state)


class ExtendObjective(nn.Module):
    """``objective(model, batch)``: the soft multilabel cross-entropy (:func:`zhie.losses.distill.span_soft_loss`)
    of every type's span logits against the old model's stored probabilities (``batch["soft_cells"]``,
    ``["soft_probs"]``) for the old types, and against the gold cells (``batch["labels"]``) for the types of
    ``gold`` (indices), which replace the old model's there; averaged over the batch and the types. ``hard``: the old
    model's probabilities made 0/1 at 0.5 (its predicted spans) before the gold cells replace them."""

    def __init__(self, task, gold: list[int], hard: bool = False) -> None:
        super().__init__()
        self.task = task
        self.hard = hard
        self.register_buffer("gold", torch.tensor(gold, dtype=torch.long), persistent=False)

    def forward(self, model: Model, batch: dict[str, Tensor]) -> Tensor:
        from zhie.losses.distill import span_soft_loss

        name = self.task.head_name
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], heads=[name])[name]
        return span_soft_loss(logits, self.targets(batch, logits), 1.0).mean()

    def targets(self, batch: dict[str, Tensor], logits: Tensor) -> Tensor:
        """The dense target ``[b, types, n, n]`` of the span ``logits`` of ``batch``: the old model's probabilities
        (0/1 at 0.5 if :attr:`hard`), replaced by the 0/1 gold cells for the types of ``gold``."""
        from zhie.losses.distill import dense_targets

        target = dense_targets(batch["soft_cells"], batch["soft_probs"], logits)
        if self.hard:
            target = (target > 0.5).float()
        target[:, self.gold] = gold_targets(batch["labels"], logits)[:, self.gold]
        return target


def gold_targets(labels: Tensor, like: Tensor) -> Tensor:
    """The sparse gold cells ``[b, types, P]`` (:func:`zhie.tasks.batching.sparse_cells`: flat cell indices, 0 for
    padding) as a dense 0/1 target shaped as the span logits ``like`` ``[b, types, n, n]``."""
    b, h, n, _ = like.shape
    dense = torch.zeros((b, h, n * n), dtype=torch.float32, device=like.device)
    dense.scatter_(2, labels.to(like.device), 1.0)
    dense[:, :, 0] = 0.0  # the padding's cell ([CLS], [CLS]: masked anyway)
    return dense.view(b, h, n, n)


def model_hashes(path: Path) -> dict:
    """The sha256 of the model directory's weights and ``zhie.json`` (what a run that extends it is made from)."""
    from .teachers import teacher_identity

    return teacher_identity([path], {}, {})["teachers"][0]


def training(ext: Extension, task, items: list, objective: nn.Module, out: Path, train_path, format: str,
             resume: bool, progress: bool) -> tuple[list, object, nn.Module]:
    """What a run that extends ``ext`` trains: its items, their collate function and the objective. Where the old
    model teaches (:attr:`Extension.teaches`), :func:`lessons`; else (no new type, or ``old_types="gold"``) the task's
    own ``items``, collate function and ``objective``: every type learns from the new data's gold labels, a type that
    it does not label as absent (0 in every cell), and nothing is asked of the old model."""
    if ext.teaches:
        return lessons(ext, task, items, out, train_path, format, resume, progress)
    return items, task.collate, objective


def lessons(ext: Extension, task, items: list, out: Path, train_path, format: str, resume: bool,
            progress: bool) -> tuple[list, object, ExtendObjective]:
    """The items of a run that adds types, each with the old model's soft targets (a
    :class:`~zhie.training.teachers.Lesson`), their collate function, and the :class:`ExtendObjective` that scores
    them. The old model (its encoder is the new model's, before training) labels the items once; its outputs are
    stored in ``out/teacher/targets.pt`` and read back by a run that resumes (:func:`teacher_lessons`)."""
    from dataclasses import asdict

    from zhie.dist import local_device
    from zhie.tasks.pipeline import Pipeline

    from .teachers import teacher_identity, teacher_lessons

    device = local_device()
    teacher = Pipeline(task, ext.model.eval(), str(device))  # the new task's collate reads the new labels
    identity = teacher_identity([ext.path], {"train": str(train_path)},
                                {"temperature": 1.0, "format": format, "task": asdict(task.config)})
    stored = teacher_lessons(teacher, lambda: items, out, identity, temperature=1.0, device=device, resume=resume,
                             progress=progress)
    gold = [task.config.labels.index(label) for label in ext.gold_labels]

    def collate(batch: list) -> dict[str, Tensor]:
        return task.soft_batch(task.collate([b.item for b in batch]), [b.target for b in batch])

    return stored["lessons"], collate, ExtendObjective(task, gold, hard=ext.old_types == "predictions")
