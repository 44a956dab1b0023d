"""The command-line flags that tasks and the prediction commands share: a task's own command over texts
(:func:`add_text_command`, :class:`TextCommand`), the input, output and batching flags of ``zhie predict``,
``segment``, ``embed`` and ``eval`` (:func:`add_prediction_flags`, :func:`add_batching_flags`), and the checks of
flag values (:func:`device_name`, :func:`check_max_length`, :func:`only_auto_format`; positive numbers:
:func:`zhie.core.options.positive_int`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zhie.core.options import positive_int
from zhie.data.base import TEXT_FORMATS
from zhie.precision import PRECISIONS
from zhie.tasks.pipeline import CHUNK_LINES, PipelineTask


@dataclass(frozen=True)
class TextCommand:
    """A task's own command over texts (:func:`add_text_command`): the CLI streams its input through the pipeline's
    ``stream`` and writes one output per input, as ``zhie predict`` does (JSON lines ``{"text", output_key}``), or:

    ``plain``: the line of one prediction (``zhie segment``'s words) when the command writes plain lines (it then
    has ``--json`` for the JSON lines); ``vectors``: the predictions are vectors, which ``--output FILE.npy`` writes as
    one array; ``options``: the keywords of the pipeline's ``stream`` that the command's own flags give (``zhie
    embed --no-normalize``)."""

    task: type[PipelineTask]  # the Task subclass whose models the command takes
    plain: Callable[[Any], str] | None = None
    vectors: bool = False
    options: Callable[[argparse.Namespace], dict] | None = None


def add_text_command(commands: argparse._SubParsersAction, task: type[PipelineTask], name: str, help: str, *,
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


def only_auto_format(format: str, what: str) -> None:
    """Readers of one format: ``--format`` other than ``auto`` is an error that says what the data must be."""
    if format != "auto":
        raise ValueError(f"--format {format} does not apply to {what}; leave it out")

