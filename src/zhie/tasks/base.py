"""The task base classes: :class:`Task` (the protocol every task implements), :class:`WindowedTask` (what the span
tasks add: windows over long texts), and :class:`Evaluator` (a task's evaluation as the training loop calls it).

Over 400 lines: two base classes whose docstrings are the protocol's reference, and the names re-exported below.

A task is one class in one file under ``zhie/tasks/`` (see :class:`Task`); :mod:`zhie.tasks` finds it, and the CLI,
:func:`zhie.fit` and :func:`zhie.load` use it through that registry. What tasks share lives beside this module:
:mod:`~zhie.tasks.modeldir` (model directories on disk), :mod:`~zhie.tasks.batching` (padding, batches),
:mod:`~zhie.tasks.encoder_prep` (the encoder a run starts from), :mod:`~zhie.tasks.cli_flags` (flags and commands)
and :mod:`~zhie.tasks.pipeline` (what :func:`zhie.load` returns); their names are also importable from here, as they
were before they moved. Those modules sit below this one: what they need of a task is
:class:`~zhie.tasks.pipeline.PipelineTask`, so none imports it.

This module, and a task's module, import no torch: prediction runs on numpy arrays (a model's :meth:`arrays`, decoded
by :mod:`zhie.core.decoding`) so that an export predicts without torch (:mod:`zhie.deploy.runtime`); what trains (heads,
losses, tensors) is imported where it is used.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from zhie.core.options import add_flags
from zhie.core.text import Encoding, TextTokenizer, reporting_window, windows
from zhie.tasks.batching import (
    chunks,
    device_of,
    input_arrays,
    model_inputs,
    pad,
    pad_array,
    seeded,
    sorted_batches,
    sparse_cells,
)
from zhie.tasks.cli_flags import (
    OUTPUT_HELP,
    TextCommand,
    add_batching_flags,
    add_prediction_flags,
    add_text_command,
    check_max_length,
    device_name,
    only_auto_format,
    positive_int,
)
from zhie.tasks.encoder_prep import CJK_CHARSET, kept_token_ids, prepare_encoder
from zhie.tasks.modeldir import (
    HEAD_FILE,
    META_FILE,
    MODEL_FORMAT,
    load_weights,
    read_meta,
    rename_weights,
    resolve_model_dir,
    save_model_dir,
)
from zhie.tasks.pipeline import CHUNK_LINES, Pipeline, load_pipeline, stream_predictions

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor, nn

    from zhie.model import Model

__all__ = [
    "Evaluator", "Task", "WindowedTask",
    # re-exported from the modules they moved to: `from zhie.tasks.base import NAME` keeps working
    "CHUNK_LINES", "CJK_CHARSET", "HEAD_FILE", "META_FILE", "MODEL_FORMAT", "OUTPUT_HELP", "Pipeline", "TextCommand",
    "add_batching_flags", "add_prediction_flags", "add_text_command", "check_max_length", "chunks", "device_name",
    "device_of", "input_arrays", "kept_token_ids", "load_pipeline", "load_weights", "model_inputs",
    "only_auto_format", "pad", "pad_array", "positive_int", "prepare_encoder", "read_meta", "rename_weights",
    "resolve_model_dir", "save_model_dir", "seeded", "sorted_batches", "sparse_cells", "stream_predictions",
]


# ------------------------------------------------------------------------------------------------- the protocol
class Task:
    """One task: its configuration, data, heads, loss, decoding, metrics, CLI flags and JSON output.

    A subclass, registered with :func:`zhie.tasks.register`, sets the class attributes and implements the methods
    that raise ``NotImplementedError`` here; the rest have defaults. ``config`` is the subclass's dataclass (saved
    in ``zhie.json``, with a ``mode`` of ``"char"`` or ``"subword"``), ``tokenizer`` the encoder's tokenizer.

    Training (:func:`zhie.fit`): ``read`` -> ``configure`` -> encoder -> ``build_heads`` -> ``encode`` ->
    ``collate`` / ``objective`` in the loop, :class:`Evaluator` (``evaluate`` -> ``score`` -> ``summary``) after
    each epoch, ``save``. Prediction (:func:`zhie.load`): ``load`` -> ``predict`` -> ``to_json``.
    """

    name: ClassVar[str]                    # `zhie train NAME`, "task" in zhie.json
    aliases: ClassVar[tuple[str, ...]] = ()
    help: ClassVar[str] = ""               # one line for `zhie train --help`
    config_class: ClassVar[type]
    output_key: ClassVar[str]              # the key of a prediction in `zhie predict`'s JSON lines
    metric: ClassVar[str] = "f1"           # what the best model maximises
    group_by_length: ClassVar[bool] = True  # training batches of similar lengths (items have ``ids``)
    data_flags: ClassVar[bool] = True      # False: the task's own options name its data (multitask's --config), and
                                           # `zhie train NAME` has no --train/--dev/--format
    pipeline_class: ClassVar[type] = Pipeline  # what zhie.load returns
    base_lr: ClassVar[float] = 2e-4        # the default encoder learning rate at 384 wide, scaled to the encoder's
                                           # width by zhie.training.config.default_lr (heads: 10x)
    option_names: ClassVar[tuple[str, ...] | None] = None  # the option fields of config_class that are flags of
                                           # `zhie train NAME` (zhie.core.options.option); None: all of them

    def __init__(self, config, tokenizer) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.stats: dict[str, Any] = {}
        self.head_name: str = self.name  # its head in the :class:`zhie.model.Model` (a multi-task member's: its name)

    # ---------------------------------------------------------------------------------------- data and config
    @classmethod
    def add_arguments(cls, parser: argparse._ActionsContainer) -> None:
        """The task's own flags of ``zhie train NAME``; their ``dest`` names are the keywords of ``configure``. By
        default the option fields of ``config_class`` (:func:`zhie.core.options.option`; those of ``option_names``),
        each defaulting to its field's default."""
        add_flags(parser, cls.config_class, cls.option_names)

    @classmethod
    def read(cls, path: str | os.PathLike, format: str = "auto") -> list:
        raise NotImplementedError

    @classmethod
    def read_splits(cls, train_path, dev_path, format: str = "auto", **options) -> tuple[list, list]:
        """The training and development examples of :func:`zhie.fit`: ``read`` of each file (``options`` are those
        of ``configure``; a task with ``data_flags = False`` finds its data there)."""
        return cls.read(train_path, format), cls.read(dev_path, format)

    @classmethod
    def data_files(cls, train_path, dev_path, **options) -> dict[str, str]:
        """The files a run of :func:`zhie.fit` reads, by role (``train``, ``dev``, …; ``options`` as in
        ``read_splits``): their sizes and hashes go into the model's ``training.json``."""
        return {role: str(path) for role, path in (("train", train_path), ("dev", dev_path)) if path is not None}

    @staticmethod
    def texts(examples: list) -> list[str]:
        """The texts of ``examples`` (they decide which tokens a pruned vocabulary keeps)."""
        return [ex.text for ex in examples]

    @classmethod
    def vocabulary_texts(cls, examples: list, config) -> list[str]:
        """The texts of ``examples`` as the encoder will read them under ``config`` (a pruned vocabulary keeps their
        tokens: :func:`prepare_encoder`)."""
        return cls.texts(examples)

    @classmethod
    def configure(cls, examples: list, *, encoder: str, **options):
        """The task's config from the training ``examples``, the encoder's name and the options (CLI flags)."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------- training
    def build_heads(self, hidden_size: int) -> dict[str, nn.Module]:
        raise NotImplementedError

    def loop_config(self, config):
        """The :class:`~zhie.training.TrainConfig` the loop runs with, given the user's (called before ``encode``); a
        task whose training items are not examples changes it (multitask: one item per step, ``batch_size`` 1)."""
        return config

    def encode(self, examples: list) -> list:
        """Training items (each with ``ids`` when ``group_by_length``); counts what was dropped in ``stats``."""
        raise NotImplementedError

    def collate(self, items: list) -> dict[str, Tensor]:
        raise NotImplementedError

    def loss(self, model: Model, batch: dict[str, Tensor]) -> Tensor:
        """Run the encoder and this task's head only on ``batch`` and score the head (a multi-task loss calls this
        once per member batch)."""
        outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], heads=[self.head_name])
        return self.head_loss(model.heads[self.head_name], outputs[self.head_name], batch)

    def head_loss(self, head: nn.Module, output: Any, batch: dict[str, Tensor]) -> Tensor:
        """The loss of this task's head given its output on ``batch``."""
        raise NotImplementedError

    def objective(self, hidden_size: int) -> nn.Module:
        """What the training loop minimises: a module, ``objective(model, batch) -> scalar``. A task whose loss has
        weights of its own (trained, but not saved with the model) returns a :class:`zhie.losses.TaskLoss` subclass
        holding them."""
        from zhie.losses import TaskLoss

        return TaskLoss(self)

    # ---------------------------------------------------------------------------------------- prediction, metrics
    def predict(self, model: Model, texts: list[str], batch_size: int = 32, max_tokens: int | None = None) -> list:
        """One prediction per text, in input order; batches of ``batch_size`` texts, or of at most ``max_tokens``
        padded tokens (:func:`sorted_batches`)."""
        raise NotImplementedError

    def to_json(self, prediction) -> object:
        """One text's prediction as JSON (the value under ``output_key``)."""
        return [x.to_dict() for x in prediction]

    def score(self, examples: list, predictions: list) -> dict:
        raise NotImplementedError

    def evaluate(self, model: Model, examples: list, batch_size: int = 32, max_tokens: int | None = None) -> dict:
        return self.score(examples, self.predict(model, self.texts(examples), batch_size, max_tokens=max_tokens))

    def summary(self, metrics: dict) -> dict[str, float]:
        """The numbers of ``metrics`` logged after each epoch (``metric`` among them): its top-level floats."""
        return {k: v for k, v in metrics.items() if isinstance(v, float)}

    def report(self, metrics: dict) -> str:
        """What ``zhie eval`` prints."""
        return json.dumps(metrics, ensure_ascii=False)

    def unknown_labels(self, examples: list) -> Counter:
        """The gold labels of ``examples`` that this task's model cannot predict (not among its entity types or
        predicates), with their counts: ``zhie eval`` warns of them, as they can only count as missed."""
        return Counter()

    def errors(self, example, prediction) -> list[dict]:
        """What ``prediction`` gets wrong against the labelled ``example`` (``zhie eval --errors``,
        :mod:`zhie.deploy.error_report`): one JSON-able dict per error with ``kind``, character offsets ``start`` and
        ``end`` (exclusive), and ``gold`` and ``predicted`` (strings, or None where that side has nothing), which the
        report counts as confusions."""
        raise ValueError(f"the {self.name} task has no error report; leave out --errors")

    def describe(self) -> dict:
        """What the model card (:mod:`zhie.core.card`) says of this task's model: ``summary`` (one line),
        ``pipeline_tag`` (the Hub's), ``metrics`` (their Hub names), ``labels`` (``{"title", "values"}`` or None) and
        ``limits`` (sentences); optionally ``language`` (the Hub's code; default ``"zh"``, None: not known); a
        multi-task model adds ``members``, the name and ``describe()`` of each."""
        return {"summary": self.help or f"the {self.name} task", "pipeline_tag": "token-classification",
                "metrics": [self.metric], "labels": None, "limits": []}

    @classmethod
    def add_commands(cls, commands: argparse._SubParsersAction) -> None:
        """Commands of the task's own (``zhie segment``, ``zhie embed``): a command over texts with
        :func:`add_text_command`, any other one setting ``handler=function(args)``."""

    def prior_loss(self, items: list, batch_size: int) -> float:
        """The loss of a model that knows only the labels' statistics, on the training ``items`` in batches of
        ``batch_size`` (prior-loss normalisation, spec §5.1.3; :mod:`zhie.multitask.priors`)."""
        raise ValueError(f"no prior loss is derived for the {self.name} task; use another weighting scheme")

    # ---------------------------------------------------------------------------------------- distillation
    # ``zhie distill student`` (:mod:`zhie.training.students`): the student's items are this task's training items,
    # of the labelled examples and of unlabelled texts that the teacher labels; each item carries the teacher's soft
    # targets, computed once (``soft_targets``), added to its batch (``soft_batch``) and scored (``soft_loss``).
    hard_labels: ClassVar[bool] = True  # False: the student learns from the teacher's outputs only (no hard loss)
    soft_temperature: ClassVar[bool] = True  # False: soft_targets and soft_loss take no temperature (--temperature)
    item_types: ClassVar[tuple[type, ...]] = ()  # the classes of the training items: a student's stored teacher
    # outputs hold them, and load with them allowed and nothing else (torch.load(weights_only=True))

    def distill_items(self, examples: list, texts: list[str], label: Callable[[list[str]], list]) -> list:
        """The student's training items: those of the labelled ``examples`` and of the unlabelled ``texts``, labelled
        by ``label(texts)`` (the teacher's predictions, as ``predict`` returns them)."""
        raise ValueError(f"the {self.name} task cannot be distilled yet; train the smaller model with zhie train")

    def soft_targets(self, output: Any, batch: dict[str, Tensor], temperature: float) -> list:
        """The teacher head's ``output`` on a collated ``batch`` of items -> one compact target per item, on the CPU."""
        raise NotImplementedError

    def soft_batch(self, batch: dict[str, Tensor], targets: list) -> dict[str, Tensor]:
        """``batch`` (collated items) with their stored ``targets`` added as tensors."""
        raise NotImplementedError

    def soft_loss(self, output: Any, batch: dict[str, Tensor], temperature: float) -> Tensor:
        """The student head's ``output`` against the soft targets of ``batch``: a scalar, on the scale of
        ``head_loss`` (:mod:`zhie.losses.distill`)."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------- saving, loading
    def save(self, model: Model, out: Path, record: dict | None = None) -> Path:
        """Write the model directory (:func:`save_model_dir`); ``record``: how a training run made it."""
        return save_model_dir(out, model, self.tokenizer, {"task": self.name, **asdict(self.config)}, self.save_files,
                              about=self.describe(), record=record)

    def save_files(self, directory: Path, prefix: str = "") -> None:
        """Files of the task's own in a model directory, their names starting with ``prefix`` (a multi-task member's:
        ``NAME.``); read back by ``load_files``."""

    def load_files(self, directory: Path, prefix: str = "") -> None:
        """Inverse of ``save_files``."""

    @classmethod
    def upgrade(cls, meta: dict, weights: dict[str, Tensor]) -> tuple[dict, dict[str, Tensor]]:
        """``zhie.json`` and head weights of a format-1 directory (before the task protocol) in today's names."""
        raise ValueError(f"this {cls.name} model directory was written by zhie before 0.1.0's task protocol and "
                         "cannot be converted; train it again")

    @classmethod
    def load(cls, path: str | os.PathLike):
        """``(task, model)`` from a model directory (or a run directory with ``best/``), in eval mode."""
        from safetensors.torch import load_file

        from zhie import encoders
        from zhie.encoders import WeightsMismatchError
        from zhie.model import Model

        path = resolve_model_dir(path)
        meta = read_meta(path)
        weights = load_weights(load_file, path / HEAD_FILE)
        if meta.get("format", 1) < MODEL_FORMAT:
            meta, weights = cls.upgrade(meta, weights)
        fields = cls.config_class.__dataclass_fields__
        config = cls.config_class(**{k: v for k, v in meta.items() if k in fields})
        encoder, tokenizer = encoders.load_pretrained(path)
        task = cls(config, tokenizer)
        model = Model(encoder, task.build_heads(encoder.config.hidden_size))
        state = {k: v for k, v in model.state_dict().items() if not k.startswith("encoder.")}
        missing, unexpected = sorted(set(state) - set(weights)), sorted(set(weights) - set(state))
        shapes = sorted(f"{k} {tuple(weights[k].shape)}, expected {tuple(state[k].shape)}"
                        for k in set(state) & set(weights) if weights[k].shape != state[k].shape)
        if missing or unexpected or shapes:
            raise WeightsMismatchError(f"{path}/{HEAD_FILE}: missing {missing}, unexpected {unexpected}"
                                       + (f", wrong shape {shapes} (does {META_FILE} belong to these weights?)"
                                          if shapes else ""))
        model.load_state_dict(weights, strict=False)
        model.eval()
        task.load_files(path)
        return task, model


@dataclass
class Evaluator:
    """Scores a model on a labelled set: ``evaluator(model) -> summary`` (the loop's after-epoch evaluation)."""

    task: Task
    examples: list
    batch_size: int = 32
    last: dict | None = field(default=None, init=False)  # the full metrics of the last call (per type, …)

    @property
    def metric(self) -> str:
        return self.task.metric

    def __call__(self, model: Model) -> dict[str, float]:
        self.last = self.task.evaluate(model, self.examples, self.batch_size)
        return self.task.summary(self.last)


# ------------------------------------------------------------------------------------------------- windows
class WindowedTask(Task):
    """What the span tasks share (config has ``mode``, ``max_length`` and ``overlap``): model inputs, windows over
    long texts, and the rule that decides which window reports a hit (:func:`zhie.core.text.reporting_window`).

    Subclasses implement ``decode(model, outputs, attention_mask) -> one list of hits per row``; a hit has
    ``extent``, its content tokens ``(start, end)`` (end exclusive) relative to its window.
    """

    cut_at_right_edge: bool = False  # taggers: a hit ending at a window's right edge may be a cut one

    def __init__(self, config, tokenizer) -> None:
        super().__init__(config, tokenizer)
        self.text_tokenizer = TextTokenizer(tokenizer, config.mode)

    @property
    def window(self) -> tuple[int, int]:
        """(content tokens per window, overlap between windows)."""
        size = self.config.max_length - 2
        return size, min(self.config.overlap, size - 1)

    def describe(self) -> dict:
        """The task's card facts (:meth:`Task.describe`), with what windows and the tokenisation mode imply."""
        size, overlap = self.window
        mode = ("char mode: one token per character, so offsets are exact to the character; a character the "
                "encoder's vocabulary lacks is read as its unknown token" if self.config.mode == "char" else
                "subword mode: the tokenizer's own tokens; a boundary inside a token cannot be predicted")
        windows = (f"max length {self.config.max_length} tokens ([CLS] and [SEP] included): a longer text is read "
                   f"through windows of {size} tokens overlapping by {overlap}; whatever is found (an entity, a word, "
                   f"the two mentions of a triple and what lies between them) must fit in one window, and one longer "
                   f"than {overlap} tokens may be missed or cut where two windows meet")
        return {**super().describe(), "limits": [windows, mode]}

    def distill_items(self, examples: list, texts: list[str], label: Callable[[list[str]], list]) -> list:
        """The windows of ``examples`` and of ``texts`` labelled by the teacher (``pseudo_example``); the latter are
        encoded by a fresh task, so that what this one counts from its training data (a segmenter's vocabulary for
        OOV recall, the statistics) stays that of the labelled data."""
        pseudo = [self.pseudo_example(text, p) for text, p in zip(texts, label(texts))] if texts else []
        return self.encode(examples) + type(self)(self.config, self.tokenizer).encode(pseudo)

    def pseudo_example(self, text: str, prediction) -> Any:
        """A training example of ``text`` whose labels are ``prediction`` (what ``predict`` returns for it)."""
        raise NotImplementedError

    def collate_inputs(self, items) -> dict[str, Tensor]:
        """Items with ``ids`` (content tokens) -> ``input_ids`` with the special tokens and ``attention_mask``."""
        tt = self.text_tokenizer
        return model_inputs([tt.model_input(it.ids) for it in items], tt.pad_id)

    def decode(self, model: Model, outputs: dict, attention_mask: np.ndarray) -> list[list]:
        """``outputs``: the model's :meth:`~zhie.model.Model.arrays` of a batch of windows; ``model`` gives the weights
        a decoder reads (:meth:`~zhie.model.Model.head_weights`)."""
        raise NotImplementedError

    def surprise(self, model: Model, outputs: dict, attention_mask: np.ndarray) -> np.ndarray:
        """How unsure the model is of what ``decode`` makes of the same ``outputs``: per row ``-log P`` of its decoded
        prediction under the head's own probabilities, in nats (``zhie select``'s uncertainty:
        :mod:`zhie.deploy.selection`). A task without it (the default) has no uncertainty to select by."""
        raise NotImplementedError(f"the {self.name} task's predictions have no probability to select by")

    def predict(self, model: Model, texts: list[str], batch_size: int = 32, timings: dict | None = None,
                max_tokens: int | None = None) -> list:
        """One prediction per text, in input order (long texts through overlapping windows); ``timings`` and
        ``max_tokens`` as in :meth:`window_hits`."""
        return self.from_hits(texts, self.reported_hits(model, texts, batch_size, timings, max_tokens))

    def from_hits(self, texts: list[str], hits: Iterable[tuple[int, Encoding, int, Any]]) -> list:
        """The predictions of ``texts`` from their reported hits (:meth:`reported_hits`); ``predict`` is
        ``from_hits(texts, reported_hits(...))``, and a multi-task model decodes every member from one pass."""
        raise NotImplementedError

    def window_hits(self, model: Model, texts: list[str], batch_size: int, timings: dict | None = None,
                    max_tokens: int | None = None) -> Iterator[tuple[int, Encoding, list[tuple[int, int]], int, list]]:
        """Run the model over every window of every text, longest first, in batches of ``batch_size`` windows or of
        at most ``max_tokens`` padded tokens (:func:`sorted_batches`); yield ``(text index, encoding, the text's
        windows, window index, the window's hits)``.

        ``timings`` (optional) accumulates ``model_s`` (the time spent getting each batch's outputs: building its
        inputs and waiting for the model; an export runs the batches ahead while this decodes,
        :meth:`zhie.deploy.runtime.OnnxModel.each_arrays`) and ``decode_s``.
        """
        size, overlap = self.window
        encodings = [self.text_tokenizer(t) for t in texts]
        cuts = [windows(len(enc), size, overlap) if len(enc) else [] for enc in encodings]
        jobs = [(i, w) for i, wins in enumerate(cuts) for w in range(len(wins))]
        tt = self.text_tokenizer
        specials = len(tt.model_input([]))
        lengths = [cuts[i][w][1] - cuts[i][w][0] + specials for i, w in jobs]
        plan = list(sorted_batches(lengths, batch_size, max_tokens))
        inputs = (input_arrays([tt.model_input(encodings[i].ids[slice(*cuts[i][w])])
                                for i, w in (jobs[j] for j in batch_jobs)], tt.pad_id) for batch_jobs in plan)
        results = model.each_arrays(inputs)  # numpy on the host: the device is synchronised
        for batch_jobs in plan:
            t0 = time.perf_counter()
            batch, outputs = next(results)
            mask = batch["attention_mask"]
            t1 = time.perf_counter()
            decoded = self.decode(model, outputs, mask)
            if timings is not None:
                timings["model_s"] = timings.get("model_s", 0.0) + t1 - t0
                timings["decode_s"] = timings.get("decode_s", 0.0) + time.perf_counter() - t1
            for j, row in zip(batch_jobs, decoded):
                i, w = jobs[j]
                yield i, encodings[i], cuts[i], w, row

    def reported_hits(self, model: Model, texts: list[str], batch_size: int, timings: dict | None = None,
                      max_tokens: int | None = None) -> Iterator[tuple[int, Encoding, int, Any]]:
        """``(text index, encoding, window start, hit)`` for each hit that its window reports (so each once)."""
        return self.reported(self.window_hits(model, texts, batch_size, timings, max_tokens))

    def reported(self, window_hits: Iterable[tuple[int, Encoding, list[tuple[int, int]], int, list]]
                 ) -> Iterator[tuple[int, Encoding, int, Any]]:
        """The hits of ``window_hits`` (as :meth:`window_hits` yields them) that their window reports."""
        for i, encoding, cuts, w, row in window_hits:
            if len(cuts) == 1:  # a text of one window (most): the window reports every hit it has
                yield from ((i, encoding, 0, hit) for hit in row)
                continue
            a = cuts[w][0]
            for hit in row:
                start, end = hit.extent
                if reporting_window(cuts, a + start, a + end, cut_at_right_edge=self.cut_at_right_edge) == w:
                    yield i, encoding, a, hit
