"""The training loop (accelerate), parameter groups with learning-rate multipliers, the linear warm-up/decay
schedule, EMA weights, length-grouped batches, atomic checkpoints and resume, metric logging and plotting."""

from .batching import epoch_batches
from .checkpoint import atomic_torch_save, load_checkpoint, replace_dir
from .config import TrainConfig
from .dist import broadcast_object, is_main_process, rank, world_size
from .ema import EMA
from .loop import train
from .optim import NO_DECAY, build_param_groups, build_scheduler, linear_warmup_decay, with_lr_multipliers

__all__ = [
    "EMA",
    "NO_DECAY",
    "TrainConfig",
    "atomic_torch_save",
    "broadcast_object",
    "is_main_process",
    "rank",
    "with_lr_multipliers",
    "world_size",
    "build_param_groups",
    "build_scheduler",
    "epoch_batches",
    "linear_warmup_decay",
    "load_checkpoint",
    "replace_dir",
    "train",
]
