"""The training engine (accelerate): one loop for every job (:func:`train` for a task's items, :func:`run` with a
:class:`Job` for others, such as ``zhie pretrain``), parameter groups with learning-rate multipliers and layer-wise
decay, AdamW and LAMB, the linear warm-up/decay schedule, EMA weights, FGM/PGD adversarial training, R-Drop,
length-grouped batches, atomic checkpoints and resume, metric logging and plotting."""

from zhie.dist import broadcast_object, is_main_process, rank, world_size

from .adversarial import embedding_weight, fgm_step, pgd_step
from .batching import epoch_batches
from .checkpoint import atomic_torch_save, load_checkpoint, replace_dir
from .config import TrainConfig
from .ema import EMA
from .job import Job
from .loop import run, train
from .optim import (
                    NO_DECAY,
                    Lamb,
                    build_optimizer,
                    build_param_groups,
                    build_scheduler,
                    encoder_depth,
                    with_lr_multipliers,
)
from .rdrop import RDropLoss, symmetric_kl

__all__ = [
    "EMA",
    "Job",
    "Lamb",
    "RDropLoss",
    "embedding_weight",
    "encoder_depth",
    "fgm_step",
    "pgd_step",
    "symmetric_kl",
    "NO_DECAY",
    "TrainConfig",
    "atomic_torch_save",
    "broadcast_object",
    "is_main_process",
    "rank",
    "with_lr_multipliers",
    "world_size",
    "build_optimizer",
    "build_param_groups",
    "build_scheduler",
    "epoch_batches",
    "load_checkpoint",
    "replace_dir",
    "run",
    "train",
]
