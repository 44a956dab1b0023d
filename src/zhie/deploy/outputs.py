"""The output formats of ``zhie predict`` (``segment``, ``embed``): zhie's JSON lines, doccano's JSON lines and Label
Studio's task list, one output per input line of :mod:`zhie.deploy.stream`; ``zhie select`` writes its texts with the
same converters (:mod:`zhie.deploy.selection`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator

from zhie.deploy import stream

__all__ = ["JSON_LINE", "OUTPUT_FORMATS", "add_label_studio_flags", "json_list", "label_studio_config",
           "label_studio_item", "label_studio_lines", "label_studio_names", "output_line", "output_record"]

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


def label_studio_item(config, version: str, task, line: stream.Line, prediction) -> dict:
    """The Label Studio task of one input ``line`` and its ``prediction`` (:func:`label_studio_lines`): the text and the
    prediction as a pre-annotation (:func:`zhie.data.label_studio.prediction_task`), or for a bad line skipped with
    ``--skip-bad-lines`` an empty text and in ``meta`` the file, line and error. ``config``: a
    :class:`zhie.data.label_studio.LabelConfig`."""
    ls = label_studio()
    if line.error is not None:
        return {"data": {config.data_key: ""}, "meta": {"file": line.path, "line": line.number, "error": line.error}}
    return ls.prediction_task(line.text, ls.prediction_result(task.output_key, task.to_json(prediction), config),
                              version, config)


def label_studio_config(names: dict[str, str | None]):
    """The :class:`zhie.data.label_studio.LabelConfig` of ``names`` (``from_name``, ``to_name``, ``data_key``; None:
    Label Studio's usual)."""
    return label_studio().LabelConfig(**{k: v for k, v in names.items() if v is not None})


def json_list(items: Iterable) -> Iterator[str]:
    """A JSON list of ``items``, one a line: the first line opens the list, one more closes it."""
    opening = "["
    for item in items:
        yield opening + JSON_LINE.encode(item)
        opening = ","
    yield "]" if opening == "," else "[]"


def label_studio_lines(names: dict[str, str | None], version: str, task, results) -> Iterator[str]:
    """``zhie predict --output-format label-studio``: a JSON list of Label Studio tasks, one a line and one per input
    line (:func:`json_list`), each :func:`label_studio_item`. ``names``: the project's labelling config
    (``from_name``, ``to_name``, ``data_key``; None: Label Studio's usual), ``version``: the predictions'
    ``model_version``."""
    config = label_studio_config(names)
    return json_list(label_studio_item(config, version, task, line, prediction) for line, prediction in results)


def add_label_studio_flags(p: argparse.ArgumentParser) -> None:
    """The names of a Label Studio project's labelling config that ``--output-format label-studio`` writes (``zhie
    predict``, ``zhie select``), and the predictions' version."""
    ls = p.add_argument_group("Label Studio output (--output-format label-studio): the names of the project's "
                              "labelling config")
    ls.add_argument("--ls-from-name", default=None, help="the <Labels> control's name (default: label)")
    ls.add_argument("--ls-to-name", default=None, help="the <Text> object's name (default: text)")
    ls.add_argument("--ls-data-key", default=None, help="the task field the <Text> shows, its $value (default: text)")
    ls.add_argument("--ls-model-version", default=None,
                    help="the predictions' model_version (default: zhie-TASK- and a hash of the model's zhie.json and "
                         "training.json)")


def label_studio_names(args: argparse.Namespace) -> dict[str, str | None]:
    """The names that :func:`add_label_studio_flags`' flags give (``from_name``, ``to_name``, ``data_key``), after
    checking that they come with ``--output-format label-studio``."""
    given = [flag for flag in ("ls_from_name", "ls_to_name", "ls_data_key", "ls_model_version")
             if getattr(args, flag) is not None]
    if given and args.output_format != "label-studio":
        raise ValueError(f"--{given[0].replace('_', '-')} names the Label Studio output: add --output-format "
                         "label-studio, or leave it out")
    return {"from_name": args.ls_from_name, "to_name": args.ls_to_name, "data_key": args.ls_data_key}
