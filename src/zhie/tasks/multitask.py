"""Several tasks on one shared encoder: ``zhie train multitask --tasks FILE [--weighting SCHEME]`` (spec §5).

The config file (TOML; YAML too when PyYAML is installed; :mod:`zhie.multitask.config`) lists the member tasks (each
its name, task, data files, batch size, sampling weight and options), the weighting scheme (``[weighting]``) and how
steps sample the members (``[sampling]``).

Training, ``mode = "all"`` (the default, and the only mode of the gradient schemes): every step sees every task. The
loop's items are steps (``batch_size`` 1 for the loop); each step draws one batch from every member at random
(``batch_size`` items without replacement inside the batch, from torch's generator, whose state the checkpoint keeps: a
resumed run draws the same batches, and each process draws its own). An epoch is ``S = max_i ⌈n_i / b_i⌉`` steps (one
pass over the largest member in expectation).

Sampled steps (``proportional``, ``temperature``; the per-task loss schemes only: equal, prior, real-time, uncertainty):
each step draws one member with probability ``p_i ∝ s_i^(1/T)`` and one batch of it, where ``s_i`` is the member's
``sampling_weight`` or else its number of training items ``n_i``, and ``T = 1`` for ``proportional``; the step's loss
is ``α_i L_i`` with the scheme's weight of that member alone (``equal``: ``α_i = 1``; so the expected update is
``Σ_i p_i α_i ∇L_i``). The member is a function of the run's seed and the step's number alone: every process of a run
draws the same member (and its own batch of it), and the checkpoint keeps the number. An epoch is ``Σ_i ⌈n_i / b_i⌉``
steps. Schemes that need every task's loss or gradient at once (initial, generalised-mean, grad-normalise, mgda,
main-auxiliary) are refused there.

The objective runs the shared encoder once per member batch with only that member's head, takes each member's own
loss ``L_i`` and forms ``Σ_i sg(α_i) L_i`` with the scheme's weights (:mod:`zhie.multitask.weighting`); schemes that
need the tasks' gradients get ``g_i = ∇L_i`` over the encoder's parameters from one ``torch.autograd.grad`` per task.
Backward passes per step: ``n + 1`` for ``grad-normalise``, ``mgda`` and ``main-auxiliary`` (n for the ``g_i``, one
for the combined loss), 1 for the others. Under several processes (torchrun) each process computes the weights from
its own batches' losses and gradients (the ``g_i`` are not all-reduced: ``autograd.grad`` bypasses DDP's hooks); the
combined loss's gradients are then averaged as usual, so a step applies the mean of the processes' weighted
gradients. Every evaluation's record in ``metrics.jsonl`` has ``per_batch`` (each batch's ``losses`` and the
``weights`` applied, by member — the sampled member only, on sampled steps; past 100 batches since the last
evaluation, those of every ``k``-th batch, ``k`` a power of 2, and of the last one), ``task_losses`` and
``task_weights`` (their means over all the batches that had the member) and ``task_batches`` (how many had it); every
step record has ``task_losses`` and ``task_weights`` since the last step record (:mod:`zhie.multitask.objective`).

``gradients = "encoder-output"`` in ``[weighting]`` (gradient schemes): ``g_i`` is taken w.r.t. the encoder's output
instead of its parameters — MGDA-UB's cheaper upper bound (spec §5.2; the n extra backward passes stop at the encoder's
output, so they cost little). Su shows that the paper's proof that this bound still reaches Pareto-stationary points is
wrong, and the bound is only meaningful when one batch carries every task's labels. zhie's members read separate
datasets, so each ``g_i`` lives on its own batch's output, the ``g_i`` are orthogonal, and MGDA's weights reduce to
``α_i ∝ 1/‖∇_{H_i} L_i‖²`` (main-auxiliary's λ to 0): documented and tested as such; keep the default
``"parameters"`` for MGDA proper.

Evaluation after each epoch scores every member on its dev set (keys ``NAME/metric``); the best model maximises
``score``: the mean of the members' main metrics (NER/CWS/RE ``f1``, similarity ``spearman``), or, with
``main-auxiliary``, the main task's metric.

The saved model is one directory: the encoder once, every head (``heads.NAME.…``), and ``zhie.json`` with each
member's task and configuration. ``zhie.load(DIR).predict(texts)`` runs the encoder once per batch of windows for every
span member (ner, cws, re: they share the windows, of the smallest member ``max_length`` and the largest overlap) and
returns per text ``{member name: its prediction}``; sentence-embedding members give vectors through
``pipeline.encode(texts, member=NAME)``; ``pipeline.member(NAME)`` is one member's own pipeline.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from zhie import tasks
from zhie.core.text import TextTokenizer
from zhie.multitask import config as mtconfig
from zhie.multitask.config import (  # noqa: F401  (those unused here lived here: re-exported)
    GRADIENT_SPACES,
    MEMBER_KEYS,
    NAME,
    PATH_OPTIONS,
    SAMPLED_SCHEMES,
    SAMPLING,
    SAMPLING_KEYS,
    SCHEMES,
    WEIGHTING_KEYS,
    ConfigError,
    MemberSpec,
    MultitaskFile,
)
from zhie.tasks import register
from zhie.tasks.base import Task, WindowedTask
from zhie.tasks.pipeline import Pipeline

if TYPE_CHECKING:
    from torch import Tensor, nn

    from zhie.model import Model


@dataclass
class MemberExamples:
    """A member's examples (the multi-task task's "examples" are one of these per member)."""

    name: str
    task: str
    examples: list


def read_file(path: str | Path) -> MultitaskFile:
    """The multi-task config file ``path``, read and checked once per run (:func:`zhie.multitask.config.read`)."""
    return mtconfig.read(path, tasks.get)


def read_config(path: str | Path) -> tuple[list[MemberSpec], dict]:
    """The members and the ``[weighting]`` table (with ``[sampling]``'s keys added as ``sampling_mode`` and
    ``sampling_temperature``) of a multi-task config file, as :func:`read_file` reads them (what this function gave
    before :class:`~zhie.multitask.config.MultitaskFile`)."""
    file = read_file(path)
    given = {**asdict(file.weighting), **{f"sampling_{k}": v for k, v in asdict(file.sampling).items()}}
    return list(file.members), {k: v for k, v in given.items() if v is not None}


@dataclass
class MultitaskConfig:
    members: list[dict]           # per member: name, task, config (the member task's), batch_size, train, dev
    weighting: str = "real-time"
    main: str | None = None       # main-auxiliary: the main task
    gamma: float = 0.5            # generalised-mean
    initial_batches: int = 1      # initial: batches whose mean loss is L_i^init
    gradients: str = "parameters"  # gradient schemes: over the encoder's parameters, or its output (MGDA-UB)
    sampling: str = "all"         # all: every member each step; proportional / temperature: one sampled member
    temperature: float = 1.0      # temperature sampling: p_i ∝ s_i^(1/T)
    mode: str = "char"            # "char" when every member is (the encoder's vocabulary may then be pruned)
    window_mode: str = "char"     # the span members' (ner, cws, re) common tokenisation
    max_length: int = 256         # prediction windows of the span members: the smallest member max_length ...
    overlap: int = 32             # ... and the largest overlap

    def __post_init__(self):
        if self.weighting not in SCHEMES:
            raise ValueError(f"unknown weighting scheme {self.weighting!r}; use one of {', '.join(SCHEMES)}")
        if self.weighting == "main-auxiliary" and self.main not in [m["name"] for m in self.members]:
            raise ValueError(f"the main-auxiliary scheme needs `main = NAME` (one of the tasks) in [weighting], "
                             f"got {self.main!r}")
        if self.sampling not in SAMPLING:
            raise ValueError(f"unknown sampling mode {self.sampling!r}; use one of {', '.join(SAMPLING)}")
        if self.sampling != "all" and self.weighting not in SAMPLED_SCHEMES:
            raise ValueError(f"the {self.weighting} scheme needs every task's loss (or gradient) at each step, so it "
                             f"runs with sampling mode 'all' only; sampled steps work with "
                             f"{', '.join(SAMPLED_SCHEMES)}")
        if self.gradients not in GRADIENT_SPACES:
            raise ValueError(f"unknown gradients {self.gradients!r}; use one of {', '.join(GRADIENT_SPACES)}")

    def probabilities(self, items: list[int]) -> list[float]:
        """Sampled steps: each member's ``p_i ∝ s_i^(1/T)`` (``s_i``: its sampling weight, else its ``items``)."""
        t = 1.0 if self.sampling == "proportional" else self.temperature
        scores = [(m.get("sampling_weight") or n) ** (1.0 / t) for m, n in zip(self.members, items)]
        return [s / sum(scores) for s in scores]


class MultiTaskPipeline(Pipeline):
    """A multi-task model: ``predict(texts)`` gives per text ``{member: prediction}`` for the span members (one encoder
    pass per batch), ``encode(texts, member)`` a sentence-embedding member's vectors, ``member(NAME)`` one member's
    own pipeline (its ``predict``, ``evaluate``, ``segment``, …)."""

    def member(self, name: str) -> Pipeline:
        task = self.task.member(name)
        return type(task).pipeline_class(task, self.task.view(self.model, [name]), self.device, self.precision)

    def encode(self, texts: list[str] | str, member: str | None = None, batch_size: int = 64, normalize: bool = True):
        """Sentence vectors of the sentence-embedding member ``member`` (default: the only one)."""
        if member is None:
            names = [m.head_name for m in self.task.members if hasattr(m.pipeline_class, "encode")]
            if len(names) != 1:
                raise ValueError(f"name the member to encode with (sentence-embedding members: {names or 'none'})")
            member = names[0]
        return self.member(member).encode(texts, batch_size=batch_size, normalize=normalize)


@register
class MultiTask(WindowedTask):
    """Several tasks on one encoder (see the module's docstring): ``predict`` returns, per text, a dict from member name
    to that member's prediction (span members only)."""

    name = "multitask"
    help = "several tasks on one shared encoder (--tasks FILE; the loss weighting schemes of spec 5)"
    config_class = MultitaskConfig
    output_key = "tasks"
    metric = "score"
    group_by_length = False
    data_flags = False
    pipeline_class = MultiTaskPipeline

    def __init__(self, config: MultitaskConfig, tokenizer) -> None:
        super().__init__(config, tokenizer)
        self.text_tokenizer = TextTokenizer(tokenizer, config.window_mode)
        self.members = []
        for m in config.members:
            cls = tasks.get(m["task"])
            member = cls(cls.config_class(**m["config"]), tokenizer)
            member.head_name = m["name"]
            self.members.append(member)
        self.batch_sizes = [m["batch_size"] for m in config.members]
        self.member_items: list[list] = []
        self.seed = 0   # sampled steps: the run's seed, set by loop_config ...
        self.draws = 0  # ... and the batches drawn so far (kept in the checkpoint by MultiTaskLoss)

    @property
    def spans(self) -> list[WindowedTask]:
        """The members decoded from the shared windows (ner, cws, re)."""
        return [m for m in self.members if isinstance(m, WindowedTask)]

    def member(self, name: str):
        for m in self.members:
            if m.head_name == name:
                return m
        raise ValueError(f"no member task {name!r}; this model has {', '.join(m.head_name for m in self.members)}")

    @staticmethod
    def view(model: Model, names: list[str]) -> Model:
        """A model sharing ``model``'s encoder (or graph) and the heads ``names`` (no copy)."""
        return model.view(names)

    # ---------------------------------------------------------------------------------------- data and config
    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--tasks", dest="tasks_file", required=True, metavar="FILE",
                            help="the members and the weighting scheme (TOML; YAML with PyYAML); formerly --config")
        parser.add_argument("--weighting", default=None, choices=SCHEMES,
                            help="loss weighting scheme (default: the config's, else real-time)")

    @classmethod
    def read(cls, path, format: str = "auto") -> list:
        raise ValueError("a multi-task model is scored one member at a time: zhie eval DIR --task NAME --data FILE")

    @classmethod
    def read_splits(cls, train_path, dev_path, format: str = "auto", *, tasks_file, **options):
        if train_path is not None or dev_path is not None:
            raise ValueError("a multi-task run reads its data from the files its --tasks names, not --train/--dev")
        splits = ([], [])
        for s in read_file(tasks_file).members:
            member_cls = tasks.get(s.task)
            for split, file in zip(splits, (s.train, s.dev)):
                split.append(MemberExamples(s.name, s.task, member_cls.read(file, s.format)))
        return splits

    @classmethod
    def data_files(cls, train_path, dev_path, *, tasks_file, **options) -> dict[str, str]:
        """The config file and each member's ``NAME/train`` and ``NAME/dev`` files."""
        return {"config": str(tasks_file), **{f"{s.name}/{role}": path for s in read_file(tasks_file).members
                                               for role, path in (("train", s.train), ("dev", s.dev))}}

    @staticmethod
    def texts(examples: list[MemberExamples]) -> list[str]:
        return [t for d in examples for t in tasks.get(d.task).texts(d.examples)]

    @classmethod
    def vocabulary_texts(cls, examples: list[MemberExamples], config: MultitaskConfig) -> list[str]:
        members = {m["name"]: m for m in config.members}
        return [t for d in examples for member_cls in [tasks.get(d.task)]
                for t in member_cls.vocabulary_texts(d.examples, member_cls.config_class(**members[d.name]["config"]))]

    @classmethod
    def configure(cls, examples: list[MemberExamples], *, encoder: str, tasks_file,
                  weighting: str | None = None) -> MultitaskConfig:
        file = read_file(tasks_file)
        members, configs = [], []
        for s, data in zip(file.members, examples):
            member_cls = tasks.get(s.task)
            try:
                c = member_cls.configure(data.examples, encoder=encoder, **s.options)
            except ValueError as err:
                raise ConfigError(f"{tasks_file}: task {s.name!r}: {err}") from None
            configs.append((member_cls, c))
            members.append({"name": s.name, "task": s.task, "config": asdict(c), "batch_size": s.batch_size,
                            "sampling_weight": s.sampling_weight, "train": s.train, "dev": s.dev})
        spans = [c for member_cls, c in configs if issubclass(member_cls, WindowedTask)]
        if len({c.mode for c in spans}) > 1:
            raise ConfigError(f"{tasks_file}: the span tasks (ner, cws, re) share one encoder pass and must share "
                              f"one mode; they have {', '.join(sorted({c.mode for c in spans}))}")
        w = file.weighting
        given = {"weighting": weighting or w.scheme, "main": w.main, "gamma": w.gamma,
                 "initial_batches": w.initial_batches, "gradients": w.gradients, "sampling": file.sampling.mode,
                 "temperature": file.sampling.temperature}  # what the file leaves out: MultitaskConfig's defaults
        try:
            return MultitaskConfig(
                members, **{k: float(v) if k in ("gamma", "temperature") else v for k, v in given.items()
                            if v is not None},
                mode="char" if all(c.mode == "char" for _, c in configs) else "subword",
                window_mode=spans[0].mode if spans else "char",
                max_length=min((c.max_length for c in spans), default=256),
                overlap=max((c.overlap for c in spans), default=32))
        except ValueError as err:
            raise ConfigError(f"{tasks_file}: {err}") from None

    # ---------------------------------------------------------------------------------------- training
    def loop_config(self, config):
        """Members without a ``batch_size`` take ``config.batch_size``; the loop draws one step item at a time. Sampled
        steps leave the other members' heads without a gradient: DDP must look for such parameters after each forward
        pass and leave them alone (``find_unused_parameters``), as one process does (their gradients stay unset, so
        AdamW neither decays nor moves them). A zero-weighted term of every absent head would keep DDP from failing
        too, but would give those heads zero gradients, which AdamW still applies (momentum, weight decay)."""
        self.batch_sizes = [b or config.batch_size for b in self.batch_sizes]
        self.seed = config.seed
        return replace(config, batch_size=1, find_unused_parameters=self.config.sampling != "all")

    def build_heads(self, hidden_size: int) -> dict[str, nn.Module]:
        return {name: head for m in self.members for name, head in m.build_heads(hidden_size).items()}

    def encode(self, examples: list[MemberExamples]) -> list[int]:
        """Each member's training items (kept here); returns the epoch's steps ``0 .. S-1``."""
        self.member_items = [m.encode(d.examples) for m, d in zip(self.members, examples)]
        self.stats = {}
        for m, items in zip(self.members, self.member_items):
            if not items:
                raise ValueError(f"task {m.head_name!r}: no training items")
            self.stats[m.head_name] = {"items": len(items), **m.stats}
        batches = [math.ceil(len(items) / b) for items, b in zip(self.member_items, self.batch_sizes)]
        return list(range(max(batches) if self.config.sampling == "all" else sum(batches)))

    def sampled_member(self, draw: int) -> int:
        """The member of sampled step number ``draw`` (0, 1, …), with the probabilities of
        :meth:`MultitaskConfig.probabilities`; a function of the run's seed and ``draw`` alone, so every process of a
        run draws the same member (a CoSENT member gathers its pairs from every process; DDP reduces the same
        heads)."""
        p = self.config.probabilities([len(items) for items in self.member_items])
        return int(np.random.default_rng([self.seed, draw]).choice(len(p), p=p))

    def collate(self, steps: list[int]) -> dict[str, Tensor]:
        """One random batch of every member (of the member :meth:`sampled_member` draws, on sampled steps), its keys
        prefixed ``NAME/``; each process draws its own batch of it."""
        import torch

        chosen_members = range(len(self.members))
        if self.config.sampling != "all":
            chosen_members = [self.sampled_member(self.draws)]
        self.draws += 1
        batch = {}
        for i in chosen_members:
            m, items, size = self.members[i], self.member_items[i], self.batch_sizes[i]
            chosen = torch.randperm(len(items))[:size].tolist()
            batch.update({f"{m.head_name}/{k}": v for k, v in m.collate([items[j] for j in chosen]).items()})
        return batch

    def objective(self, hidden_size: int) -> nn.Module:
        from zhie.multitask.objective import MultiTaskLoss

        return MultiTaskLoss(self, hidden_size)

    # ---------------------------------------------------------------------------------------- prediction, metrics
    def decode(self, model: Model, outputs: dict, attention_mask: Tensor) -> list[dict[str, list]]:
        decoded = {m.head_name: m.decode(model, outputs, attention_mask) for m in self.spans}
        return [{name: rows[b] for name, rows in decoded.items()} for b in range(attention_mask.shape[0])]

    def predict(self, model: Model, texts: list[str], batch_size: int = 32, timings: dict | None = None,
                max_tokens: int | None = None) -> list[dict[str, list]]:
        """Per text ``{member: prediction}`` of every span member, from one encoder pass per batch of windows."""
        spans = self.spans
        if not spans:
            return [{} for _ in texts]
        rows = list(self.window_hits(self.view(model, [m.head_name for m in spans]), texts, batch_size, timings,
                                     max_tokens))
        found = {m.head_name: m.from_hits(texts, m.reported((i, enc, cuts, w, row[m.head_name])
                                                            for i, enc, cuts, w, row in rows)) for m in spans}
        return [{name: predictions[i] for name, predictions in found.items()} for i in range(len(texts))]

    def to_json(self, prediction: dict) -> dict:
        return {name: self.member(name).to_json(p) for name, p in prediction.items()}

    def evaluate(self, model: Model, examples: list[MemberExamples], batch_size: int = 32,
                 max_tokens: int | None = None) -> dict:
        return {d.name: self.member(d.name).evaluate(self.view(model, [d.name]), d.examples, batch_size, max_tokens)
                for d in examples}

    def summary(self, metrics: dict) -> dict[str, float]:
        """Every member's numbers as ``NAME/key`` and ``score``: the mean of the members' main metrics, or the main
        task's under main-auxiliary."""
        out, main = {}, {}
        for name, m in metrics.items():
            member = self.member(name)
            numbers = member.summary(m)
            out.update({f"{name}/{k}": v for k, v in numbers.items()})
            main[name] = float(numbers[member.metric])
        c = self.config
        out["score"] = main[c.main] if c.weighting == "main-auxiliary" else sum(main.values()) / len(main)
        return out

    def describe(self) -> dict:
        """The card facts of every member (``members``), and of the windows the span members share."""
        members = [{"name": m.head_name, **m.describe()} for m in self.members]
        about = super().describe() if self.spans else Task.describe(self)
        return {**about, "summary": f"{len(members)} tasks on one shared encoder ({self.config.weighting} loss "
                                    "weighting)",
                "pipeline_tag": members[0]["pipeline_tag"] if not self.spans else "token-classification",
                "metrics": list(dict.fromkeys(x for m in members for x in m["metrics"])), "members": members}

    # ---------------------------------------------------------------------------------------- saving, loading
    def save_files(self, directory: Path, prefix: str = "") -> None:
        for m in self.members:
            m.save_files(directory, f"{prefix}{m.head_name}.")

    def load_files(self, directory: Path, prefix: str = "") -> None:
        for m in self.members:
            m.load_files(directory, f"{prefix}{m.head_name}.")
