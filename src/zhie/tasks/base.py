"""The task protocol, and what every task shares: model directories on disk, padding, windows, evaluation.

A task is one class in one file under ``zhie/tasks/`` (see :class:`Task`); :mod:`zhie.tasks` finds it, and the CLI,
:func:`zhie.fit` and :func:`zhie.load` use it through that registry.

This module, and a task's module, import no torch: prediction runs on numpy arrays (a model's :meth:`arrays`, decoded
by :mod:`zhie.core.decoding`) so that an export predicts without torch (:mod:`zhie.deploy.runtime`); what trains (heads,
losses, tensors) is imported where it is used.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from zhie.core import card
from zhie.core.files import replace_dir
from zhie.core.options import add_flags
from zhie.core.text import Encoding, TextTokenizer, reporting_window, windows
from zhie.data.base import TEXT_FORMATS
from zhie.precision import PRECISIONS, autocast
from zhie.version import __version__

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from zhie.model import Model

META_FILE = "zhie.json"
HEAD_FILE = "head.safetensors"
MODEL_FORMAT = 2  # 1: zhie 0.1.0 before the task protocol (one model class per task); 2: encoder + named heads
CHUNK_LINES = 4096  # texts read and predicted at a time by Pipeline.stream (zhie predict's --chunk-lines)
T = TypeVar("T")


# ------------------------------------------------------------------------------------------------- model directories
def save_model_dir(out: str | os.PathLike, model: Model, tokenizer, meta: dict,
                   files: Callable[[Path], None] | None = None, about: dict | None = None,
                   record: dict | None = None) -> Path:
    """Write ``model`` as an HF-style directory, atomically.

    The encoder's ``config.json`` + ``model.safetensors`` and the tokenizer files (so the directory is also a plain
    fine-tuned encoder for transformers), ``head.safetensors`` with every other weight (``heads.<name>.…``),
    ``zhie.json`` (task, its configuration, model format, zhie version), what ``files(directory)`` writes,
    ``training.json`` (``record``: how a training run made the model, :mod:`zhie.training.record`) when given, and
    the model card ``README.md`` made from them and the task's ``about`` (:meth:`Task.describe`; :mod:`zhie.core.card`).
    """
    from safetensors.torch import save_file

    from zhie.encoders import quiet_transformers

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        with quiet_transformers():
            model.encoder.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        head = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
                if not k.startswith("encoder.")}
        save_file(head, str(tmp / HEAD_FILE), metadata={"format": "pt"})
        meta_text = json.dumps({**meta, "format": MODEL_FORMAT, "zhie_version": __version__}, ensure_ascii=False,
                               indent=2)
        (tmp / META_FILE).write_text(meta_text, encoding="utf-8")
        if files is not None:
            files(tmp)
        if record is not None:
            (tmp / card.RECORD_FILE).write_text(json.dumps(record, ensure_ascii=False, indent=2), encoding="utf-8")
        (tmp / card.CARD_FILE).write_text(card.render(json.loads(meta_text), record, about), encoding="utf-8")

    replace_dir(out, write)
    return out


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """A model directory, or a training run directory whose ``best/`` holds one."""
    path = Path(path)
    if not (path / META_FILE).exists() and (path / "best" / META_FILE).exists():
        return path / "best"
    return path


def read_meta(path: str | os.PathLike) -> dict:
    file = resolve_model_dir(path) / META_FILE
    if not file.exists():
        raise FileNotFoundError(f"{path}: no {META_FILE}; is this a model directory written by `zhie train`?")
    damaged = "the model directory is damaged or was edited: copy it again, or train the model again"
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file}: not valid JSON ({err}); {damaged}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("task"), str):
        raise ValueError(f"{file}: expected a JSON object with the model's \"task\"; {damaged}")
    return meta


def load_weights(load_file: Callable[[str], dict], file: Path) -> dict:
    """``load_file(file)`` (safetensors' torch or numpy ``load_file``), with a clear error for a missing, truncated or
    damaged file."""
    from safetensors import SafetensorError

    again = "copy the model directory again, or train the model again"
    if not file.is_file():
        raise FileNotFoundError(f"{file}: missing from the model directory; {again}")
    try:
        return load_file(str(file))
    except SafetensorError as err:
        raise ValueError(f"{file}: cannot be read ({err}): the file is truncated or damaged; {again}") from None


# ------------------------------------------------------------------------------------------------- tensors
def pad_array(rows: Sequence[Sequence[int]], value: int, length: int | None = None) -> np.ndarray:
    """Right-pad integer rows into a ``[len(rows), length]`` int64 array."""
    return _padded(rows, value, length)[0]


def input_arrays(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, np.ndarray]:
    """Token id rows (special tokens included) -> right-padded ``input_ids`` and ``attention_mask`` (int64 arrays)."""
    ids, mask = _padded(rows, pad_id)
    return {"input_ids": ids, "attention_mask": mask.astype(np.int64)}


def _padded(rows: Sequence[Sequence[int]], value: int, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(rows right-padded with value into [len(rows), length] int64, the bool mask of the cells the rows fill)``, in
    one scatter of all the rows' values (a row longer than ``length`` is an error)."""
    sizes = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    length = int(sizes.max(initial=0)) if length is None else length
    if len(rows) and sizes.max() > length:
        raise ValueError(f"a row of {int(sizes.max())} values does not fit the padded length {length}")
    mask = np.arange(length) < sizes[:, None]
    out = np.full((len(rows), length), value, dtype=np.int64)
    out[mask] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(sizes.sum()))
    return out, mask


def pad(rows: Sequence[Sequence[int]], value: int, length: int | None = None) -> Tensor:
    """Right-pad integer rows into a ``[len(rows), length]`` long tensor."""
    import torch

    return torch.from_numpy(pad_array(rows, value, length))


def model_inputs(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, Tensor]:
    """Token id rows (special tokens included) -> right-padded ``input_ids`` and ``attention_mask`` (tensors)."""
    import torch

    return {k: torch.from_numpy(v) for k, v in input_arrays(rows, pad_id).items()}


def sparse_cells(rows: list[list[tuple[int, int, int]]], heads: int, n: int) -> Tensor:
    """Per-row ``(head, i, j)`` content positions -> ``[b, heads, P]`` cells ``(i+1) * n + (j+1)``, 0-padded."""
    import torch

    per_head = [[set() for _ in range(heads)] for _ in rows]
    for b, cells in enumerate(rows):
        for k, i, j in cells:
            per_head[b][k].add((i + 1) * n + j + 1)
    width = max([1] + [len(c) for row in per_head for c in row])
    out = torch.zeros(len(rows), heads, width, dtype=torch.long)
    for b, row in enumerate(per_head):
        for k, cells in enumerate(row):
            out[b, k, : len(cells)] = torch.tensor(sorted(cells), dtype=torch.long)
    return out


def sorted_batches(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None) -> Iterator[list[int]]:
    """Indices grouped into batches of similar length (longest first), for prediction: ``batch_size`` rows each, or,
    with ``max_tokens``, as many rows as keep ``rows x longest length <= max_tokens`` (a row longer than
    ``max_tokens`` alone in its batch); ``lengths`` are the rows' padded-to lengths (special tokens included)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if max_tokens is None:
        yield from (order[i : i + batch_size] for i in range(0, len(order), batch_size))
        return
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive number of tokens, got {max_tokens}")
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) + 1) * lengths[batch[0]] > max_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def device_of(model: nn.Module) -> torch.device:
    """Where ``model``'s parameters are (the CPU for a model without any)."""
    import torch

    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


@contextlib.contextmanager
def seeded(seed: int):
    """Run the block with torch's generator seeded with ``seed``, then give the caller's generator state back."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# ------------------------------------------------------------------------------------------------- encoders
# Characters kept when a large multilingual vocabulary is pruned for Chinese char-mode tasks.
CJK_CHARSET = "".join(map(chr, [*range(0x4E00, 0xA000), *range(0x3400, 0x4DC0), *range(0x21, 0x7F),
                                 *range(0x3000, 0x3040), *range(0xFF01, 0xFF5F), *range(0x2010, 0x2060)]))


def prepare_encoder(name: str, *, texts: list[str], mode: str = "char", keep_tokens: str = "auto",
                    layers: int | None = None, seed: int = 0, unshare: bool = False):
    """Load an encoder for training: optionally keep only its first ``layers`` layers and prune its vocabulary.

    ``keep_tokens`` (bert4keras's keep_tokens): ``"all"`` keeps the vocabulary as it is; ``"cjk"`` keeps the
    tokens of CJK ideographs, ASCII, CJK and full-width punctuation and of every character of ``texts``;
    ``"data"`` only those of ``texts``; ``"auto"`` is ``"cjk"`` for vocabularies over 50,000 tokens (e5-small's
    250k rows shrink to about 20k, which makes every optimiser step cheaper) and ``"all"`` otherwise. In sub-word
    mode (or a multi-task model with a sub-word member) only ``"data"`` prunes: it keeps the pieces that
    ``texts`` tokenise into, and their characters. Those texts then tokenise exactly as before (a Unigram or
    WordPiece tokenizer still finds its pieces), but unseen text may split into other pieces or ``<unk>``, so
    prune with ``"data"`` only for a closed set of texts (benchmarks, a fixed corpus); the other values keep the
    whole sub-word vocabulary. ``seed`` initialises the ``tiny`` encoder; ``unshare`` drops an ALBERT's layer
    sharing (spec §9.1).
    """
    from zhie import encoders

    model, tokenizer = encoders.load(name, texts=texts, seed=seed, unshare=unshare)
    if layers is not None:
        encoders.truncate_layers(model, layers)
    keep = kept_token_ids(tokenizer, keep_tokens, {c for text in texts for c in text})
    if keep is not None and mode != "char":
        keep = keep | {i for ids in tokenizer(texts, add_special_tokens=False)["input_ids"] for i in ids} \
            if keep_tokens == "data" else None
    if keep is not None:
        model, tokenizer = encoders.prune_vocab(model, tokenizer, keep)
    return model, tokenizer


def kept_token_ids(tokenizer, keep_tokens: str, chars: set[str]) -> set[int] | None:
    """The token ids ``keep_tokens`` keeps for char-mode text made of ``chars`` (see :func:`prepare_encoder`), or
    None when it keeps the whole vocabulary; :func:`zhie.encoders.prune_vocab` adds the special tokens."""
    if keep_tokens == "auto":
        keep_tokens = "cjk" if len(tokenizer) > 50_000 else "all"
    if keep_tokens not in ("all", "cjk", "data"):
        raise ValueError(f"unknown keep_tokens {keep_tokens!r}; use auto, all, cjk or data")
    if keep_tokens == "all":
        return None
    tt = TextTokenizer(tokenizer, "char")
    return {tt.char_id(c) for c in chars | (set(CJK_CHARSET) if keep_tokens == "cjk" else set())} - {None}


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
    pipeline_class: ClassVar[type]         # what zhie.load returns (set below for the base)
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
    # ``zhie distill --teacher`` (:mod:`zhie.training.students`): the student's items are this task's training items,
    # of the labelled examples and of unlabelled texts that the teacher labels; each item carries the teacher's soft
    # targets, computed once (``soft_targets``), added to its batch (``soft_batch``) and scored (``soft_loss``).
    hard_labels: ClassVar[bool] = True  # False: the student learns from the teacher's outputs only (no hard loss)

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


def only_auto_format(format: str, what: str) -> None:
    """Readers of one format: ``--format`` other than ``auto`` is an error that says what the data must be."""
    if format != "auto":
        raise ValueError(f"--format {format} does not apply to {what}; leave it out")


# ------------------------------------------------------------------------------------------------- commands over texts

@dataclass(frozen=True)
class TextCommand:
    """A task's own command over texts (:func:`add_text_command`): the CLI streams its input through the pipeline's
    ``stream`` and writes one output per input, as ``zhie predict`` does (JSON lines ``{"text", output_key}``), or:

    ``plain``: the line of one prediction (``zhie segment``'s words) when the command writes plain lines (it then
    has ``--json`` for the JSON lines); ``vectors``: the predictions are vectors, which ``--output FILE.npy`` writes as
    one array; ``options``: the keywords of the pipeline's ``stream`` that the command's own flags give (``zhie
    embed --no-normalize``)."""

    task: type[Task]
    plain: Callable[[Any], str] | None = None
    vectors: bool = False
    options: Callable[[argparse.Namespace], dict] | None = None


def add_text_command(commands: argparse._SubParsersAction, task: type[Task], name: str, help: str, *,
                     plain: Callable[[Any], str] | None = None, vectors: bool = False,
                     options: Callable[[argparse.Namespace], dict] | None = None, batch_size: int = 32,
                     **flags) -> argparse.ArgumentParser:
    """A task's own command over a model and texts (``zhie segment``, ``zhie embed``; :class:`TextCommand`): the CLI
    loads the model, checks that it is a ``task`` model, streams the input and writes each prediction as it comes
    (:mod:`zhie.deploy.stream`). ``flags``: keywords of :func:`add_prediction_flags` (``output_help``)."""
    p = commands.add_parser(name, help=help)
    p.add_argument("model", help="model directory (or a run directory with best/)")
    add_prediction_flags(p, batch_size, **flags)
    if plain is not None:
        p.add_argument("--json", action="store_true",
                       help=f'JSON lines {{"text", "{task.output_key}"}} as zhie predict writes them, not plain lines')
    p.set_defaults(task_command=TextCommand(task, plain, vectors, options))
    return p


OUTPUT_HELP = ("write the lines to FILE instead of stdout: to FILE.partial as they come, renamed to FILE at the end; "
               "after a failure FILE.partial keeps the lines done")


def add_prediction_flags(p: argparse.ArgumentParser, batch_size: int = 32, output_help: str = OUTPUT_HELP) -> None:
    """The input, output and batching flags that ``zhie predict``, ``segment`` and ``embed`` share."""
    p.add_argument("texts", nargs="*", help="texts to process (or use --input)")
    p.add_argument("--input", nargs="+", action="extend", default=[], metavar="FILE",
                   help="one text per line, or JSON lines with a 'text' field (see --input-format); - reads stdin; "
                        "read as a stream; one output per input line, in order (a blank line: an empty result)")
    p.add_argument("--input-format", default="auto", choices=TEXT_FORMATS,
                   help="text: every line is a text; jsonl: every line a JSON object with a string 'text'; auto "
                        "(default): jsonl for a file named .jsonl or .json or whose first non-blank line starts with "
                        "'{', else text (decided once per file, never per line)")
    p.add_argument("--output", default=None, metavar="FILE", help=output_help)
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="go on past lines that are not UTF-8 or (JSON lines) not a JSON object with a string 'text': "
                        "each still has its output line, {\"file\", \"line\", \"error\"} in JSON lines (an empty "
                        "line in plain output, a row of zeros in an .npy file); their count goes to stderr")
    p.add_argument("--chunk-lines", type=positive_int, default=CHUNK_LINES,
                   help="texts read, sorted by length and written per chunk (memory is bounded by this)")
    p.add_argument("--batch-size", type=positive_int, default=batch_size, help="texts (windows) per model batch")
    add_batching_flags(p)


def add_batching_flags(p: argparse.ArgumentParser) -> None:
    """``--max-tokens``, ``--precision`` and ``--device`` (also ``zhie eval``'s)."""
    p.add_argument("--max-tokens", type=positive_int, default=None, metavar="N",
                   help="batches of at most N padded tokens over length-sorted texts instead of --batch-size texts")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="the encoder's precision (bf16/fp16 under autocast; decoding stays fp32)")
    p.add_argument("--device", type=device_name, default=None, metavar="DEVICE",
                   help="cpu, cuda, cuda:N, or auto (default: the GPU if there is one, else the CPU); an export runs "
                        "on the CPU")


def device_name(value: str) -> str | None:
    """``--device``: ``cpu``, ``cuda`` or ``cuda:N`` as given; ``auto`` is None (the GPU if there is one)."""
    if value == "auto":
        return None
    if value in ("cpu", "cuda") or re.fullmatch(r"cuda:\d+", value):
        return value
    raise argparse.ArgumentTypeError(f"unknown device {value!r}; use cpu, cuda, cuda:N or auto")


def check_max_length(max_length: int) -> int:
    """A task's ``--max-length`` (``max_length`` in a multi-task config), checked: [CLS], [SEP] and at least one
    token of text."""
    if max_length < 3:
        raise ValueError(f"--max-length {max_length}: a window (a sentence) holds [CLS], [SEP] and at least one token "
                         "of text; give 3 or more")
    return max_length


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return number


def rename_weights(weights: dict[str, Tensor], renames: dict[str, str | None]) -> dict[str, Tensor]:
    """Weights with each name's prefix in ``renames`` replaced (``None``: the weight is dropped)."""
    out = {}
    for name, value in weights.items():
        prefix = next((p for p in renames if name.startswith(p)), None)
        if prefix is None:
            out[name] = value
        elif renames[prefix] is not None:
            out[renames[prefix] + name[len(prefix):]] = value
    return out


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


class Pipeline:
    """A trained model and its task: ``zhie.load(DIR).predict(texts)``; on the GPU if there is one.

    ``precision`` (``fp32``, ``bf16``, ``fp16``): the encoder's precision in ``predict`` and ``evaluate``
    (:mod:`zhie.precision`; decoding stays fp32). ``model``: a :class:`zhie.model.Model`, or an export's
    :class:`zhie.deploy.runtime.OnnxModel` (CPU, fp32).
    """

    def __init__(self, task: Task, model: Model, device: str | None = None, precision: str = "fp32") -> None:
        self.task, self.model = task, model
        if device is None:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = str(device)
        try:
            self.model.to(self.device)
        except (RuntimeError, AssertionError) as err:  # torch: a device name it does not know, or no CUDA here
            raise ValueError(f"cannot put the model on the device {self.device!r} ({err}); use cpu, or cuda on a "
                             "machine with a GPU") from None
        self.precision = precision
        self.autocast()  # an unknown precision, or one the device lacks, fails here

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context the model runs in: autocast to ``precision`` on the model's device (nothing for fp32)."""
        return autocast(self.precision, self.device)

    def predict(self, texts: list[str] | str, batch_size: int = 32, max_tokens: int | None = None) -> list:
        """One prediction per text, in input order (a single string counts as a list of one); the type of a
        prediction is the task's (see its ``predict``). ``max_tokens``: batches of at most that many padded tokens
        over length-sorted texts instead of ``batch_size`` texts."""
        with self.autocast():
            return self.task.predict(self.model, [texts] if isinstance(texts, str) else list(texts), batch_size,
                                     max_tokens=max_tokens)

    def stream(self, texts: Iterable[str], batch_size: int = 32, max_tokens: int | None = None,
               chunk_size: int = CHUNK_LINES) -> Iterator:
        """One prediction per text of ``texts`` (any iterable, read lazily: a file, a generator), in their order, as
        ``predict`` gives it, with memory bounded by ``chunk_size``: that many texts are read and predicted at a time
        (:func:`stream_predictions`). A blank text (empty, or only whitespace) gets the empty prediction: no entities,
        words or triples; a sentence encoder's vector of zeros."""
        return stream_predictions(lambda chunk: self.predict(chunk, batch_size, max_tokens), texts, chunk_size)

    def evaluate(self, examples: list, batch_size: int = 32, max_tokens: int | None = None) -> dict:
        with self.autocast():
            return self.task.evaluate(self.model, examples, batch_size, max_tokens=max_tokens)

    def member(self, name: str) -> Pipeline:
        """The pipeline of the member task ``name`` of a multi-task model (``zhie eval --task``); a single-task model
        is its own only member, under its task's name."""
        if name not in (self.task.name, *self.task.aliases):
            raise ValueError(f"this is a single-task {self.task.name} model; it has no member task {name!r}")
        return self


Task.pipeline_class = Pipeline


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last one shorter), read lazily."""
    if size < 1:
        raise ValueError(f"a chunk holds at least one item, got a size of {size}")
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def stream_predictions(predict: Callable[[list[str]], Sequence], texts: Iterable[str], chunk_size: int) -> Iterator:
    """The streaming of :meth:`Pipeline.stream` (and of a pipeline's own ``stream`` with other options): ``predict``
    on each chunk of ``chunk_size`` texts (a list of texts -> one prediction per text, in order), every blank text
    given as "" (whose prediction is empty), then the chunk's predictions one by one; the next chunk is read only when
    they have been taken."""
    for chunk in chunks(texts, chunk_size):
        for i, text in enumerate(chunk):
            if not isinstance(text, str):
                raise TypeError(f"stream() predicts texts (str); got a {type(text).__name__} ({text!r:.40})")
            if not text.strip():
                chunk[i] = ""
        yield from predict(chunk)


def load_pipeline(path: str | os.PathLike, device: str | None = None, precision: str = "fp32") -> Pipeline:
    """The pipeline of the model directory ``path`` (written by ``zhie train``, or its run directory), its task found
    in the registry by ``zhie.json``: torch models only (:func:`zhie.load`, :func:`zhie.deploy.pipeline.load`, also
    load exports). For what trains from a saved model (a pre-training segmenter, distillation's teachers)."""
    from zhie import tasks

    cls = tasks.get(str(read_meta(path).get("task")))
    task, model = cls.load(path)
    return cls.pipeline_class(task, model, device, precision)


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

        ``timings`` (optional) accumulates ``model_s`` and ``decode_s``.
        """
        size, overlap = self.window
        encodings = [self.text_tokenizer(t) for t in texts]
        cuts = [windows(len(enc), size, overlap) if len(enc) else [] for enc in encodings]
        jobs = [(i, w) for i, wins in enumerate(cuts) for w in range(len(wins))]
        tt = self.text_tokenizer
        specials = len(tt.model_input([]))
        lengths = [cuts[i][w][1] - cuts[i][w][0] + specials for i, w in jobs]
        for batch_jobs in sorted_batches(lengths, batch_size, max_tokens):
            rows = [tt.model_input(encodings[i].ids[slice(*cuts[i][w])]) for i, w in (jobs[j] for j in batch_jobs)]
            batch = input_arrays(rows, tt.pad_id)
            mask = batch["attention_mask"]
            t0 = time.perf_counter()
            outputs = model.arrays(batch["input_ids"], mask)  # numpy on the host: the device is synchronised
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
            a = cuts[w][0]
            for hit in row:
                start, end = hit.extent
                if reporting_window(cuts, a + start, a + end, cut_at_right_edge=self.cut_at_right_edge) == w:
                    yield i, encoding, a, hit
