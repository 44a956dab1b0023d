"""The output formats of ``zhie predict`` (``segment``, ``embed``): zhie's JSON lines, doccano's JSON lines and Label
Studio's task list, one output per input line of :mod:`zhie.deploy.stream`."""

from __future__ import annotations

import json
from collections.abc import Iterator

from zhie.deploy import stream

__all__ = ["JSON_LINE", "OUTPUT_FORMATS", "label_studio_lines", "output_line", "output_record"]

# what json.dumps(value, ensure_ascii=False) writes, without the encoder that json.dumps builds anew on each call
# given an option (a few microseconds a line)
JSON_LINE = json.JSONEncoder(ensure_ascii=False)


OUTPUT_FORMATS = ("zhie", "doccano", "label-studio")  # zhie predict --output-format


def output_record(task, output_format: str):
    """``record(text, prediction) -> dict``, the JSON object of one output line of ``zhie predict --output-format``
    (:data:`OUTPUT_FORMATS`), or None for zhie's own ``{"text", OUTPUT_KEY}``; ``label-studio``, a JSON list rather than
    lines, is :func:`label_studio_lines`'."""
    if output_format == "zhie":
        return None
    if output_format == "doccano":
        from zhie.data import doccano

        return doccano.records(task.output_key)
    raise ValueError(f"unknown output format {output_format!r}; use one of {', '.join(OUTPUT_FORMATS)}")


def output_line(task, line: stream.Line, prediction, plain=None, record=None) -> str:
    """The output line of one input ``line`` of ``zhie predict`` (``segment``, ``embed``): ``{"text", OUTPUT_KEY}``
    with the task's JSON of ``prediction``, ``record(text, prediction)`` (:func:`output_record`), or
    ``plain(prediction)`` (a :class:`zhie.tasks.cli_flags.TextCommand`'s plain lines); for a bad line skipped with
    ``--skip-bad-lines``, ``{"file", "line", "error"}`` (plain: an empty line)."""
    if line.error is not None:
        return "" if plain is not None else JSON_LINE.encode({"file": line.path, "line": line.number,
                                                              "error": line.error})
    if plain is not None:
        return plain(prediction)
    if record is not None:
        return JSON_LINE.encode(record(line.text, prediction))
    return JSON_LINE.encode({"text": line.text, task.output_key: task.to_json(prediction)})


def label_studio():
    """:mod:`zhie.data.label_studio`, imported when asked for (it is not on the path of a plain ``zhie predict``)."""
    from zhie.data import label_studio

    return label_studio


def label_studio_lines(names: dict[str, str | None], version: str, task, results) -> Iterator[str]:
    """``zhie predict --output-format label-studio``: a JSON list of Label Studio tasks, one a line and one per input
    line (the first line opens the list, one more closes it): the text and its prediction as a pre-annotation
    (:func:`zhie.data.label_studio.prediction_task`), or for a bad line skipped with ``--skip-bad-lines`` an empty
    text and in ``meta`` the file, line and error. ``names``: the project's labelling config (``from_name``,
    ``to_name``, ``data_key``; None: Label Studio's usual), ``version``: the predictions' ``model_version``."""
    ls = label_studio()
    config = ls.LabelConfig(**{k: v for k, v in names.items() if v is not None})
    opening = "["
    for line, prediction in results:
        if line.error is not None:
            item = {"data": {config.data_key: ""},
                    "meta": {"file": line.path, "line": line.number, "error": line.error}}
        else:
            result = ls.prediction_result(task.output_key, task.to_json(prediction), config)
            item = ls.prediction_task(line.text, result, version, config)
        yield opening + JSON_LINE.encode(item)
        opening = ","
    yield "]" if opening == "," else "[]"
