"""The ``zhie`` command: train, eval, predict, demo, serve, export, the training jobs (distill, pretrain), and the
tasks' own commands (segment, embed).

Over 400 lines: one parser and its handlers, a screen of each per command; what a handler does lives in the library
(a handler reads its flags and calls one function), so splitting the file would only scatter the command table.

Tasks are found through the registry (:mod:`zhie.tasks`): ``zhie train TASK`` gets the common training flags plus
the task's own (``Task.add_arguments``), and a task may add commands (``Task.add_commands``).

Start-up: the parser is built for the command on the command line only (:func:`build_parser`): the others are one
line of help each, so ``zhie --help`` imports no task and no torch, and ``zhie predict`` imports the task of its model
(and torch only for a torch model, not for an export).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# numpy's OpenBLAS starts a thread per core as numpy is imported. The command's own numpy work is small (decoding,
# one sentence vector at a time); its models run in torch (MKL) or onnxruntime, with their own threads. With one
# OpenBLAS thread instead of two, a fast student's `zhie predict` of 2,688 sentences took 0.87x the CPU time on 2 cores
# (the same wall time while the second core was idle; numpy's import took ~60 instead of ~100 ms while it was busy)
# (benchmarks/RESULTS.md, "Fast students"). A user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from zhie import tasks  # noqa: E402  (after the setting above: this imports numpy)
from zhie.core.files import atomic_write_text, check_file_target  # noqa: E402
from zhie.data import FORMATS  # noqa: E402
from zhie.deploy import stream  # noqa: E402
from zhie.precision import PRECISIONS  # noqa: E402
from zhie.tasks.cli_flags import add_batching_flags, add_prediction_flags, positive_int  # noqa: E402
from zhie.tasks.modeldir import resolve_model_dir  # noqa: E402
from zhie.version import __version__  # noqa: E402


def _train_flags(p: argparse.ArgumentParser, data: bool = True) -> None:
    if data:  # a task whose own options name its data (multitask's --config) has none of these
        p.add_argument("--train", required=True, help="training file")
        p.add_argument("--dev", required=True, help="development file, evaluated after each epoch")
        p.add_argument("--format", default="auto", choices=["auto", *FORMATS], help="NER file format")
    p.add_argument("--encoder", default="e5-small",
                   help="a local HF model directory, e5-small (offline default), tiny, or a hub name")
    p.add_argument("--out", required=True, help="run directory (best/ holds the best model)")
    p.add_argument("--encoder-layers", type=int, default=None, help="keep only the encoder's first N layers")
    p.add_argument("--unshare-layers", action="store_true",
                   help="ALBERT: give every layer its own copy of the shared weights (spec 9.1)")
    p.add_argument("--keep-tokens", default="auto", choices=["auto", "all", "cjk", "data"],
                   help="prune the encoder vocabulary (char mode): auto = cjk for vocabularies over 50k")
    p.add_argument("--mixed-precision", dest="precision", action=_MixedPrecision, choices=["no", "fp16", "bf16"],
                   default=argparse.SUPPRESS, help="deprecated: use --precision (no = fp32)")  # --precision's default
    p.add_argument("--no-resume", action="store_true", help="start afresh even if --out has a checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    from zhie.training.config import add_train_flags

    add_train_flags(p)  # TrainConfig's fields, each with its help and default (zhie.core.options.option)


def _watch_flags(p: argparse.ArgumentParser, where: str) -> argparse.ArgumentParser:
    """The engine's flags for watching a run (zhie.training.tracking), on every command that trains."""
    g = p.add_argument_group("watching the run")
    g.add_argument("--log-every", type=int, default=None, metavar="STEPS",
                   help="steps between the step records of metrics.jsonl (mean loss, learning rates, gradient norm, "
                        "tokens/s); default: about 100 per run, at least one every 50 steps")
    g.add_argument("--report-to", nargs="+", default=["none"], metavar="TRACKER",
                   help=f"experiment trackers: tensorboard, mlflow, wandb (several allowed) or none; offline, in "
                        f"{where} (install: pip install 'zhie[tensorboard]', 'zhie[mlflow]', 'zhie[wandb]')")
    return p


class _MixedPrecision(argparse.Action):
    """The deprecated ``--mixed-precision no|fp16|bf16`` (accelerate's names): sets ``--precision``, with a warning."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        precision = "fp32" if value == "no" else value
        print(f"zhie: warning: --mixed-precision is deprecated; use --precision {precision}", file=sys.stderr)
        setattr(namespace, self.dest, precision)


TRAIN_HELP = "train a model"
# the help lines of the jobs' own parsers (zhie.training.distill's, zhie.training.pretrain's)
DISTILL_HELP = ("a smaller, faster student of a trained model (--teacher), or the MTMT student of cross-lingual NER "
                "(--recognizer, --evaluator; spec 10.3)")
PRETRAIN_HELP = "masked-LM pre-training of an encoder on raw text (from scratch or continued)"


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``zhie`` parser: every command with its flags, or, given ``argv``, only the command it names with its flags
    and the others as one line of help (their modules, and the tasks', are not imported)."""
    command = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    parser = argparse.ArgumentParser(prog="zhie", description="Chinese information extraction in PyTorch.")
    parser.add_argument("--version", action="version", version=f"zhie {__version__}")
    parser.add_argument("--debug", "--verbose", action="store_true",
                        help="show the library's debug messages, and the traceback of an error (before the command: "
                             "zhie --debug train ...)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _train_parser(sub, command)
    _eval_parser(sub)
    _predict_parser(sub)
    _task_commands(sub, command)
    _job_parsers(sub, command)
    _serve_parser(sub)
    _export_parser(sub)
    _demo_parser(sub)
    return parser


def _train_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    """``zhie train TASK``: the common training flags and each task's own, for every task when ``train`` is asked."""
    train = sub.add_parser("train", help=TRAIN_HELP)
    if command not in (None, "train"):
        return
    commands = train.add_subparsers(dest="task", required=True, metavar="TASK")
    for cls in tasks.all_tasks():
        _task_flags(commands.add_parser(cls.name, aliases=list(cls.aliases), help=cls.help), cls)


def _task_flags(p: argparse.ArgumentParser, cls) -> argparse.ArgumentParser:
    """``zhie train TASK``'s flags: the common training flags and the task's own."""
    _train_flags(p, cls.data_flags)
    group = p.add_argument_group(f"{cls.name} options")
    cls.add_arguments(group)
    p.set_defaults(task_class=cls, task_options=[action.dest for action in group._group_actions])
    return p


def expand_run_config(argv: list[str]) -> list[str]:
    """``zhie train --config FILE [FLAG ...]`` as ``zhie train TASK`` with the flags that the settings of ``FILE`` (a
    run directory's ``config.toml``, or one written by hand: the flags' names as keys, the training options in a
    ``[training]`` table, the task's in a table named after it) stand for, then the flags given, which override
    them. Any other command line is returned as it is."""
    if argv[:2] != ["train", "--config"] or len(argv) < 3:
        return argv
    import tomllib

    path = argv[2]
    try:
        with open(path, "rb") as f:
            settings = tomllib.load(f)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not a TOML file ({err})") from None
    name = settings.pop("task", None)
    if not isinstance(name, str):
        raise ValueError(f'{path}: no task: name the task to train (task = "ner"; one of '
                         f"{', '.join(c.name for c in tasks.all_tasks())})")
    cls = tasks.get(name)
    actions = {a.dest: a for a in _task_flags(argparse.ArgumentParser(), cls)._actions if a.option_strings}
    flat = {**{k: v for k, v in settings.items() if not isinstance(v, dict)}, **settings.get("training", {}),
            **settings.get(cls.name, {})}
    unknown = [k for k in flat if k not in actions] + [k for k, v in settings.items()
                                                      if isinstance(v, dict) and k not in ("training", cls.name)]
    if unknown:
        raise ValueError(f"{path}: {', '.join(unknown)}: not a setting of zhie train {cls.name} (see zhie train "
                         f"{cls.name} --help; training options go in [training], the task's in [{cls.name}])")
    flags = []
    for dest, value in flat.items():
        action = actions[dest]
        if action.nargs == 0:  # a switch: given when the setting is not its default
            flags += [action.option_strings[0]] if value != action.default else []
        elif value != []:  # an empty list (no trackers) is the default
            flags += [action.option_strings[0], *map(str, value if isinstance(value, list) else [value])]
    return ["train", cls.name, *flags, *argv[3:]]


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser("eval", help="evaluate a trained model on a labelled file")
    ev.add_argument("model", help="model directory (or a run directory with best/)")
    ev.add_argument("--data", required=True)
    ev.add_argument("--task", default=None, help="a multi-task model: the member to score (its name)")
    ev.add_argument("--format", default="auto", choices=["auto", *FORMATS])
    ev.add_argument("--json", default=None, help="also write the metrics to this JSON file")
    ev.add_argument("--errors", default=None, metavar="FILE",
                    help="write each error (JSON lines: false positive, false negative, wrong type; CWS: wrong word "
                         "boundaries) with its sentence and offsets, and print the most frequent confusions")
    ev.add_argument("--batch-size", type=positive_int, default=32)
    add_batching_flags(ev)


def _predict_parser(sub: argparse._SubParsersAction) -> None:
    pr = sub.add_parser("predict", help="predict with a trained model; JSON lines out, in input order")
    pr.add_argument("model", help="model directory (or a run directory with best/)")
    add_prediction_flags(pr)
    pr.add_argument("--output-format", default="zhie", choices=OUTPUT_FORMATS,
                    help="zhie: JSON lines {\"text\", OUTPUT_KEY}; doccano: doccano's JSON lines to import (NER: "
                         "{\"text\", \"label\"}; relations: {\"text\", \"entities\", \"relations\"}); label-studio: a "
                         "JSON list of Label Studio tasks to import, one per input line, the predictions as "
                         "pre-annotations (NER, word segmentation and relation models)")
    ls = pr.add_argument_group("Label Studio output (--output-format label-studio): the names of the project's "
                               "labelling config")
    ls.add_argument("--ls-from-name", default=None, help="the <Labels> control's name (default: label)")
    ls.add_argument("--ls-to-name", default=None, help="the <Text> object's name (default: text)")
    ls.add_argument("--ls-data-key", default=None, help="the task field the <Text> shows, its $value (default: text)")
    ls.add_argument("--ls-model-version", default=None,
                    help="the predictions' model_version (default: zhie-TASK- and a hash of the model's zhie.json and "
                         "training.json)")
    ray = pr.add_argument_group("Ray Data (the ray extra): --input PATH(S) of JSONL/text/Parquet, --output DIRECTORY")
    ray.add_argument("--ray", action="store_true", help="predict with one model per Ray worker; sharded JSONL out")
    ray.add_argument("--ray-address", default=None, help="the cluster to join (default: RAY_ADDRESS, else a local one)")
    ray.add_argument("--ray-workers", type=positive_int, default=None,
                     help="model replicas (default: the cluster's GPUs, else 1)")
    ray.add_argument("--ray-cpus", type=float, default=1.0,
                     help="CPUs per worker (an export splits its batches over that many, at least one)")


def _job_parsers(sub: argparse._SubParsersAction, command: str | None) -> None:
    """The training jobs besides ``zhie train`` (``distill``, ``pretrain``): their parsers, from their modules (which
    import torch), only when asked."""
    if command in (None, "distill"):
        from zhie.training import distill

        distill.add_command(sub)
    else:
        sub.add_parser("distill", help=DISTILL_HELP)
    if command in (None, "pretrain"):
        from zhie.training import pretrain

        _watch_flags(pretrain.add_command(sub), "<out>-logs")
    else:
        sub.add_parser("pretrain", help=PRETRAIN_HELP)


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    sv = sub.add_parser("serve", help="serve a model over HTTP (API, request batching, a page at /); the serve extra")
    sv.add_argument("model", help="model directory, run directory with best/, or export directory")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    sv.add_argument("--port", type=port_number, default=8000)
    sv.add_argument("--max-batch", type=positive_int, default=64,
                    help="texts per model call, gathered across requests (1: no batching)")
    sv.add_argument("--max-wait-ms", type=float, default=5.0, help="how long a call waits for more requests")
    sv.add_argument("--batch-size", type=positive_int, default=32,
                    help="texts per forward pass inside a call, of similar lengths (as zhie predict's)")
    sv.add_argument("--max-queue", type=positive_int, default=1024,
                    help="texts waiting for the model (503 with Retry-After above)")
    sv.add_argument("--timeout", type=float, default=30.0,
                    help="seconds a request may take (504 after; texts not yet run are dropped); 0: no limit")
    sv.add_argument("--max-texts", type=positive_int, default=256,
                    help="texts per request, pairs for /similarity (413 above)")
    sv.add_argument("--max-text-length", type=positive_int, default=10_000, help="characters per text (413 above)")
    sv.add_argument("--max-in-flight", type=positive_int, default=256,
                    help="requests in flight, /health and the page not counted (503 with Retry-After above)")
    key = sv.add_mutually_exclusive_group()
    key.add_argument("--api-key-file", default=None, metavar="FILE",
                     help="require 'Authorization: Bearer KEY' (all but /health, the page), KEY the file's first line; "
                          "default: $ZHIE_API_KEY if set")
    key.add_argument("--api-key", default=None, help="the key itself (visible in ps: prefer the file or ZHIE_API_KEY)")
    sv.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if there is one)")
    sv.add_argument("--precision", default="fp32", choices=PRECISIONS,
                    help="the encoder's precision (bf16/fp16 under autocast; decoding stays fp32)")


def port_number(value: str) -> int:
    """``--port``: a TCP port, 0 to 65535 (0: one the system picks)."""
    port = int(value)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {value}")
    return port


def _export_parser(sub: argparse._SubParsersAction) -> None:
    ex = sub.add_parser("export", help="export a model to ONNX (decoding stays outside the graph); the export extra")
    ex.add_argument("model", help="model directory (or a run directory with best/)")
    ex.add_argument("--out", required=True, help="export directory; zhie.load, predict and serve run it on onnxruntime")
    ex.add_argument("--opset", type=int, default=None,
                    help="ONNX opset (default 23, the first with ONNX's own Attention operator; onnxruntime >= 1.23)")
    ex.add_argument("--quantize", default=None, choices=["int8"],
                    help="int8 quantisation (dynamic: int8 weights, activations quantised per batch at run time)")
    ex.add_argument("--per-channel", action="store_true", help="int8: one scale per output channel of each weight")
    ex.add_argument("--reduce-range", action="store_true",
                    help="int8: 7-bit weights, which the int8 kernels of x86 CPUs without VNNI (AVX2) cannot "
                         "saturate; more accurate there (see export.json's int8_max_abs_diff)")
    ex.add_argument("--keep-fp32", action="append", default=[], metavar="PATTERN",
                    help="int8: weights whose name contains PATTERN stay fp32 (repeatable), e.g. 'embeddings' (the "
                         "embedding table) or 'layer.11.' (e5-small's last layer); the names are the torch model's "
                         "parameters (model.encoder.encoder.layer.0.attention.self.query.weight, ...)")
    ex.add_argument("--calibrate", default=None, metavar="FILE",
                    help="int8: static quantisation (uint8 activations too), their ranges measured on the texts of "
                         "FILE: one text per line, or JSON lines with a field 'text' (e.g. the training file)")
    ex.add_argument("--calibrate-lines", type=int, default=None, metavar="N",
                    help="read the first N texts of --calibrate FILE (default 200)")


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="train, evaluate and predict on a small corpus zhie writes itself")
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--encoder", default="e5-small")
    demo.add_argument("--head", default="gp", choices=["softmax", "crf", "gp", "egp"])
    demo.add_argument("--epochs", type=int, default=2)
    demo.add_argument("--quiet", action="store_true")


def _task_commands(sub: argparse._SubParsersAction, command: str | None) -> None:
    """The tasks' own commands (``Task.add_commands``): that of ``command`` from its task, the others of zhie's own
    tasks as their help line (:data:`zhie.tasks.COMMANDS`); every task's for a command zhie does not know (a task of
    an entry point's), or when ``command`` is None."""
    known = {*tasks.COMMANDS, "train", "eval", "predict", "serve", "export", "demo", "distill", "pretrain", ""}
    if command is None or command not in known:
        for cls in tasks.all_tasks():
            cls.add_commands(sub)
        return
    for name, (task, help) in tasks.COMMANDS.items():
        if name == command:
            tasks.get(task).add_commands(sub)
        else:
            sub.add_parser(name, help=help)


def cmd_train(args) -> None:
    import zhie
    from zhie.training import is_main_process
    from zhie.training.config import config_from_flags

    result = zhie.fit(args.task_class, getattr(args, "train", None), getattr(args, "dev", None), out=args.out,
                      encoder=args.encoder, keep_tokens=args.keep_tokens, encoder_layers=args.encoder_layers,
                      unshare_layers=args.unshare_layers, format=getattr(args, "format", "auto"),
                      config=config_from_flags(args), resume=not args.no_resume, progress=not args.quiet,
                      **{dest: getattr(args, dest) for dest in args.task_options})
    best = {"best": result["best"], "best_step": result.get("best_step"), "model": str(Path(args.out) / "best")}
    if is_main_process():  # under torchrun, once
        print(json.dumps(best, ensure_ascii=False))


def cmd_eval(args) -> None:
    import zhie

    for target in (args.json, args.errors):  # before the evaluation, which may take long
        if target:
            check_file_target(Path(target))
    pipe = zhie.load(args.model, device=args.device, precision=args.precision)
    if args.task is not None:
        pipe = pipe.member(args.task)
    examples = pipe.task.read(args.data, args.format)
    if args.errors:
        from zhie.deploy import error_report

        metrics, errors = error_report.evaluate(pipe, examples, batch_size=args.batch_size, max_tokens=args.max_tokens)
        error_report.write(args.errors, errors)
    else:
        metrics = pipe.evaluate(examples, batch_size=args.batch_size, max_tokens=args.max_tokens)
    print(pipe.task.report(metrics))
    if metrics.get("n_gold") == 0:  # scored, but against nothing: say why every score is 0
        print(f"zhie: warning: {args.data}: none of its {len(examples)} examples has a gold label, so every score is 0 "
              "(a test split without labels, or another task's file?)", file=sys.stderr)
    if args.errors:
        print(error_report.summary(errors, args.errors))
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(metrics, ensure_ascii=False, indent=2))


def cmd_predict(args) -> None:
    """``zhie predict``: JSON lines ``{"text", OUTPUT_KEY}``, one per input, in input order, streamed
    (:func:`write_outputs`); with ``--ray``, sharded over Ray Data workers (:mod:`zhie.deploy.ray_predict`)."""
    import zhie

    if args.ray and args.output_format != "zhie":
        raise ValueError(f"--output-format {args.output_format} is not written by --ray (its shards are zhie's JSON "
                         "lines); leave out one of them")
    if args.ray:
        if args.device is not None:
            raise ValueError(f"--device {args.device}: with --ray, Ray places each worker's model (a GPU each when "
                             "the cluster has GPUs, else the CPU); leave out --device")
        ray_predict = _extra("zhie.deploy.ray_predict", "ray")
        ray_predict.predict_files(args.model, args.input, args.output, address=args.ray_address,
                                  workers=args.ray_workers, cpus_per_worker=args.ray_cpus, precision=args.precision,
                                  batch_size=args.batch_size, max_tokens=args.max_tokens, rows=args.chunk_lines,
                                  skip_bad_lines=args.skip_bad_lines, input_format=args.input_format)
        return
    given = [flag for flag in ("ls_from_name", "ls_to_name", "ls_data_key", "ls_model_version")
             if getattr(args, flag) is not None]
    if given and args.output_format != "label-studio":
        raise ValueError(f"--{given[0].replace('_', '-')} names the Label Studio output: add --output-format "
                         "label-studio, or leave it out")
    if args.output:
        check_file_target(Path(args.output))
    pipe = zhie.load(args.model, device=args.device, precision=args.precision)
    if args.output_format == "label-studio" and pipe.task.output_key not in _label_studio().OUTPUT_KEYS:
        raise ValueError(f"{args.model} is a {pipe.task.name} model, whose predictions have no Label Studio form: "
                         "--output-format label-studio is for NER, word segmentation and relation models")
    write_outputs(args, pipe)


def cmd_task_command(args) -> None:
    """A task's own command over texts (``zhie segment``, ``zhie embed``; :class:`zhie.tasks.cli_flags.TextCommand`):
    load the model, check its task, and stream (:func:`write_outputs`)."""
    import zhie

    command = args.task_command
    if args.output:
        check_file_target(Path(args.output))
    pipe = zhie.load(args.model, device=args.device, precision=args.precision)
    if not isinstance(pipe.task, command.task):
        raise ValueError(f"{args.model} is a {pipe.task.name!r} model; `zhie {args.command}` needs a "
                         f"{command.task.name} model")
    write_outputs(args, pipe, command)


def write_outputs(args, pipe, command=None) -> None:
    """Stream the input of ``args`` (texts, then ``--input`` files: :class:`zhie.deploy.stream.TextReader`) through
    ``pipe.stream`` and write one output per input line, in order (:func:`output_line`), to stdout or ``--output``;
    the rows of an ``.npy`` file and its mask for a command with ``vectors`` and ``--output``."""
    reader = stream.TextReader(args.texts, args.input, skip_bad_lines=args.skip_bad_lines,
                               input_format=args.input_format, command=args.command)
    options = command.options(args) if command is not None and command.options is not None else {}
    results = stream.predicted(reader, lambda texts: pipe.stream(texts, batch_size=args.batch_size,
                                                                 max_tokens=args.max_tokens,
                                                                 chunk_size=args.chunk_lines, **options))
    if command is not None and command.vectors and args.output:
        rows = ((vector, line.error is None and bool(line.text.strip())) for line, vector in results)
        shape = stream.write_npy(args.output, rows, args.chunk_lines)
        print(f"{args.output}: {' x '.join(map(str, shape))} float32; {stream.mask_path(args.output)}: which rows "
              f"hold a text's vector (the others, of blank or skipped lines, are zeros)", file=sys.stderr)
    elif getattr(args, "output_format", "zhie") == "label-studio":  # a JSON list, not lines: Label Studio imports that
        stream.write_lines(args.output, label_studio_lines(args, pipe.task, results), args.chunk_lines)
    else:
        plain = command.plain if command is not None and command.plain is not None and not args.json else None
        record = output_record(pipe.task, getattr(args, "output_format", "zhie"))
        stream.write_lines(args.output, (output_line(pipe.task, line, p, plain, record) for line, p in results),
                           args.chunk_lines)
    reader.report()


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


def _label_studio():
    """:mod:`zhie.data.label_studio`, imported when asked for (it is not on the path of a plain ``zhie predict``)."""
    from zhie.data import label_studio

    return label_studio


def label_studio_lines(args, task, results) -> Iterator[str]:
    """``zhie predict --output-format label-studio``: a JSON list of Label Studio tasks, one a line and one per input
    line (the first line opens the list, one more closes it): the text and its prediction as a pre-annotation
    (:func:`zhie.data.label_studio.prediction_task`), or for a bad line skipped with ``--skip-bad-lines`` an empty
    text and in ``meta`` the file, line and error."""
    names = {"from_name": args.ls_from_name, "to_name": args.ls_to_name, "data_key": args.ls_data_key}
    label_studio = _label_studio()
    config = label_studio.LabelConfig(**{k: v for k, v in names.items() if v is not None})
    version = args.ls_model_version or label_studio.model_version(resolve_model_dir(args.model), task.name)
    opening = "["
    for line, prediction in results:
        if line.error is not None:
            item = {"data": {config.data_key: ""},
                    "meta": {"file": line.path, "line": line.number, "error": line.error}}
        else:
            result = label_studio.prediction_result(task.output_key, task.to_json(prediction), config)
            item = label_studio.prediction_task(line.text, result, version, config)
        yield opening + JSON_LINE.encode(item)
        opening = ","
    yield "]" if opening == "," else "[]"


def cmd_demo(args) -> None:
    import zhie
    from zhie import demo
    from zhie.data import read_ner
    from zhie.training import TrainConfig

    start = time.time()
    out = Path(args.out)
    train_file, dev_file = demo.write_corpus(out / "data")
    print(f"corpus: {train_file} and {dev_file} (written by zhie.demo, templates and made-up names)")
    config = TrainConfig(epochs=args.epochs, batch_size=16, lr=5e-5, head_lr=1e-3, seed=42)
    zhie.fit("ner", train_file, dev_file, out=out, encoder=args.encoder, head=args.head, config=config,
             resume=False, progress=not args.quiet)
    pipe = zhie.load(out / "best")
    print(f"\ndev set ({dev_file}):")
    print(pipe.task.report(pipe.evaluate(read_ner(dev_file))))
    print("\npredictions on new sentences:")
    for text, spans in zip(demo.SAMPLES, pipe.predict(demo.SAMPLES)):
        print(json.dumps({"text": text, "entities": [s.to_dict() for s in spans]}, ensure_ascii=False))
    print(f"\nmodel saved in {out / 'best'}, its model card in {out / 'best' / 'README.md'}, the training curves in "
          f"{out / 'training.png'}; done in {time.time() - start:.0f} s")


def _extra(module: str, extra: str):
    """Import ``module`` of an optional extra, or say which extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        extras = f"train,{extra}" if err.name in TORCH_MODULES else extra
        raise ValueError(f"this command needs {err.name}, which is not installed: "
                         f"pip install 'zhie[{extras}]'") from None


def cmd_serve(args) -> None:
    serve = _extra("zhie.deploy.serve", "serve")
    limits = serve.Limits(max_texts=args.max_texts, max_text_length=args.max_text_length,
                          max_in_flight=args.max_in_flight)
    batching = serve.Batching(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, batch_size=args.batch_size,
                              max_queue=args.max_queue, timeout=args.timeout or None)
    serve.serve(args.model, host=args.host, port=args.port, batching=batching, limits=limits,
                api_key=serve.read_api_key(args.api_key, args.api_key_file), device=args.device,
                precision=args.precision)


def cmd_export(args) -> None:
    export = _extra("zhie.deploy.export", "export")
    for module in ("onnxruntime", "onnxscript"):  # onnxscript: torch.onnx.export(dynamo=True) needs it
        _extra(module, "export")
    given = [flag for flag, value in (("--per-channel", args.per_channel), ("--reduce-range", args.reduce_range),
                                      ("--keep-fp32", args.keep_fp32), ("--calibrate", args.calibrate),
                                      ("--calibrate-lines", args.calibrate_lines is not None)) if value]
    if given and args.quantize != "int8":
        raise ValueError(f"{', '.join(given)} {'is an option' if len(given) == 1 else 'are options'} of int8 "
                         f"quantisation, and this export is fp32: add --quantize int8 (zhie export {args.model} "
                         f"--out {args.out} --quantize int8 {given[0]} ...)")
    if args.calibrate_lines is not None and not args.calibrate:
        raise ValueError("--calibrate-lines N counts the texts of --calibrate FILE: give --calibrate FILE too")
    calibration = None if args.calibrate is None else calibration_texts(args.calibrate, args.calibrate_lines or 200)
    out = export.export(args.model, args.out, opset=args.opset or export.DEFAULT_OPSET, quantize=args.quantize,
                        per_channel=args.per_channel, reduce_range=args.reduce_range, keep_fp32=args.keep_fp32,
                        calibration=calibration)
    record = json.loads((out / export.EXPORT_FILE).read_text(encoding="utf-8"))
    keys = ("opset", "quantize", "per_channel", "reduce_range", "keep_fp32", "calibration_texts", "fp32_max_abs_diff",
            "int8_max_abs_diff")
    print(json.dumps({"export": str(out), **{k: record[k] for k in keys if k in record}}, ensure_ascii=False))


def calibration_texts(path: str, n: int) -> list[str]:
    """The first ``n`` texts of ``zhie export --calibrate FILE`` (:func:`zhie.data.base.read_texts`' lines)."""
    from itertools import islice

    from zhie.data.base import iter_texts

    if n < 1:
        raise ValueError(f"--calibrate-lines {n}: give a positive number of texts (default 200)")
    if not Path(path).is_file():
        raise FileNotFoundError(f"--calibrate {path}: no such file; give a text file, one text per line (or JSON "
                                f"lines with a field 'text', e.g. the model's training file)")
    texts = list(islice((text for _, text in iter_texts(path) if text is not None), n))
    if not texts:
        raise ValueError(f"--calibrate {path}: the file has no text (blank lines are skipped); give a file of the "
                         f"texts the model will read, one per line")
    return texts


def cmd_distill(args) -> None:
    from zhie.training import distill

    distill.cmd_distill(args)


def cmd_pretrain(args) -> None:
    from zhie.training import pretrain

    pretrain.cmd_pretrain(args)


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "predict": cmd_predict, "demo": cmd_demo, "distill": cmd_distill,
            "pretrain": cmd_pretrain, "serve": cmd_serve, "export": cmd_export}
TORCH_MODULES = ("torch", "transformers", "accelerate")  # the train extra's; an export runs without them


def main(argv: list[str] | None = None) -> int:
    """The ``zhie`` command; its exit status: 0, 2 for bad input (one line ``zhie: error: ...``), 1 for an unexpected
    error (a bug), 130 when interrupted. ``--debug`` adds the traceback, and the library's debug messages."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))
    debug = bool({"--debug", "--verbose"} & set(argv[:command]))
    with show_logs(debug):
        try:
            argv = argv[:command] + expand_run_config(argv[command:])  # after zhie's own flags (--debug)
            args = build_parser(argv).parse_args(argv)
            handler = getattr(args, "handler", None)  # a task's own command that is not over texts
            (handler or (cmd_task_command if hasattr(args, "task_command") else COMMANDS[args.command]))(args)
        except KeyboardInterrupt:
            print("zhie: interrupted", file=sys.stderr)
            return 130
        except Exception as err:
            return report_error(err, debug)
    return 0


class _Lines(logging.Formatter):
    """The library's log records as the command shows them: information as it is, ``zhie: warning: ...``,
    ``zhie: error: ...``, ``zhie: debug: MODULE: ...``."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        if record.levelno >= logging.ERROR:
            return f"zhie: error: {message}"
        if record.levelno >= logging.WARNING:
            return f"zhie: warning: {message}"
        if record.levelno < logging.INFO:
            return f"zhie: debug: {record.name}: {message}"
        return message


@contextmanager
def show_logs(debug: bool) -> Iterator[None]:
    """What a person sees of the library's logging (the ``zhie`` logger) while a command runs: its information on
    stderr, and its debug messages with ``--debug``. Afterwards the logger is as it was (a program that calls
    :func:`main` keeps its own logging)."""
    logger, handler = logging.getLogger("zhie"), logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Lines())
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def report_error(err: Exception, debug: bool) -> int:
    """Say on stderr what stopped the command, in one line (with ``debug``, after the traceback); the exit status: 2
    for what the user can fix (bad input or files: ``ValueError``, which :class:`zhie.data.DataError` is, and
    ``OSError``; a missing extra; no memory left), 1 for anything else, which is a bug in zhie."""
    if debug:
        traceback.print_exception(type(err), err, err.__traceback__)
    if isinstance(err, ModuleNotFoundError) and err.name in TORCH_MODULES:
        message, code = (f"this needs {err.name}, which is not installed (the runtime extra runs exports only): "
                         f"pip install 'zhie[train]'"), 2
    elif isinstance(err, (ValueError, OSError)):
        message, code = error_message(err), 2
    elif type(err).__name__ == "OutOfMemoryError":  # torch's (CUDA, MPS, ...): a RuntimeError
        message, code = (f"out of memory ({str(err).splitlines()[0] if str(err) else 'no detail'}); use a smaller "
                         f"--batch-size or --max-tokens"), 2
    else:
        message = f"unexpected {type(err).__name__}: {err}. This is a bug in zhie; please report it" + (
            " with the traceback above" if debug else ", with the traceback that zhie --debug COMMAND ... prints")
        code = 1
    print(f"zhie: error: {message}", file=sys.stderr)
    return code


def error_message(err: Exception) -> str:
    """What ``zhie: error:`` says of ``err``: its message, or for the system's own error on a file ``FILE: reason``
    (``missing.json: No such file or directory``, without Python's ``[Errno 2]``)."""
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        return f"{err.filename}: {err.strerror}"
    return str(err)


if __name__ == "__main__":
    sys.exit(main())
