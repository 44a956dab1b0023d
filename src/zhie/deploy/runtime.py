"""Run an export directory (:mod:`zhie.deploy.export`) on onnxruntime, without torch:
``zhie.load(EXPORT_DIR).predict(texts)``.

What runs: the tokenizer from ``tokenizer.json`` (the ``tokenizers`` library, :class:`zhie.core.text.FastTokenizer`),
the task's own code (windows, :mod:`zhie.core.decoding`'s numpy decoders, offsets), and the graph in an onnxruntime
session (:class:`OnnxModel`, which answers :meth:`zhie.model.Model.arrays` the way the torch model does). The decoders
read the weights they need (the CRF's transitions) from ``head.safetensors`` as numpy arrays. Imports: numpy,
tokenizers, safetensors, onnxruntime; never torch or transformers (``pip install "zhie[runtime]"``).
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from zhie import tasks
from zhie.tasks.modeldir import HEAD_FILE, load_weights, read_meta

GRAPH_FILE = "model.onnx"
EXPORT_FILE = "export.json"
INPUTS = ("input_ids", "attention_mask")


def is_export(path: str | os.PathLike) -> bool:
    return (Path(path) / EXPORT_FILE).exists()


class OnnxModel:
    """An exported graph in an onnxruntime session, answering :meth:`arrays` as :class:`zhie.model.Model` does.

    ``heads``: the head names it answers for (default: all of the graph's; :meth:`view` narrows them, sharing the
    session). Runs on the CPU, in fp32.

    ``threads`` (None: :func:`cpus`, the CPUs this process may use): :meth:`arrays` splits a batch's rows into that
    many parts and runs them at once, each as one single-threaded run of one session (:func:`session` with one
    thread), in this thread and ``threads - 1`` of a pool's. onnxruntime's own intra-op threads split each operator of
    one run instead, and wait for each other at every one: over the CLUENER texts in batches of 32 on 2 cores, two
    single-threaded runs of half a batch took 0.76x the time of one two-threaded run for the 128-wide convolutional
    student's int8 graph, 0.87x for a 4-layer e5-small cut and 0.89x for the 12-layer one (benchmarks/RESULTS.md,
    "Two runs at once"). A one-row call runs in one thread. How a batch is split leaves the outputs as they are, an int8
    graph's too, unless it was exported with one activation scale per run (``zhie export --batch-scales``).

    :meth:`each_arrays` (many batches, as ``zhie predict`` runs them) runs whole batches at once instead, up to
    ``threads`` of them, each a single-threaded run, while the caller decodes the outputs of the one before: the
    cores do not wait for the decoding (benchmarks/RESULTS.md, "Batches ahead of the decoding").
    """

    runtime = "onnxruntime"

    def __init__(self, directory: str | os.PathLike, threads: int | None = None) -> None:
        from safetensors.numpy import load_file

        directory = Path(directory)
        again = "the export is damaged or was edited: export the model again (zhie export)"
        try:
            self.record = json.loads((directory / EXPORT_FILE).read_text(encoding="utf-8"))
            self.layout: dict[str, list[str] | None] = dict(self.record["outputs"])
            graph = directory / self.record["graph"]
        except (ValueError, KeyError, TypeError) as err:  # not UTF-8, not JSON, or not an export's record
            raise ValueError(f"{directory / EXPORT_FILE}: not an export's record ({err!r}); {again}") from None
        self.heads = list(self.layout)
        self.threads = cpus() if threads is None else threads
        if self.threads < 1:
            raise ValueError(f"threads must be at least 1 ({threads} given)")
        try:
            self.session = session(graph, 1)
        except Exception as err:  # onnxruntime's own errors (InvalidProtobuf, NoSuchFile, ...) derive from Exception
            raise ValueError(f"{graph}: onnxruntime cannot load the graph ({err}); {again}") from None
        self.weights = load_weights(load_file, directory / HEAD_FILE)
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        self.encoder_config = SimpleNamespace(**config)  # what GET /info reports (model_type)
        self.directory = directory
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="zhie-onnx") if self.threads > 1 else None

    def to(self, device) -> OnnxModel:
        if str(device) != "cpu":
            raise ValueError(f"{self.directory} is an ONNX export; zhie runs exports on the CPU ({device!r} asked)")
        return self

    def view(self, names: Sequence[str]) -> OnnxModel:
        """The same graph answering for the heads ``names`` only (no copy)."""
        out = object.__new__(OnnxModel)
        out.__dict__.update(self.__dict__, heads=list(names))
        return out

    def arrays(self, input_ids: np.ndarray, attention_mask: np.ndarray, heads: Sequence[str] | None = None
               ) -> dict[str, object]:
        """``{head: output}`` for ``heads`` (default: this model's): fp32 arrays, a dataclass output (GPLinker's) as
        ``{field: array}``."""
        return self._named(self.run(_feeds(input_ids, attention_mask)), heads)

    def each_arrays(self, batches: Iterable[dict[str, np.ndarray]], heads: Sequence[str] | None = None
                    ) -> Iterator[tuple[dict[str, np.ndarray], dict[str, object]]]:
        """``(batch, outputs)`` for each of ``batches`` (dicts with ``input_ids`` and ``attention_mask``, as
        :func:`zhie.tasks.batching.input_arrays` makes them), in order, the outputs as :meth:`arrays` gives them.
        With more than one thread, up to :attr:`threads` batches run at once, each a single-threaded run, and the next
        batch is taken from ``batches`` before the caller gets the outputs of one: the graph of the batches ahead runs
        while the caller decodes (see the class). The outputs are those of :meth:`arrays`, batch by batch."""
        if self.pool is None:
            for batch in batches:
                yield batch, self.arrays(batch["input_ids"], batch["attention_mask"], heads)
            return
        ahead: deque = deque()
        try:
            for batch in batches:
                feeds = _feeds(batch["input_ids"], batch["attention_mask"])
                ahead.append((batch, self.pool.submit(self.session.run, None, feeds)))
                if len(ahead) > self.threads:  # every thread busy and one more batch waiting: take the oldest's
                    done, future = ahead.popleft()
                    yield done, self._named(future.result(), heads)
            while ahead:
                done, future = ahead.popleft()
                yield done, self._named(future.result(), heads)
        finally:  # the caller stopped early (or a run failed): the runs not started yet are not needed
            for _, future in ahead:
                future.cancel()

    def _named(self, arrays: list[np.ndarray], heads: Sequence[str] | None) -> dict[str, object]:
        """The graph's outputs in the order of :attr:`layout` -> ``{head: output}`` for ``heads`` (default: this
        model's)."""
        arrays = iter(arrays)
        outputs = {name: next(arrays) if fields is None else {f: next(arrays) for f in fields}
                   for name, fields in self.layout.items()}
        return {name: outputs[name] for name in (self.heads if heads is None else heads)}

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The graph's outputs for ``feeds`` (batch first, as every output of zhie's graphs), the rows split over
        :attr:`threads` runs at once (see the class)."""
        rows = len(feeds[INPUTS[0]])
        parts = min(self.threads, rows)
        if parts < 2:
            return self.session.run(None, feeds)
        cuts = np.linspace(0, rows, parts + 1).astype(int)
        chunks = [{k: v[a:b] for k, v in feeds.items()} for a, b in zip(cuts[:-1], cuts[1:])]
        later = [self.pool.submit(self.session.run, None, chunk) for chunk in chunks[1:]]
        outputs = [self.session.run(None, chunks[0])] + [f.result() for f in later]
        return [np.concatenate(part) for part in zip(*outputs)]

    def head_weights(self, name: str) -> dict[str, np.ndarray]:
        """The weights of head ``name`` (names relative to it, e.g. ``crf.transitions``) from ``head.safetensors``."""
        prefix = f"heads.{name}."
        return {k[len(prefix):]: v for k, v in self.weights.items() if k.startswith(prefix)}


def _feeds(input_ids: np.ndarray, attention_mask: np.ndarray) -> dict[str, np.ndarray]:
    """The graph's inputs: int64 arrays by name."""
    return {name: np.asarray(a, dtype=np.int64) for name, a in zip(INPUTS, (input_ids, attention_mask))}


# onnxruntime rewrites a residual Add followed by a LayerNormalization into one SkipLayerNormalization; on the 2-core
# AMD EPYC of benchmarks/RESULTS.md ("Fast students") the fused kernel took 7x the time of the plain LayerNormalization
# of the same shape, and leaving the two apart made whole graphs 0.79-0.92x as long (12-layer and 4-layer e5-small,
# int8 and fp32; convolutional students). The fp32 outputs are the same to 2e-5.
DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def session(graph: str | os.PathLike, threads: int | None = None, optimized_model: str | os.PathLike | None = None):
    """An onnxruntime CPU session of ``graph``, as zhie runs every export.

    ``threads``: the intra-op threads (None: :func:`default_threads`). The threads do not spin while they wait for
    work (``session.intra_op.allow_spinning`` off): between two calls the process tokenises, decodes and writes on the
    same cores, and the spinning threads took CPU from it and from any other process. On 2 cores shared with a
    training run, ``zhie predict`` of a 1-layer int8 export spent 3.4-3.6 s in onnxruntime instead of 4.3-5.5 s, and
    its Python work 0.10-0.12 s instead of 0.16-0.20 s (not measured on idle cores, where spinning saves a thread's
    wake-up per parallel operator). The optimisers of :data:`DISABLED_OPTIMIZERS` are off. ``optimized_model``: where
    onnxruntime writes the graph it runs, after its rewrites (to inspect them)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    threads = default_threads() if threads is None else threads
    if threads is not None:
        options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if optimized_model is not None:
        options.optimized_model_filepath = str(optimized_model)
    return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(DISABLED_OPTIMIZERS))


def default_threads() -> int | None:
    """The intra-op threads of a session: the CPUs this process may run on when it may not run on all of the machine's
    (``taskset``, a container's cpuset; onnxruntime 1.32 counts the machine's cores and starts two threads on one
    allowed CPU), else None (onnxruntime's default, one per physical core)."""
    allowed = cpus()
    return allowed if allowed < (os.cpu_count() or allowed) else None


def cpus() -> int:
    """The CPUs this process may run on (``taskset``, a container's cpuset), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def load_export(path: str | os.PathLike, threads: int | None = None):
    """``(task, model)`` of an export directory: the task from ``zhie.json`` with the tokenizer of ``tokenizer.json``,
    the model an :class:`OnnxModel` whose graph has a head for each of the task's."""
    from zhie.core.text import FastTokenizer

    path = Path(path)
    meta = read_meta(path)
    cls = tasks.get(str(meta.get("task")))
    fields = cls.config_class.__dataclass_fields__
    task = cls(cls.config_class(**{k: v for k, v in meta.items() if k in fields}), FastTokenizer.from_dir(path))
    task.load_files(path)
    model = OnnxModel(path, threads)
    missing = sorted({m.head_name for m in getattr(task, "members", [task])} - set(model.layout))
    if missing:
        raise ValueError(f"{path}/{EXPORT_FILE}: the graph has no output for the heads {missing}; export it again")
    return task, model
