"""Batch prediction past one machine with Ray Data: ``zhie predict MODEL --ray --input PATH(S) --output DIR``.

Each input file (text or JSON lines as ``zhie predict --input`` reads them, or Parquet with a string column ``text``;
a directory stands for the files in it) is cut into pieces of ``rows`` lines (:func:`pieces`: one pass over the file's
lines on the driver, which keeps only where each piece starts; a Parquet file's pieces are its row groups), and each
piece is read by one Ray task into rows ``{"file", "line", "text"}`` (``line``: the 1-based line, or the row number in
a Parquet file). A pool of ``workers`` actors, each holding one model (one GPU
each when the cluster has GPUs, else ``cpus_per_worker`` CPUs, which an export's runs use and Ray's ``OMP_NUM_THREADS``
gives torch), maps the pipeline over batches of ``rows`` rows. The
output directory gets sharded JSON lines: ``zhie predict``'s object with ``file`` and ``line`` added, so sorting by
``(file, line)`` gives the input order back. A local output directory is written under a temporary name and renamed
when every shard is written.

On a cluster: ``ray start --head`` on one machine, ``ray start --address HEAD:6379`` on the others, then run
``zhie predict ... --ray --ray-address HEAD:6379`` (or with ``RAY_ADDRESS`` set) on any of them; every node needs
zhie installed and must see the model directory and the input files at the same paths (a shared file system: the
inputs are read with the local file system, and a URL is refused); the output may also be a URI that Ray writes
(``s3://``, ``gs://``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import ray

from zhie.core.files import replace_dir
from zhie.data import DataError
from zhie.data.base import text_format
from zhie.deploy.stream import TextReader

__all__ = ["input_files", "pieces", "predict_files", "read_rows"]

SUFFIXES = (".jsonl", ".json", ".txt", ".parquet")


def input_files(paths: list[str]) -> list[str]:
    """``paths`` with each directory replaced by its files ending in .jsonl, .json, .txt or .parquet, sorted; a URL
    (``s3://``, ``gs://``, ``file://``) is refused: the pieces are read with the local file system."""
    files = []
    for path in paths:
        if "://" in path:
            raise ValueError(f"--input {path}: --ray reads local paths, the same on every node (a shared file "
                             f"system), not URLs; copy the data there and give its path (--output may be an s3:// "
                             f"or gs:// URI: Ray writes it)")
        if Path(path).is_dir():
            files += sorted(str(f) for f in Path(path).iterdir() if f.suffix in SUFFIXES)
        else:
            files.append(path)
    if not files:
        raise ValueError("--ray needs --input PATH(S): files, or directories of .jsonl/.txt/.parquet files")
    return files


def pieces(path: str, lines: int, input_format: str = "auto") -> list[dict]:
    """The pieces ``{"file", "first", "start", "end", "format"}`` of the input file ``path``: ``lines`` lines each from
    line ``first`` (1-based), bytes ``start`` to ``end``, read as ``format`` (``text`` or ``jsonl``: decided once for
    the file, :func:`zhie.data.base.text_format`); a Parquet file's are its row groups (``start``: the group, ``end``:
    None)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        meta, first, out = pq.ParquetFile(path).metadata, 1, []
        for group in range(meta.num_row_groups):
            out.append({"file": path, "first": first, "start": group, "end": None, "format": "parquet"})
            first += meta.row_group(group).num_rows
        return out
    out, first, start, end = [], 1, 0, 0
    with open(path, "rb") as f:
        format, raws = text_format(path, f, input_format)
        for n, raw in enumerate(raws, 1):
            end += len(raw)
            if n % lines == 0:
                out.append({"file": path, "first": first, "start": start, "end": end, "format": format})
                first, start = n + 1, end
    if end > start:
        out.append({"file": path, "first": first, "start": start, "end": end, "format": format})
    return out


def read_piece(piece: dict, skip_bad_lines: bool = False) -> list[dict]:
    """The rows ``{"file", "line", "text"}`` of one piece of an input file (a bad line raises :class:`DataError`, or is
    skipped; a blank line has no row: the rows say which line they are)."""
    path, first = piece["file"], piece["first"]
    if piece["end"] is None:
        import pyarrow.parquet as pq

        texts = pq.ParquetFile(path).read_row_group(piece["start"], columns=["text"]).column("text").to_pylist()
        for i, text in enumerate(texts, first):
            if not isinstance(text, str):
                raise DataError(path, i, f"row {i}: 'text' is {text!r}, not a string; fix or drop the row")
        return [{"file": path, "line": i, "text": text} for i, text in enumerate(texts, first)]
    reader = TextReader([], [], skip_bad_lines=skip_bad_lines)
    return [{"file": path, "line": line.number, "text": line.text}
            for line in reader.numbered(path, piece["start"], piece["end"], first, piece["format"])
            if line.error is None and line.text]


def read_rows(files: list[str], rows: int, skip_bad_lines: bool = False, input_format: str = "auto"
              ) -> ray.data.Dataset:
    """The rows of ``files``, one Ray task (and block) per piece of ``rows`` lines (:func:`pieces`)."""
    parts = [piece for f in files for piece in pieces(f, rows, input_format)]
    return ray.data.from_items(parts, override_num_blocks=max(len(parts), 1)).flat_map(
        read_piece, fn_kwargs={"skip_bad_lines": skip_bad_lines}, num_cpus=0.25)


def bad_line(err: BaseException) -> DataError | None:
    """The :class:`DataError` (``FILE:LINE: reason``) that a read task raised, if ``err`` comes from one: Ray hands the
    driver a task's exception as the text of its traceback only."""
    found = re.search(r"zhie\.data\.base\.DataError: (.+?):(\d+): (.+)", str(err))
    return DataError(found[1], int(found[2]), found[3]) if found else None


class Predictor:
    """One model per Ray actor: a batch of rows -> the same rows with the task's prediction under its output key."""

    def __init__(self, model: str, precision: str, batch_size: int, max_tokens: int | None, cpus: float) -> None:
        from zhie.deploy.pipeline import load
        from zhie.deploy.runtime import is_export
        from zhie.tasks.modeldir import resolve_model_dir

        # an export's runs take the actor's share of the CPUs, not every CPU of the machine (torch's threads follow
        # the OMP_NUM_THREADS that Ray sets for the actor)
        threads = max(1, int(cpus)) if is_export(resolve_model_dir(model)) else None
        self.pipe = load(model, precision=precision, threads=threads)
        self.batch_size, self.max_tokens = batch_size, max_tokens

    def __call__(self, rows: pd.DataFrame) -> pd.DataFrame:
        task = self.pipe.task
        predictions = self.pipe.predict(rows["text"].tolist(), batch_size=self.batch_size, max_tokens=self.max_tokens)
        return rows.assign(**{task.output_key: [task.to_json(p) for p in predictions]})


def predict_files(model: str, inputs: list[str], output: str | None, *, address: str | None = None,
                  workers: int | None = None, cpus_per_worker: float = 1.0, precision: str = "fp32",
                  batch_size: int = 32, max_tokens: int | None = None, rows: int = 4096,
                  skip_bad_lines: bool = False, input_format: str = "auto") -> None:
    """Predict every text of ``inputs`` with ``workers`` model replicas and write sharded JSON lines into the
    directory ``output`` (see the module's docstring). Joins the Ray cluster at ``address`` (default: ``RAY_ADDRESS``,
    else a new local instance, shut down at the end) unless this process is already connected to one.
    ``skip_bad_lines``: leave out the lines :class:`~zhie.deploy.stream.TextReader` rejects (they are not counted
    here); ``input_format``: how a text file holds its texts (:func:`zhie.data.base.text_format`)."""
    if not output:
        raise ValueError("--ray writes a directory of JSON-lines shards: give --output DIRECTORY")
    local = "://" not in output
    if local and Path(output).exists():
        raise ValueError(f"{output} exists; give --output a new directory (shards are not mixed with old ones)")
    model = str(Path(model).resolve())  # the workers' working directory may differ
    files = [str(Path(f).resolve()) for f in input_files(inputs)]
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        workers = workers or gpus or 1

        def write(target) -> None:
            ds = read_rows(files, rows, skip_bad_lines, input_format)
            ds = ds.map_batches(Predictor, fn_constructor_kwargs={"model": model, "precision": precision,
                                                                 "batch_size": batch_size, "max_tokens": max_tokens,
                                                                 "cpus": cpus_per_worker},
                                batch_size=rows, batch_format="pandas", concurrency=workers,
                                num_gpus=1 if gpus else 0, num_cpus=cpus_per_worker)
            ds.write_json(str(target), force_ascii=False)

        try:
            if local:
                replace_dir(Path(output).resolve(), write)  # the directory appears whole or not at all
            else:
                write(output)
        except BaseException as err:
            data_error = bad_line(err)
            if data_error is not None:  # the reader's FILE:LINE message, not Ray's traceback around it
                raise data_error from None
            raise
    finally:
        if started:
            ray.shutdown()
