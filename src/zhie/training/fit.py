"""One training driver for every task: ``zhie.fit("ner", train, dev, out=…, head="crf")``.

Read the data with the task's reader, configure the task from the training data, load (and prune) the encoder,
build the model (the encoder plus the task's heads, initialised from the seed), encode the training items, write
``data_stats.json`` and run :func:`zhie.training.train` with an :class:`~zhie.tasks.base.Evaluator` on the dev set;
the best model is saved in ``out/best`` by the task, with ``training.json`` (the data files' sizes and hashes, the
command, the machine, its dev metrics, and once the run ends its training time: :mod:`zhie.training.record`) and its
model card ``README.md`` (:mod:`zhie.core.card`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from zhie import tasks
from zhie.core.files import atomic_write_text
from zhie.dist import is_main_process
from zhie.losses import TaskLoss
from zhie.model import Model
from zhie.tasks.base import Evaluator, Task
from zhie.tasks.batching import seeded
from zhie.tasks.encoder_prep import prepare_encoder

from . import extend
from .checkpoint import claims_out
from .config import RunOptions, TrainConfig
from .loop import train
from .rdrop import RDropLoss
from .record import file_facts, finish, run_record, saver, write_run_config

__all__ = ["fit"]

logger = logging.getLogger(__name__)


@claims_out
def fit(task: str | type[Task], train_path: str | os.PathLike | None = None,
        dev_path: str | os.PathLike | None = None, *, out: str | os.PathLike, encoder: str = RunOptions.encoder,
        keep_tokens: str = RunOptions.keep_tokens, encoder_layers: int | None = RunOptions.encoder_layers,
        unshare_layers: bool = RunOptions.unshare_layers, format: str = RunOptions.format,
        from_model: str | os.PathLike | None = RunOptions.from_model, old_types: str = RunOptions.old_types,
        config: TrainConfig | None = None, resume: bool = True, progress: bool = True, **options) -> dict:
    """Train ``task`` (a registered name or class) on ``train_path``, keep the best model on ``dev_path`` in
    ``out/best``; returns the loop's summary (``best``, ``best_step``, ``steps``, ``history``).

    ``options`` are the task's own (its ``zhie train TASK`` flags: ``head``, ``max_length``, ``loss``, …; a task whose
    options name its data, ``multitask``'s ``tasks_file``, needs no ``train_path`` and ``dev_path``);
    ``keep_tokens``, ``encoder_layers`` and ``unshare_layers`` (ALBERT) shape the encoder
    (:func:`~zhie.tasks.encoder_prep.prepare_encoder`). ``config.rdrop`` replaces the task's loss by
    :class:`~zhie.training.rdrop.RDropLoss` (taggers only); the other training options of ``config`` act in the loop.
    ``from_model`` (``ner`` only): start from that trained model, adding the entity types of ``train_path`` that it
    lacks and keeping its own (:mod:`zhie.training.extend`); ``old_types="gold"``: the old types that ``train_path``
    does not label learn from its labels alone, as absent (naive fine-tuning, a baseline); ``"predictions"``: from the
    spans the old model predicts on its texts, as 0/1 labels (``"model"``: its probabilities, soft targets).
    """
    cls = tasks.get(task) if isinstance(task, str) else task
    given = config = config or TrainConfig()  # given: as the caller set it, rates None (derived) included
    out = Path(out)
    train_examples, dev_examples = cls.read_splits(train_path, dev_path, format, **options)
    ext = None
    if from_model is None and old_types != RunOptions.old_types:
        raise ValueError(f"--old-types {old_types}: only with --from MODEL (what teaches the old model's types)")
    if from_model is not None:  # the old model's encoder, vocabulary and settings (zhie.training.extend)
        ext = extend.prepare(cls, from_model, train_examples, encoder=str(encoder),
                             default_encoder=RunOptions.encoder, options=options, keep_tokens=keep_tokens,
                             default_keep_tokens=RunOptions.keep_tokens,
                             encoder_layers=encoder_layers, unshare_layers=unshare_layers, old_types=old_types)
        if config.rdrop is not None:
            raise ValueError("--from with --rdrop: R-Drop regularises one task's plain loss; leave it out")
        options, encoder, task_config = ext.options, ext.encoder, ext.config
        enc, tokenizer = ext.model.encoder, ext.task.tokenizer
    else:
        task_config = cls.configure(train_examples, encoder=str(encoder), **options)
        texts = cls.vocabulary_texts(train_examples + dev_examples, task_config)
        enc, tokenizer = prepare_encoder(str(encoder), texts=texts, mode=task_config.mode, keep_tokens=keep_tokens,
                                         layers=encoder_layers, seed=config.seed, unshare=unshare_layers)
    t = cls(task_config, tokenizer)
    config = config.resolved(enc.config.hidden_size, cls.base_lr)
    loop_config = t.loop_config(config)
    items = t.encode(train_examples)
    with seeded(config.seed):  # the same heads (and loss weights) in every run with this seed
        model = Model(enc, t.build_heads(enc.config.hidden_size))
        objective = t.objective(enc.config.hidden_size)
    collate = t.collate
    if ext is not None:
        extend.copy_head(ext.model.heads[t.head_name], model.heads[t.head_name])
        # the old types' soft targets where the old model teaches (its outputs on the items, stored in out)
        items, collate, objective = extend.training(ext, t, items, objective, out, train_path, format, resume,
                                                    progress)
    if config.rdrop is not None:
        if type(objective) is not TaskLoss:
            raise ValueError(f"R-Drop (--rdrop) applies to one task's plain loss; the {cls.name} task trains "
                             f"{type(objective).__name__} (train it without --rdrop)")
        objective = RDropLoss(t, config.rdrop, model.heads[t.head_name])
    evaluator = Evaluator(t, dev_examples)
    settings = {"task": cls.name, "keep_tokens": keep_tokens, "encoder_layers": encoder_layers,
                "unshare_layers": unshare_layers, "format": format,
                **({"from_model": str(from_model), "from_sha256": extend.model_hashes(ext.path),
                    "new_labels": ext.new_labels, "old_types": old_types} if ext is not None else {}), **options}
    files = cls.data_files(train_path, dev_path, **options)
    record = run_record(files, encoder=str(encoder), config=config, options=settings) if is_main_process() else {}
    identity = {"encoder": str(encoder), "vocab": len(tokenizer), "encoder_layers": enc.config.num_hidden_layers,
                **{f"{cls.name}.{k}": v for k, v in vars(task_config).items()},
                **{k: v for k, v in settings.items() if k not in options},
                **{f"data.{role}": file_facts(role, path)["sha256"] for role, path in files.items()}}

    data = {"train": str(train_path), "dev": str(dev_path)} if train_path is not None else {}
    summary = {"task": cls.name, **data, "examples": len(train_examples),
               **t.stats, "encoder": str(encoder), "vocab": len(tokenizer),
               "encoder_layers": enc.config.num_hidden_layers, **vars(task_config)}
    if is_main_process():
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "data_stats.json", json.dumps(summary, ensure_ascii=False, indent=2))
        write_run_config(out, f"train {cls.name}",
                         {**data, **({"format": format} if cls.data_flags else {}), "encoder": str(encoder),
                          "keep_tokens": keep_tokens, "encoder_layers": encoder_layers,
                          "unshare_layers": unshare_layers, "out": str(out),
                          **({"from_model": str(from_model), "old_types": old_types}
                             if from_model is not None else {})},
                         given, {"lr": config.lr, "head_lr": config.head_lr}, {cls.name: options})
        if progress:
            logger.info(json.dumps({k: v for k, v in summary.items() if not isinstance(v, list) or len(v) <= 20},
                                   ensure_ascii=False))
    result = train(model, items, collate=collate, loss_fn=objective, config=loop_config, out_dir=out,
                   evaluate=evaluator, metric=t.metric, save_best=saver(t, record, evaluator),
                   lengths=[len(getattr(it, "item", it).ids) for it in items] if t.group_by_length else None,
                   resume=resume, progress=progress,
                   train_log=objective.log if isinstance(objective, TaskLoss) else None,
                   step_log=objective.step_log if isinstance(objective, TaskLoss) else None,
                   hparams={"encoder": str(encoder), **data, **settings}, identity=identity)
    if is_main_process():  # a finished run's model and card stay as they were (finish() sees it)
        finish(out / "best", result, t.describe())
    return result
