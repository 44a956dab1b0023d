"""Hyper-parameters of the training loop."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from zhie.core.options import add_flags, option, values_from_flags
from zhie.data import FORMATS
from zhie.precision import PRECISIONS, check_precision

from .tracking import check_trackers

__all__ = ["RunOptions", "TrainConfig", "default_lr"]

ADVERSARIAL = ("fgm", "pgd")
# The default learning rates, measured on e5-small (384 wide): encoder 2e-4 and heads 10x that gave the README's NER
# and relation tables (RESULTS.md, "Defaults"); zhie train's old 2e-5 with the heads at 2e-5 left CLUENER at 0.00 dev
# F1 after an epoch. Wider encoders need smaller steps: the rate falls with the square of the width, which gives
# 5e-5 for a 768-wide BERT-base and 2.8e-5 for a 1024-wide large model, the rates BERT's authors recommend; a
# narrower encoder keeps the base rate (nothing measured says it takes a larger one).
BASE_LR = 2e-4
BASE_WIDTH = 384
HEAD_LR_RATIO = 10.0
OPTIMIZERS = ("adamw", "lamb")
TRICKS = "training options"
WATCH = "watching the run"


KEEP_TOKENS = ("auto", "all", "cjk", "data")
# --from: what teaches the old types that the new data does not label (training.extend)
OLD_TYPES = ("model", "predictions", "gold")


@dataclass
class RunOptions:
    """What a training job reads and where it writes, besides :class:`TrainConfig`: ``zhie train``'s data, encoder
    and run directory flags (:func:`zhie.fit`'s keywords of the same names take their defaults from here)."""

    train: str | None = option(None, "training file")
    dev: str | None = option(None, "development file, evaluated after each epoch")
    format: str = option("auto", "NER file format", choices=("auto", *FORMATS))
    encoder: str = option("e5-small", "a local HF model directory, e5-small (offline default), tiny, or a hub name")
    out: str | None = option(None, "run directory (best/ holds the best model)")
    encoder_layers: int | None = option(None, "keep only the encoder's first N layers")
    unshare_layers: bool = option(False, "ALBERT: give every layer its own copy of the shared weights (spec 9.1)")
    keep_tokens: str = option("auto", "prune the encoder vocabulary (char mode): auto = cjk for vocabularies over 50k",
                              choices=KEEP_TOKENS)
    from_model: str | None = option(None, "ner: start from this trained model (its encoder, head and settings); "
                                          "entity types of --train that it lacks are added, and it keeps its own "
                                          "types by teaching them on the new texts (gp/egp heads; no new type: "
                                          "continued training)", flags=("--from",), metavar="MODEL")
    old_types: str = option("model", "ner, with --from: what teaches the model's types that --train does not label: "
                                     "model (its own outputs on the new texts, as soft targets, which keeps them), "
                                     "predictions (the spans it predicts there, as 0/1 labels) or gold (--train's "
                                     "labels alone, which take its silence as no entity: naive fine-tuning, which "
                                     "forgets them; a baseline)", choices=OLD_TYPES)


@dataclass
class TrainConfig:
    """Everything :func:`zhie.training.train` needs besides the model and the data.

    Steps are optimizer steps (one step = ``grad_accum`` batches).

    Training options (issue 17; each off by default):

    * ``adversarial``: ``"fgm"`` or ``"pgd"`` adversarial training on the input (word) embeddings
      (:mod:`zhie.training.adversarial`); ``adv_epsilon`` is the norm of the perturbation (FGM) or the radius of the
      ball it stays in (PGD), ``adv_alpha`` and ``adv_steps`` are PGD's step size and number of steps.
    * ``rdrop``: R-Drop's weight ``alpha`` (:mod:`zhie.training.rdrop`); taggers only (crf/softmax heads), applied by
      :func:`zhie.fit`.
    * ``llrd``: layer-wise learning-rate decay: encoder layer ``l`` of ``L`` learns at ``lr * llrd ** (L - l)``, the
      embeddings at ``lr * llrd ** L`` (:func:`zhie.training.optim.build_param_groups`).
    * ``ema``: the EMA decay; evaluation, the best model and (without evaluation) the final model use the averaged
      weights (:mod:`zhie.training.ema`).

    ``find_unused_parameters`` is DDP's (several processes): a task whose steps leave some parameters without a
    gradient sets it (:meth:`zhie.tasks.multitask.MultiTask.loop_config`); DDP then finds them after each forward pass
    and leaves their gradients unset, as one process would (AdamW skips them), instead of failing at the next step.

    Watching a run (issue 26): ``log_every`` steps between step records (``metrics.jsonl``; None: about 100 per run,
    at least one every 50 steps), ``report_to`` the experiment trackers that get them (:mod:`zhie.training.tracking`).
    """

    epochs: int = option(3, "passes over the training data")
    max_steps: int | None = option(None, "stop after this many optimizer steps (overrides --epochs when reached)")
    batch_size: int = option(16, "items per batch and process (a step sees batch x processes x --grad-accum)")
    lr: float | None = option(None, "encoder learning rate (default: 2e-4 x min(1, (384 / the encoder's width)^2): "
                                    "2e-4 for e5-small and narrower encoders, 5e-5 for a 768-wide BERT-base; the "
                                    "similarity task 2e-5 x the same)")
    head_lr: float | None = option(None, "learning rate of everything that is not the encoder (default: 10 x --lr)")
    weight_decay: float = option(0.01, "AdamW's, not applied to biases and LayerNorm/norm weights")
    warmup: float = option(0.1, "warm-up, as a fraction of all steps (linear, then linear decay to 0)")
    grad_accum: int = option(1, "batches per optimizer step")
    max_grad_norm: float | None = option(1.0, "clip the gradient norm to this")
    ema: float | None = option(None, "EMA decay of the weights used for evaluation and the best model (e.g. 0.999)")
    seed: int = option(42, "seed of the heads' initialisation, the batches and dropout")
    patience: int | None = option(None, "stop after N evaluations without improvement")
    eval_every: int | None = option(None, "evaluate every N steps (default: each epoch)")
    save_every: int | None = option(None, "a resumable checkpoint every N steps (there is always one at each epoch "
                                          "end)")
    precision: str = option("fp32", "the encoder in bf16/fp16 under autocast (heads and losses stay fp32)",
                            choices=PRECISIONS)
    adversarial: str | None = option(None, "adversarial training on the word embeddings", choices=ADVERSARIAL,
                                     group=TRICKS)
    adv_epsilon: float = option(1.0, "FGM: norm of the perturbation; PGD: radius of the ball it stays in",
                                group=TRICKS)
    adv_alpha: float = option(0.3, "PGD: norm of each ascent step", group=TRICKS)
    adv_steps: int = option(3, "PGD: ascent steps (forward/backward passes besides the clean one)", group=TRICKS)
    rdrop: float | None = option(None, "R-Drop with this alpha (crf/softmax taggers)", metavar="ALPHA", group=TRICKS)
    llrd: float | None = option(None, "layer-wise lr decay: layer l of L learns at lr x DECAY^(L-l), the embeddings "
                                      "lowest", metavar="DECAY", group=TRICKS)
    optimizer: str = option("adamw", "adamw, or lamb (zhie.training.optim.Lamb: GAU-alpha's pre-training)",
                            choices=OPTIMIZERS)
    find_unused_parameters: bool = False  # DDP: some parameters may get no gradient on a step (set by the task)
    log_every: int | None = option(None, "steps between the step records of metrics.jsonl (mean loss, learning "
                                         "rates, gradient norm, tokens/s); default: about 100 per run, at least one "
                                         "every 50 steps", metavar="STEPS", group=WATCH)
    report_to: tuple[str, ...] = option((), "experiment trackers: tensorboard, mlflow, wandb (several allowed) or "
                                            "none; offline, in --out (install: pip install 'zhie[tensorboard]', "
                                            "'zhie[mlflow]', 'zhie[wandb]')", metavar="TRACKER", group=WATCH)

    def __post_init__(self) -> None:
        def positive(name: str, allow_none: bool = False) -> None:
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive integer, got {value!r}")

        positive("epochs")
        positive("batch_size")
        positive("grad_accum")
        positive("adv_steps")
        for name in ("max_steps", "patience", "eval_every", "save_every", "log_every"):
            positive(name, allow_none=True)
        if (self.lr is not None and self.lr < 0) or (self.head_lr is not None and self.head_lr < 0):
            raise ValueError(f"learning rates must be >= 0, got lr={self.lr}, head_lr={self.head_lr}")
        if self.weight_decay < 0:
            raise ValueError(f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if not 0.0 <= self.warmup <= 1.0:
            raise ValueError(f"TrainConfig.warmup is a fraction of the total steps in [0, 1], got {self.warmup}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"TrainConfig.max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if self.ema is not None and not 0.0 < self.ema < 1.0:
            raise ValueError(f"TrainConfig.ema is a decay in (0, 1) such as 0.999, or None; got {self.ema}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"TrainConfig.seed must be a non-negative integer, got {self.seed!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"TrainConfig.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.adversarial is not None and self.adversarial not in ADVERSARIAL:
            raise ValueError(f"TrainConfig.adversarial must be one of {ADVERSARIAL} or None, got {self.adversarial!r}")
        if self.adv_epsilon <= 0 or self.adv_alpha <= 0:
            raise ValueError(f"adv_epsilon and adv_alpha must be > 0, got {self.adv_epsilon} and {self.adv_alpha}")
        if self.rdrop is not None and self.rdrop < 0:
            raise ValueError(f"TrainConfig.rdrop is R-Drop's alpha >= 0 (or None), got {self.rdrop}")
        if self.llrd is not None and not 0.0 < self.llrd <= 1.0:
            raise ValueError(f"TrainConfig.llrd is a decay in (0, 1] such as 0.9 (or None), got {self.llrd}")
        check_precision(self.precision)
        self.report_to = check_trackers(self.report_to)

    def resolved(self, width: int, base_lr: float = BASE_LR) -> TrainConfig:
        """This config with its learning rates set: ``lr`` None -> :func:`default_lr` for an encoder ``width`` wide
        (``base_lr`` at 384: a task's own, e.g. the similarity task's 2e-5), ``head_lr`` None -> ``HEAD_LR_RATIO``
        x ``lr``."""
        lr = default_lr(width, base_lr) if self.lr is None else self.lr
        return replace(self, lr=lr, head_lr=HEAD_LR_RATIO * lr if self.head_lr is None else self.head_lr)


def default_lr(width: int, base_lr: float = BASE_LR) -> float:
    """The encoder learning rate for an encoder ``width`` (hidden size) wide: ``base_lr x min(1, (384 / width)^2)``,
    rounded to 2 significant digits (2e-4 for e5-small, 5e-5 for BERT-base)."""
    return float(f"{base_lr * min(1.0, (BASE_WIDTH / width) ** 2):.2g}")


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`TrainConfig`'s option fields (:func:`zhie.core.options.add_flags`), into ``parser`` and
    their groups, each defaulting to its field's default."""
    add_flags(parser, TrainConfig)


def add_job_flags(parser: argparse.ArgumentParser, options: type, training: list[str] | None = None,
                  defaults: dict | None = None) -> None:
    """A training job's flags: those of its ``options`` dataclass, :class:`TrainConfig`'s (``training``: those only;
    ``defaults``: the job's own), and how a session goes (:func:`add_session_flags`)."""
    add_flags(parser, options)
    add_flags(parser, TrainConfig, training, defaults=defaults)
    add_session_flags(parser)


def add_session_flags(parser: argparse.ArgumentParser) -> None:
    """``--no-resume`` and ``--quiet``, on every command that trains."""
    parser.add_argument("--no-resume", action="store_true", help="start afresh even if --out has a checkpoint")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def config_from_flags(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` of the flags of :func:`add_train_flags` in ``args`` (a field without a flag there: its
    default)."""
    return TrainConfig(**values_from_flags(args, TrainConfig))
