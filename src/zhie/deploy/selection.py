"""Choosing what to label: ``zhie select MODEL --pool FILE --budget N`` writes the N texts of a pool whose labels would
help a model most (active learning), with the model's own predictions as pre-annotations.

**Strategies** (``--strategy``):

* ``uncertainty``: the N texts the model is least sure of (:func:`uncertainties`);
* ``diversity``: N texts unlike each other, whatever the model thinks of them (no model scores): each pick is the text
  least similar to those picked before (farthest-first), ties broken in a random order of ``--seed``;
* ``uncertainty-diversity`` (the default): both, by maximal marginal relevance: each pick maximises
  ``(1 - w) * u_rank - w * s``, ``w`` the ``--diversity`` weight, ``u_rank`` the text's uncertainty as its rank in
  the pool scaled to 0..1 (so that ``w`` means the same for a model that is sure of everything and one that is sure
  of nothing), ``s`` its largest similarity to a text already picked;
* ``random``: N texts drawn with ``--seed``, the baseline the others are measured against.

Similarity (:class:`NgramIndex`) is the Jaccard similarity of the sets of character bigrams of two texts (a text of
one character: that character). Under ``diversity`` and ``uncertainty-diversity`` no text is picked whose similarity
to one already picked is above ``--max-similarity`` while another is left; when none is, the rest are picked by the
same rule without the limit, and a warning says how many. Exact duplicates in the pool are one text. Time and memory:
the bigrams of the whole pool are numbered once (numpy, no Python loop over characters); a pick costs one pass over
the pool and the postings of the picked text's bigrams, so a selection is O(N x pool) and holds the pool's bigram
occurrences twice (as int32 arrays); the model's scores are computed chunk by chunk, keeping one number per text.

**Uncertainty of a text** (:func:`uncertainties`): ``u = 1 - exp(-S / n)``, ``S`` the surprise of the model's own
prediction of the text (``-log P``, in nats, summed over its windows), ``n`` its tokens (summed over the windows). It
is MNLP, the maximum normalised log-probability of Shen et al. (2018, "Deep active learning for named entity
recognition"), as a number from 0 (sure) to 1: ``exp(-S / n)`` is the geometric mean, per token, of the
probability of the prediction, and dividing by the length is what keeps long texts from always coming first, which
they do with the plain probability (least confidence) as each token multiplies in one more factor below 1. One
formula for every head, each with its own probability of its prediction (the task's ``surprise``, beside its
decoder, on the same model outputs, so nothing is decoded twice):

* NER and GPLinker span heads (GP, EGP; relation extraction's three modules: entities, head-head and tail-tail
  links): every cell is the independent Bernoulli ``p = sigmoid(2 * logit)`` that zhie scores spans with (a cell is
  predicted where ``p > 0.5``), so ``S = sum over cells of -log max(p, 1 - p)``
  (:func:`zhie.core.decoding.cell_surprise`). Cells far from the threshold add almost nothing; the sum counts every
  span near it, where a maximum over spans would count one.
* CRF taggers (NER, word segmentation): ``S = log Z - score(Viterbi path)``, ``-log`` of the probability of the
  decoded path among those the BIO/BMES constraints allow (forward algorithm:
  :func:`zhie.core.decoding.crf_surprise`).
* softmax taggers (NER, word segmentation, word-level NER): ``S = -sum_t log max_tag p_t(tag)``, the argmax path's
  ``-log`` probability.
* similarity (sentence embeddings): none. The model's labels are pairs of sentences and its output for one text is a
  vector: there is no decision of the model on the text to be unsure of. ``--strategy uncertainty`` and
  ``uncertainty-diversity`` are refused for it, saying so; ``diversity`` and ``random`` select.
* a multi-task model: the member named by ``--task`` (its own pipeline, on the shared encoder), as ``zhie eval
  --task`` scores one.

The model runs as ``zhie predict`` runs it: :func:`zhie.load` (a torch model directory or an ONNX export, which
answers the same :meth:`~zhie.model.Model.arrays`), the task's own windows and batches
(:meth:`~zhie.tasks.base.WindowedTask.window_hits`); :class:`MeasuredModel` passes each batch's outputs to the task's
``surprise`` on the way.

**The pool** (``--pool FILE``) is read as ``zhie predict --input`` reads a file (:func:`zhie.data.base.iter_texts`):
one text per line, or JSON lines with a string field ``text``, so a CLUENER, CMeIE/DuIE or doccano file is a pool of
its texts; blank lines are left out. A file of sentence pairs (``s1 TAB s2 TAB label``, as similarity training reads)
is refused rather than read as texts with tabs in them, and so is a JSON list (a Label Studio export). An empty pool,
or one with fewer distinct texts than the budget, is an error that gives the numbers.

**Output** (``--output-format``, the converters of ``zhie predict --output-format``, :mod:`zhie.deploy.outputs`),
most uncertain first (the order of the picks for a model without uncertainty), to stdout or written atomically to
``--output FILE``:

* ``text``: the texts, one a line;
* ``doccano``: doccano's JSON lines with the model's predictions as labels (NER and relation models), and ``score``,
  the text's uncertainty (doccano keeps a field it does not know as metadata; zhie's reader ignores it);
* ``label-studio``: a JSON list of Label Studio tasks with the predictions as pre-annotations (NER, word segmentation
  and relation models): ``score`` on the task is the text's uncertainty, and the prediction's ``score`` is the
  model's confidence in its whole prediction, ``1 - uncertainty`` (Label Studio's Data Manager sorts by this
  "prediction score": ascending, the least confident first; it keeps only ``data`` and ``predictions`` of a task).
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zhie.core.files import check_file_target
from zhie.core.options import add_config_flags, add_flags, option, positive_int, values_from_flags
from zhie.data.base import TEXT_FORMATS, DataError, iter_texts, shown
from zhie.deploy import outputs, stream
from zhie.tasks.cli_flags import add_batching_flags
from zhie.tasks.pipeline import CHUNK_LINES

__all__ = ["STRATEGIES", "MeasuredModel", "NgramIndex", "SelectOptions", "Selection", "choose", "read_pool",
           "select", "uncertainties"]

logger = logging.getLogger(__name__)

STRATEGIES = ("uncertainty-diversity", "uncertainty", "diversity", "random")
FORMATS = ("text", "doccano", "label-studio")  # --output-format
HELP = "choose the texts of a pool to label next (uncertainty, diversity), with the model's pre-annotations"


def fraction(value: str) -> float:
    """A flag's number from 0 to 1."""
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {value}")
    return number


@dataclass
class SelectOptions:
    """The options of ``zhie select`` (:func:`select`'s keywords take their defaults from here)."""

    pool: str | None = option(None, "the texts to choose from: one per line, or JSON lines with a string 'text' "
                                    "(a CLUENER or doccano file); exact duplicates count once", required=True,
                              metavar="FILE")
    budget: int | None = option(None, "how many texts to choose (at most the pool's distinct texts)", required=True,
                                type=positive_int, metavar="N")
    output: str | None = option(None, "write them to FILE (atomically) instead of stdout", metavar="FILE")
    output_format: str = option("text", "text: one text a line; doccano: doccano's JSON lines with the model's "
                                        "predictions as labels (NER, relations); label-studio: a JSON list of Label "
                                        "Studio tasks with the predictions as pre-annotations (NER, word segmentation, "
                                        "relations); both with each text's uncertainty as 'score'", choices=FORMATS)
    strategy: str = option("uncertainty-diversity", "uncertainty: the texts the model is least sure of; diversity: "
                                                    "texts unlike each other (no model scores); "
                                                    "uncertainty-diversity: both (maximal marginal relevance, "
                                                    "--diversity); random: a seeded draw, the baseline",
                           choices=STRATEGIES)
    diversity: float = option(0.5, "uncertainty-diversity: the weight of diversity against uncertainty, 0 to 1 (each "
                                   "pick maximises (1 - w) * uncertainty rank - w * similarity to the closest text "
                                   "picked)", type=fraction, metavar="W")
    max_similarity: float = option(0.7, "diversity, uncertainty-diversity: never pick a text whose character-bigram "
                                        "Jaccard similarity to one picked is above this while another is left (1: no "
                                        "limit)", type=fraction, metavar="S")
    seed: int = option(0, "random: the draw; diversity: the order that breaks ties")
    labelled: str | None = option(None, "texts labelled already (as --pool holds them, or a training file with a "
                                        "'text' field): left out of the pool, and the diversity strategies keep the "
                                        "texts chosen unlike them too", metavar="FILE")
    pool_format: str = option("auto", "how --pool holds its texts, as zhie predict's --input-format: text, jsonl, or "
                                      "auto", choices=TEXT_FORMATS)
    task: str | None = option(None, "a multi-task model: the member to choose for (its name)")


# ------------------------------------------------------------------------------------------------- the pool
PAIR_LINE = re.compile(r"[^\t]*\t[^\t]*\t\s*[-+]?(\d+\.?\d*|\.\d+)\s*")  # s1 TAB s2 TAB label (similarity training)
PAIRS_CHECKED = 5  # the first texts that, all pairs, make a pool a pair file


@dataclass
class Pool:
    """The distinct texts of a pool file, in the order they first come, with the count of its lines."""

    path: str
    texts: list[str]
    lines: int  # non-blank lines read


def read_pool(path: str, format: str = "auto", plain_lines: bool = False, what: str = "--pool") -> Pool:
    """The distinct texts of the file ``path`` (:func:`zhie.data.base.iter_texts`: one text per line, or JSON lines
    with a string field "text"), blank lines left out. Refused, with the line: a JSON list, a file of sentence pairs
    with labels, and with ``plain_lines`` a text holding a line break (which a file of one text a line cannot
    keep)."""
    if not Path(path).is_file():
        kind = "a directory" if Path(path).is_dir() else "no such file"
        raise FileNotFoundError(f"{what} {path}: {kind}; give a file of texts, one per line (or JSON lines with a "
                                "string field 'text')")
    with open(path, "rb") as f:
        if f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
            raise DataError(path, 1, "a JSON list (a Label Studio export?), not a pool of texts: give one text per "
                                     "line, or JSON lines with a string field 'text'")
    seen: dict[str, int] = {}
    lines, pairs = 0, []  # pairs: the line numbers of the first texts, while each is a labelled sentence pair
    for lineno, text in iter_texts(path, format):
        if text is None or not text.strip():
            continue
        lines += 1
        if lines == len(pairs) + 1 and lines <= PAIRS_CHECKED and PAIR_LINE.fullmatch(text):
            pairs.append(lineno)
            if len(pairs) == PAIRS_CHECKED:
                _pairs(path, pairs)
        if plain_lines and ("\n" in text or "\r" in text):
            raise DataError(path, lineno, f"the text {shown(text)} holds a line break, which --output-format text "
                                          "(one text a line) cannot keep: use --output-format doccano or label-studio")
        seen.setdefault(text, lineno)
    if not seen:
        raise DataError(path, 1, "no text to choose from: the pool is empty (blank lines only); give a file with one "
                                 "text per line")
    if len(pairs) == lines:
        _pairs(path, pairs)
    return Pool(str(path), list(seen), lines)


def _pairs(path: str, lines: list[int]) -> None:
    raise DataError(path, lines[0], "sentence pairs with their labels (s1 TAB s2 TAB label), as similarity training "
                                    "reads them, not a pool of texts: give one sentence a line")


# ------------------------------------------------------------------------------------------------- uncertainty
class MeasuredModel:
    """A pipeline's model (torch or ONNX) as :meth:`~zhie.tasks.base.WindowedTask.window_hits` runs it: :meth:`arrays`
    and :meth:`each_arrays` answer as the model does and put, for each row of a batch, the task's ``surprise`` of the
    outputs and the row's content tokens in :attr:`rows`, in the order the rows come; anything else is the model's."""

    def __init__(self, model, task) -> None:
        self.model, self.task = model, task
        self.rows: collections.deque[tuple[float, int]] = collections.deque()

    def arrays(self, input_ids: np.ndarray, attention_mask: np.ndarray, *args, **kwargs) -> dict:
        return self._measured(self.model.arrays(input_ids, attention_mask, *args, **kwargs), attention_mask)

    def each_arrays(self, batches, *args, **kwargs):
        for batch, answer in self.model.each_arrays(batches, *args, **kwargs):
            yield batch, self._measured(answer, batch["attention_mask"])

    def _measured(self, outputs: dict, attention_mask: np.ndarray) -> dict:
        surprise = self.task.surprise(self, outputs, attention_mask)
        self.rows.extend(zip(np.asarray(surprise, dtype=np.float64).tolist(),
                             (np.asarray(attention_mask).sum(1) - 2).tolist()))
        return outputs

    def __getattr__(self, name: str):
        return getattr(self.model, name)


def has_uncertainty(task) -> bool:
    """Whether ``task`` gives the probability of its predictions (a windowed task with its own ``surprise``)."""
    from zhie.tasks.base import WindowedTask

    return isinstance(task, WindowedTask) and type(task).surprise is not WindowedTask.surprise


def no_uncertainty(task) -> str:
    """Why ``task``'s model has no uncertainty to select by, and what to do."""
    why = ("its labels are pairs of sentences and its output for one text is a vector, with no decision on the text "
           "to be unsure of" if task.name == "similarity" else "its predictions carry no probability")
    return (f"a {task.name} model gives no uncertainty of a text ({why}): choose with --strategy diversity or "
            "--strategy random")


def uncertainties(pipe, texts: Sequence[str], batch_size: int = 32, max_tokens: int | None = None,
                  chunk_size: int = CHUNK_LINES) -> np.ndarray:
    """``[len(texts)]`` float64: each text's uncertainty ``1 - exp(-S / n)`` (see the module's doc) under the pipeline
    ``pipe`` (:func:`zhie.load`'s), from 0 (sure) to 1, a text without tokens 0. ``chunk_size`` texts at a time
    (their windows sorted by length into batches of ``batch_size``, or of ``max_tokens`` padded tokens, as ``zhie
    predict`` batches them); one number per text is kept."""
    task = pipe.task
    if not has_uncertainty(task):
        raise ValueError(no_uncertainty(task))
    measured = MeasuredModel(pipe.model, task)
    out = np.zeros(len(texts), dtype=np.float64)
    with pipe.autocast():
        for a in range(0, len(texts), chunk_size):
            chunk = list(texts[a:a + chunk_size])
            surprise, tokens = np.zeros(len(chunk)), np.zeros(len(chunk))
            for i, *_ in task.window_hits(measured, chunk, batch_size, max_tokens=max_tokens):
                s, n = measured.rows.popleft()
                surprise[i] += s
                tokens[i] += n
            out[a:a + len(chunk)] = -np.expm1(-surprise / np.maximum(tokens, 1))
    return out


# ------------------------------------------------------------------------------------------------- diversity
class NgramIndex:
    """The character bigrams of ``texts`` (a text of one character: that character), numbered, with the texts of
    each bigram (postings), so that the Jaccard similarity of one text to all the others (:meth:`similarity`) costs
    the postings of its bigrams and one pass over the texts."""

    def __init__(self, texts: Sequence[str]) -> None:
        m = len(texts)
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=m)
        points = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.int64)
        owner = np.repeat(np.arange(m, dtype=np.int64), lengths)
        inside = owner[:-1] == owner[1:]
        keys = ((points[:-1] << 21) | points[1:])[inside]  # code points are < 2**21
        rows = owner[:-1][inside]
        single = np.flatnonzero(lengths == 1)
        keys = np.concatenate([keys, (1 << 42) | points[np.cumsum(lengths)[single] - 1]])
        rows = np.concatenate([rows, single])
        order = np.lexsort((keys, rows))
        keys, rows = keys[order], rows[order]
        first = np.ones(len(keys), dtype=bool)
        first[1:] = (keys[1:] != keys[:-1]) | (rows[1:] != rows[:-1])
        keys, rows = keys[first], rows[first]  # each text's distinct bigrams, by text
        _, features = np.unique(keys, return_inverse=True)
        features = features.reshape(-1).astype(np.int32)
        self.sizes = np.bincount(rows, minlength=m)
        self.text_start = np.concatenate([[0], np.cumsum(self.sizes)])
        self.features = features  # each text's bigrams (text i: features[text_start[i]:text_start[i + 1]])
        by_feature = np.argsort(features, kind="stable")
        self.postings = rows[by_feature].astype(np.int32)  # each bigram's texts
        counts = np.bincount(features, minlength=int(features.max()) + 1 if len(features) else 0)
        self.feature_start = np.concatenate([[0], np.cumsum(counts)])

    def __len__(self) -> int:
        return len(self.sizes)

    def similarity(self, i: int) -> np.ndarray:
        """``[len(texts)]``: the Jaccard similarity of the bigrams of text ``i`` to those of each text (1 to itself)."""
        mine = self.features[self.text_start[i]:self.text_start[i + 1]]
        if not len(mine):
            return np.zeros(len(self))
        hits = np.concatenate([self.postings[self.feature_start[f]:self.feature_start[f + 1]] for f in mine.tolist()])
        shared = np.bincount(hits, minlength=len(self))
        return shared / np.maximum(self.sizes + len(mine) - shared, 1)


def ranks(values: np.ndarray) -> np.ndarray:
    """``values`` as their ranks scaled to 0 (the smallest) .. 1 (the largest), ties sharing their mean rank."""
    if len(values) < 2:
        return np.ones(len(values))
    unique, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    below = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return (below + (counts - 1) / 2)[inverse.reshape(-1)] / (len(values) - 1)


@dataclass
class Choice:
    """What :func:`choose` picked: the indices, in the order picked, and how many of them broke the similarity limit
    (``relaxed``: the pool had no text left within it)."""

    indices: list[int]
    relaxed: int = 0


def choose(texts: Sequence[str], budget: int, strategy: str = SelectOptions.strategy,
           uncertainty: np.ndarray | None = None, diversity: float = SelectOptions.diversity,
           max_similarity: float = SelectOptions.max_similarity, seed: int = SelectOptions.seed,
           labelled: Sequence[str] = ()) -> Choice:
    """Pick ``budget`` of the distinct ``texts`` by ``strategy`` (see the module's doc); ``uncertainty``: one number per
    text (:func:`uncertainties`), needed by the uncertainty strategies; ``labelled``: texts labelled already, which
    the diversity strategies count as picked (a text like one of them is as unwelcome as one like a text picked)."""
    m = len(texts)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if not 1 <= budget <= m:
        raise ValueError(f"a budget of {budget} from {m} texts: give 1 to {m}")
    if len(set(texts)) != m:
        raise ValueError("the texts to choose from must be distinct (read_pool counts a duplicate once)")
    if strategy.startswith("uncertainty") and (uncertainty is None or len(uncertainty) != m):
        raise ValueError(f"--strategy {strategy} needs one uncertainty per text")
    rng = np.random.default_rng(seed)
    if strategy == "random":
        return Choice(rng.choice(m, budget, replace=False).tolist())
    if strategy == "uncertainty":
        return Choice(np.lexsort((np.arange(m), -np.asarray(uncertainty)))[:budget].tolist())
    known = set(texts)
    before = list(dict.fromkeys(t for t in labelled if t not in known))
    index = NgramIndex([*texts, *before])
    weight = 1.0 if strategy == "diversity" else diversity
    base = np.zeros(m) if strategy == "diversity" else (1.0 - weight) * ranks(np.asarray(uncertainty))
    tiebreak = np.empty(m, dtype=np.int64)
    tiebreak[rng.permutation(m)] = np.arange(m)
    closest = np.zeros(m)  # each text's largest similarity to a text picked (or labelled before)
    for k in range(m, m + len(before)):
        np.maximum(closest, index.similarity(k)[:m], out=closest)
    open_ = np.ones(m, dtype=bool)
    picked, relaxed = [], 0
    for _ in range(budget):
        allowed = open_ & (closest <= max_similarity)
        if not allowed.any():
            allowed, relaxed = open_, relaxed + 1
        value = np.where(allowed, base - weight * closest, -np.inf)
        best = np.flatnonzero(value == value.max())
        pick = int(best[np.argmin(tiebreak[best])])
        picked.append(pick)
        open_[pick] = False
        np.maximum(closest, index.similarity(pick)[:m], out=closest)
    return Choice(picked, relaxed)


# ------------------------------------------------------------------------------------------------- the job
@dataclass
class Selection:
    """The texts chosen, in their output order (most uncertain first), each with its uncertainty (None for a model
    without), and how many broke the similarity limit."""

    texts: list[str]
    uncertainty: list[float | None]
    pool: int
    relaxed: int = 0


def select(pipe, pool: Sequence[str], budget: int, *, strategy: str = SelectOptions.strategy,
           diversity: float = SelectOptions.diversity, max_similarity: float = SelectOptions.max_similarity,
           seed: int = SelectOptions.seed, batch_size: int = 32, max_tokens: int | None = None,
           labelled: Sequence[str] = ()) -> Selection:
    """Choose ``budget`` of the distinct texts ``pool`` for the model of ``pipe`` (:func:`zhie.load`'s pipeline) by
    ``strategy`` (:func:`choose`; ``labelled``: the texts labelled already); the chosen texts come most uncertain
    first (a model without uncertainty: in the order picked), each with its uncertainty (:func:`uncertainties`: of
    the whole pool for the uncertainty strategies, of the chosen texts only for the others)."""
    uncertain = has_uncertainty(pipe.task)
    if strategy.startswith("uncertainty") and not uncertain:
        raise ValueError(no_uncertainty(pipe.task))
    scores = uncertainties(pipe, pool, batch_size, max_tokens) if strategy.startswith("uncertainty") else None
    choice = choose(pool, budget, strategy, scores, diversity, max_similarity, seed, labelled)
    texts = [pool[i] for i in choice.indices]
    if not uncertain:
        return Selection(texts, [None] * len(texts), len(pool), choice.relaxed)
    chosen = scores[choice.indices] if scores is not None else uncertainties(pipe, texts, batch_size, max_tokens)
    order = np.lexsort((np.arange(len(texts)), -chosen)).tolist()
    return Selection([texts[k] for k in order], [float(chosen[k]) for k in order], len(pool), choice.relaxed)


def output_lines(selection: Selection, output_format: str, pipe=None, names: dict | None = None,
                 version: str | None = None, batch_size: int = 32, max_tokens: int | None = None) -> Iterator[str]:
    """The lines of ``zhie select --output-format``: the texts (``text``), or with the model's predictions of them
    (``pipe``) doccano's JSON lines or a Label Studio task list (the converters of ``zhie predict``,
    :mod:`zhie.deploy.outputs`), each with the text's uncertainty as ``score`` (see the module's doc)."""
    if output_format == "text":
        yield from selection.texts
        return
    task = pipe.task
    predictions = pipe.predict(selection.texts, batch_size, max_tokens=max_tokens)
    if output_format == "doccano":
        record = outputs.output_record(task, "doccano")
        for text, prediction, u in zip(selection.texts, predictions, selection.uncertainty):
            yield outputs.JSON_LINE.encode({**record(text, prediction), **_score(u)})
        return
    config = outputs.label_studio_config(names or {})
    yield from outputs.json_list(_label_studio_task(config, version, task, k, text, prediction, u)
                                 for k, (text, prediction, u) in enumerate(zip(selection.texts, predictions,
                                                                               selection.uncertainty), 1))


def _score(uncertainty: float | None) -> dict:
    return {} if uncertainty is None else {"score": round(uncertainty, 4)}


def _label_studio_task(config, version: str, task, number: int, text: str, prediction, uncertainty: float | None
                       ) -> dict:
    item = outputs.label_studio_item(config, version, task, stream.Line(None, number, text), prediction)
    if uncertainty is not None:
        item["predictions"][0]["score"] = round(1.0 - uncertainty, 4)  # Label Studio sorts by it
    return {**item, **_score(uncertainty)}


def check_output_format(task, output_format: str) -> None:
    """A clear error, before any work, when ``task``'s predictions have no form in ``output_format``."""
    if output_format == "doccano":
        outputs.output_record(task, "doccano")  # raises for a task without a doccano form
    if output_format == "label-studio" and task.output_key not in outputs.label_studio().OUTPUT_KEYS:
        raise ValueError(f"a {task.name} model's predictions have no Label Studio form: --output-format label-studio "
                         "is for NER, word segmentation and relation models; use --output-format text")


def cmd_select(args: argparse.Namespace) -> None:
    """``zhie select``: read the pool, load the model (its member ``--task``), choose, write (see the module's doc)."""
    from zhie.deploy.pipeline import load
    from zhie.tasks.modeldir import resolve_model_dir

    options = SelectOptions(**values_from_flags(args, SelectOptions))
    names = outputs.label_studio_names(args)
    if options.output:
        check_file_target(Path(options.output))
    pool = read_pool(options.pool, options.pool_format, plain_lines=options.output_format == "text")
    labelled = read_pool(options.labelled, options.pool_format, what="--labelled").texts if options.labelled else []
    if labelled:
        done = set(labelled)
        pool.texts = [t for t in pool.texts if t not in done]
        if not pool.texts:
            raise ValueError(f"--pool {pool.path}: every text is in --labelled {options.labelled}: nothing left to "
                             "choose from")
    if len(pool.texts) < options.budget:
        repeated = pool.lines - len(pool.texts)
        raise ValueError(f"--pool {pool.path}: {len(pool.texts)} distinct text(s) ({pool.lines} non-blank line(s)"
                         + (f", {repeated} repeated" if repeated else "") + f"), fewer than --budget "
                         f"{options.budget}: give a larger pool, or a budget of at most {len(pool.texts)}")
    pipe = load(args.model, device=args.device, precision=args.precision)
    if options.task is not None:
        pipe = pipe.member(options.task)
    elif hasattr(pipe.task, "members"):
        raise ValueError(f"{args.model} is a multi-task model: name the member to choose for with --task (its members: "
                         f"{', '.join(m.head_name for m in pipe.task.members)})")
    check_output_format(pipe.task, options.output_format)
    if options.strategy.startswith("uncertainty") and not has_uncertainty(pipe.task):
        raise ValueError(no_uncertainty(pipe.task))
    version = None
    if options.output_format == "label-studio":
        version = args.ls_model_version or outputs.label_studio().model_version(resolve_model_dir(args.model),
                                                                               pipe.task.name)
    with stream.collector_paused():
        selection = select(pipe, pool.texts, options.budget, strategy=options.strategy, diversity=options.diversity,
                           max_similarity=options.max_similarity, seed=options.seed, batch_size=args.batch_size,
                           max_tokens=args.max_tokens, labelled=labelled)
        stream.write_lines(options.output, output_lines(selection, options.output_format, pipe, names, version,
                                                        args.batch_size, args.max_tokens), CHUNK_LINES)
    report(selection, options)


def report(selection: Selection, options: SelectOptions) -> None:
    """What ``zhie select`` says on stderr: how many texts of how many, and the chosen ones' uncertainty."""
    scores = [u for u in selection.uncertainty if u is not None]
    where = f" into {options.output}" if options.output else ""
    about = f"; their uncertainty {min(scores):.3f} to {max(scores):.3f}" if scores else ""
    print(f"zhie: chose {len(selection.texts)} of the {selection.pool} distinct texts of {options.pool} "
          f"({options.strategy}){where}{about}", file=sys.stderr)
    if selection.relaxed:
        logger.warning("%d of the %d texts chosen are more similar than --max-similarity %s to one chosen before: "
                       "the pool had no other text left", selection.relaxed, len(selection.texts),
                       options.max_similarity)


def add_command(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``zhie select``'s parser: :class:`SelectOptions`' flags, the batching flags of ``zhie predict``, the Label
    Studio names, ``--config`` and ``--print-config``."""
    p = commands.add_parser("select", help=HELP)
    p.add_argument("model", help="model directory (or a run directory with best/), or an export directory")
    add_flags(p, SelectOptions)
    p.add_argument("--batch-size", type=positive_int, default=32, help="texts (windows) per model batch")
    add_batching_flags(p)
    outputs.add_label_studio_flags(p)
    add_config_flags(p, "select")
    p.set_defaults(handler=cmd_select)
    return p
