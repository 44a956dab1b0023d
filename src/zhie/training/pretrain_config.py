"""The settings of ``zhie pretrain`` (:mod:`zhie.training.pretrain`): :class:`PretrainConfig`, each setting declared
once with its flag (:func:`zhie.core.options.option`), and which of them a resumed run may change."""

from __future__ import annotations

from dataclasses import dataclass

from zhie.core.options import option
from zhie.precision import PRECISIONS

from .config import OPTIMIZERS, WATCH, TrainConfig
from .tracking import check_trackers

__all__ = ["DATA_SETTINGS", "OWN_ROPE", "RESUMABLE_CHANGES", "PretrainConfig"]

OWN_ROPE = ("roformer_v2", "gau_alpha")  # RoPE only: no position table that limits the length
MASKS = ("whole-word", "char")
TOKENS = ("char", "subword")
KEEP_TOKENS = ("auto", "all", "cjk", "data")
PRECISION_CHOICES = ("auto", *PRECISIONS)


@dataclass
class PretrainConfig:
    """Every setting that decides what pre-training computes (a resumed run must have the same ones, except those
    of :data:`RESUMABLE_CHANGES`); each declared once, with its flag of ``zhie pretrain``
    (:func:`zhie.training.pretrain.add_command`)."""

    steps: int = option(10_000, "optimizer steps (sets the schedule)")
    batch_size: int = option(32, "sequences per batch and process (a step sees batch-size x processes x grad-accum)")
    grad_accum: int = option(1, "batches per optimizer step")
    max_length: int = option(512, "tokens per packed sequence, [CLS] and [SEP] included")
    lr: float = option(5e-4, "peak learning rate")
    weight_decay: float = option(0.01, "weight decay, not applied to biases and norm weights")
    warmup: float | None = option(None, "warm-up fraction of the steps (default 0 for roformer-v2/gau-alpha, 0.06 "
                                        "otherwise)")
    optimizer: str = option("adamw", "adamw, or lamb (GAU-alpha's pre-training)", choices=OPTIMIZERS)
    max_grad_norm: float | None = 1.0  # no flag
    mask: str = option("whole-word", "mask whole words (their boundaries from --segmenter) or single characters",
                       choices=MASKS)
    mask_rate: float = option(0.15, "fraction of the tokens predicted (of those: 0.8 masked, 0.1 random, 0.1 kept)")
    segmenter: str = option("rjieba", "word boundaries for whole-word masking: rjieba, jieba or a zhie cws model "
                                      "directory")
    tokens: str = option("char", "char: one token per character, as zhie's tasks read text; subword: the tokenizer's "
                                 "tokens", choices=TOKENS)
    keep_tokens: str = option("auto", "char mode: prune the vocabulary (auto = cjk for vocabularies over 50k, as zhie "
                                      "train)", choices=KEEP_TOKENS)
    heldout: int = option(1000, "first N lines kept out for evaluation")
    shuffle_buffer: int = option(2000, "sequences in the shuffle buffer")
    seed: int = option(0, "seed of a new encoder and head, the shuffle, the masks and dropout")
    eval_every: int = option(500, "steps between held-out evaluations")
    save_every: int = option(1000, "steps between snapshots of --out (always one at the end)")
    precision: str = option("auto", "auto: bf16 autocast on CUDA GPUs that have it, else fp32",
                            choices=PRECISION_CHOICES)
    log_every: int | None = option(None, "steps between the step records of metrics.jsonl (and log lines); default: "
                                         "about 100 per run, at least one every 50 steps", metavar="STEPS",
                                   group=WATCH)
    report_to: tuple[str, ...] = option((), "experiment trackers: tensorboard, mlflow, wandb (several allowed) or "
                                            "none; offline, in <out>-logs", metavar="TRACKER", group=WATCH)

    def __post_init__(self) -> None:
        self.report_to = check_trackers(self.report_to)
        if self.log_every is not None and (not isinstance(self.log_every, int) or self.log_every < 1):
            raise ValueError(f"log_every must be a positive integer or None, got {self.log_every!r}")
        for name in ("steps", "batch_size", "grad_accum", "shuffle_buffer", "eval_every", "save_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.heldout, int) or self.heldout < 0:
            raise ValueError(f"heldout must be a number of lines >= 0, got {self.heldout!r}")
        if not isinstance(self.max_length, int) or self.max_length < 8:
            raise ValueError(f"max_length must be an integer >= 8, got {self.max_length!r}")
        if self.lr < 0 or self.weight_decay < 0:
            raise ValueError(f"lr and weight_decay must be >= 0, got {self.lr}, {self.weight_decay}")
        if self.warmup is not None and not 0 <= self.warmup <= 1:
            raise ValueError(f"warmup is a fraction of the steps in [0, 1], got {self.warmup}")
        if not 0 < self.mask_rate < 1:
            raise ValueError(f"mask_rate must be in (0, 1), got {self.mask_rate}")
        choices = {"optimizer": OPTIMIZERS, "mask": MASKS, "tokens": TOKENS, "precision": PRECISION_CHOICES,
                   "keep_tokens": KEEP_TOKENS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")

    def warmup_for(self, model_type: str) -> float:
        """``warmup``, or its default for ``model_type``: 0 for RoFormerV2/GAU-α (spec §6.4), 0.06 for the others."""
        return self.warmup if self.warmup is not None else (0.0 if model_type in OWN_ROPE else 0.06)

    def train_config(self, model_type: str, precision: str) -> TrainConfig:
        """The engine's :class:`~zhie.training.TrainConfig` for this run (``precision`` already picked:
        :func:`zhie.precision.pick_precision`)."""
        return TrainConfig(epochs=1, max_steps=self.steps, batch_size=self.batch_size, grad_accum=self.grad_accum,
                           lr=self.lr, head_lr=self.lr, weight_decay=self.weight_decay,
                           warmup=self.warmup_for(model_type),
                           optimizer=self.optimizer, max_grad_norm=self.max_grad_norm, seed=self.seed,
                           eval_every=self.eval_every, save_every=self.save_every, precision=precision,
                           log_every=self.log_every, report_to=self.report_to)


# The engine's settings that may differ when a run resumes: they change when evaluations and snapshots happen (and the
# precision: a run may go on on another machine), not what is trained.
RESUMABLE_CHANGES = frozenset({"eval_every", "save_every", "precision", "log_every", "report_to"})
# The settings of the data, which a resumed run must share (the engine compares the others).
DATA_SETTINGS = ("max_length", "mask", "mask_rate", "segmenter", "tokens", "keep_tokens", "heldout", "shuffle_buffer")
