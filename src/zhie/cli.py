"""The ``zhie`` command: train, eval, predict, select, demo, serve, export, the training jobs (distill, pretrain), and
the tasks' own commands (segment, embed).

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
from zhie.core.options import Parser, add_config_flags, add_flags, option_fields, positive_int, values_from_flags  # noqa: E402
from zhie.data import FORMATS  # noqa: E402
from zhie.deploy import outputs, selection, stream  # noqa: E402
from zhie.tasks.cli_flags import add_batching_flags, add_prediction_flags  # noqa: E402
from zhie.tasks.modeldir import resolve_model_dir  # noqa: E402
from zhie.version import __version__  # noqa: E402


def _train_flags(p: argparse.ArgumentParser, data: bool = True, extends: bool = False) -> None:
    """``zhie train TASK``'s flags besides the task's own: :class:`~zhie.training.config.RunOptions`' (no --train,
    --dev, --format for a task whose own options name its data: multitask's --tasks) and
    :class:`~zhie.training.TrainConfig`'s, each with its help and default (:func:`zhie.core.options.add_flags`)."""
    from zhie.training.config import RunOptions, add_session_flags, add_train_flags

    names = [f.name for f in option_fields(RunOptions) if (data or f.name not in ("train", "dev", "format"))
             and (f.name not in ("from_model", "old_types") or extends)]  # zhie train ner's (zhie.training.extend)
    add_flags(p, RunOptions, names)
    for action in p._actions:  # given on the command line or by --config FILE
        action.required = action.dest in ("train", "dev", "out")
    p.add_argument("--mixed-precision", dest="precision", action=_MixedPrecision, choices=["no", "fp16", "bf16"],
                   default=argparse.SUPPRESS, help="deprecated: use --precision (no = fp32)")  # --precision's default
    add_session_flags(p)
    add_train_flags(p)  # TrainConfig's fields, each with its help and default (zhie.core.options.option)


class _MixedPrecision(argparse.Action):
    """The deprecated ``--mixed-precision no|fp16|bf16`` (accelerate's names): sets ``--precision``, with a warning."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        precision = "fp32" if value == "no" else value
        print(f"zhie: warning: --mixed-precision is deprecated; use --precision {precision}", file=sys.stderr)
        setattr(namespace, self.dest, precision)


TRAIN_HELP = "train a model"
# the help lines of the jobs' own parsers (zhie.training.students' and mtmt's, zhie.training.pretrain's)
DISTILL_HELP = ("distil a model: `student`, a smaller, faster student of a trained model; `mtmt`, the student of "
                "cross-lingual NER (spec 10.3)")
PRETRAIN_HELP = "masked-LM pre-training of an encoder on raw text (from scratch or continued)"


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``zhie`` parser: every command with its flags, or, given ``argv``, only the command it names with its flags
    and the others as one line of help (their modules, and the tasks', are not imported)."""
    command = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    parser = Parser(prog="zhie", description="Chinese information extraction in PyTorch.")
    parser.add_argument("--version", action="version", version=f"zhie {__version__}")
    parser.add_argument("--debug", "--verbose", action="store_true",
                        help="show the library's debug messages, and the traceback of an error (before the command: "
                             "zhie --debug train ...)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _train_parser(sub, command)
    _eval_parser(sub)
    _predict_parser(sub)
    selection.add_command(sub)
    _task_commands(sub, command)
    _job_parsers(sub, command)
    _serve_parser(sub, command)
    _export_parser(sub, command)
    _demo_parser(sub, command)
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
    _train_flags(p, cls.data_flags, extends=cls.name == "ner")
    group = p.add_argument_group(f"{cls.name} options")
    cls.add_arguments(group)
    p.set_defaults(task_class=cls, task_options=[action.dest for action in group._group_actions])
    from zhie.training import TrainConfig

    return add_config_flags(p, f"train {cls.name}", {"training": [f.name for f in option_fields(TrainConfig)],
                                                     cls.name: p.get_default("task_options")})


def expand_run_config(argv: list[str]) -> list[str]:
    """The command line ``argv`` (after zhie's own flags) with what the settings file stands for: ``zhie train --config
    FILE ...`` (no task: the task is the one FILE names, as a run directory's ``config.toml`` does) as ``zhie train
    TASK --config FILE ...``; and the older spellings, with a deprecation warning: ``zhie distill --teacher ...`` as
    ``zhie distill student``, ``zhie distill --recognizer ...`` as ``zhie distill mtmt``, and ``zhie train multitask
    --config MEMBERS`` (a file of ``[[tasks]]``) as ``--tasks MEMBERS``. Any other command line is returned as it is."""
    if argv[:2] == ["train", "--config"] and len(argv) >= 3:
        from zhie.core import config_file

        command, _ = config_file.read(argv[2])
        if command is None or not command.startswith("train "):
            raise ValueError(f'{argv[2]}: it names no task to train: add task = "ner" (one of '
                             f"{', '.join(c.name for c in tasks.all_tasks())}), or give it: zhie train TASK --config "
                             f"{argv[2]}")
        return ["train", command.split(" ", 1)[1], *argv[1:]]
    if argv[:1] == ["distill"] and len(argv) > 1 and argv[1].startswith("-") and argv[1] not in ("-h", "--help"):
        job = "mtmt" if {"--recognizer", "--evaluator", "--target"} & set(argv) else "student"
        _deprecated(f"zhie distill {argv[1]} ...", f"zhie distill {job} {argv[1]} ...")
        return ["distill", job, *argv[1:]]
    if argv[:2] == ["train", "multitask"] and "--config" in argv and "--tasks" not in argv:
        i = argv.index("--config") + 1
        if i < len(argv) and members_file(argv[i]):
            _deprecated("zhie train multitask --config MEMBERS", "zhie train multitask --tasks MEMBERS")
            return [*argv[:i - 1], "--tasks", *argv[i:]]
    return argv


def members_file(path: str) -> bool:
    """Whether ``path`` is a multi-task members file (a list of ``[[tasks]]``), not a job's settings."""
    from zhie.multitask.config import load_file

    try:
        return isinstance(load_file(Path(path)).get("tasks"), list)
    except ValueError:
        return False


def _deprecated(old: str, new: str) -> None:
    print(f"zhie: warning: `{old}` is deprecated; use `{new}`", file=sys.stderr)


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
    pr.add_argument("--output-format", default="zhie", choices=outputs.OUTPUT_FORMATS,
                    help="zhie: JSON lines {\"text\", OUTPUT_KEY}; doccano: doccano's JSON lines to import (NER: "
                         "{\"text\", \"label\"}; relations: {\"text\", \"entities\", \"relations\"}); label-studio: a "
                         "JSON list of Label Studio tasks to import, one per input line, the predictions as "
                         "pre-annotations (NER, word segmentation and relation models)")
    outputs.add_label_studio_flags(pr)
    ray = pr.add_argument_group("Ray Data (the ray extra): --input PATH(S) of JSONL/text/Parquet, --output DIRECTORY")
    ray.add_argument("--ray", action="store_true", help="predict with one model per Ray worker; sharded JSONL out")
    ray.add_argument("--ray-address", default=None, help="the cluster to join (default: RAY_ADDRESS, else a local one)")
    ray.add_argument("--ray-workers", type=positive_int, default=None,
                     help="model replicas (default: the cluster's GPUs, else 1)")
    ray.add_argument("--ray-cpus", type=float, default=1.0,
                     help="CPUs per worker (an export splits its batches over that many, at least one)")


def _job_parsers(sub: argparse._SubParsersAction, command: str | None) -> None:
    """The training jobs besides ``zhie train`` (``distill student``, ``distill mtmt``, ``pretrain``): their parsers,
    from their modules (which import torch), only when asked."""
    distill = sub.add_parser("distill", help=DISTILL_HELP)
    if command in (None, "distill"):
        from zhie.training import mtmt, students

        jobs = distill.add_subparsers(dest="job", required=True, metavar="JOB")
        students.add_command(jobs)
        mtmt.add_command(jobs)
    if command in (None, "pretrain"):
        from zhie.training import pretrain

        pretrain.add_command(sub)
    else:
        sub.add_parser("pretrain", help=PRETRAIN_HELP)


def _serve_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    sv = sub.add_parser("serve", help="serve a model over HTTP (API, request batching, a page at /); the serve extra")
    if command not in (None, "serve"):
        return
    serve = _extra("zhie.deploy.serve", "serve")
    sv.add_argument("model", help="model directory, run directory with best/, or export directory")
    add_flags(sv, serve.ServeOptions)
    add_flags(sv.add_argument_group("request batching"), serve.Batching)
    add_flags(sv.add_argument_group("limits"), serve.Limits)
    add_flags(sv.add_argument_group("new versions from Label Studio (a NER model)"), serve.Retraining)
    add_config_flags(sv, "serve")


def _export_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    ex = sub.add_parser("export", help="export a model to ONNX (decoding stays outside the graph); the export extra")
    if command not in (None, "export"):
        return
    export = _extra("zhie.deploy.export", "export")
    ex.add_argument("model", help="model directory (or a run directory with best/)")
    add_flags(ex, export.ExportOptions)
    add_config_flags(ex, "export")


def _demo_parser(sub: argparse._SubParsersAction, command: str | None) -> None:
    demo = sub.add_parser("demo", help="train, evaluate and predict on a small corpus zhie writes itself")
    if command not in (None, "demo"):
        return
    from zhie.training.config import RunOptions

    demo.add_argument("--out", default="runs/demo",
                      help="the run directory: its corpus in OUT/data, the model in OUT/best (default: %(default)s)")
    demo.add_argument("--encoder", default=RunOptions.encoder, help=f"(default: {RunOptions.encoder})")
    demo.add_argument("--head", default="gp", choices=["softmax", "crf", "gp", "egp"],
                      help="the NER head (default: %(default)s)")
    demo.add_argument("--epochs", type=int, default=2, help="training epochs (default: %(default)s)")
    demo.add_argument("--quiet", action="store_true", help="no progress bars")


def _task_commands(sub: argparse._SubParsersAction, command: str | None) -> None:
    """The tasks' own commands (``Task.add_commands``): that of ``command`` from its task, the others of zhie's own
    tasks as their help line (:data:`zhie.tasks.COMMANDS`); every task's for a command zhie does not know (a task of
    an entry point's), or when ``command`` is None."""
    known = {*tasks.COMMANDS, "train", "eval", "predict", "select", "serve", "export", "demo", "distill", "pretrain",
             ""}
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
    from zhie.training.config import RunOptions, config_from_flags

    return zhie.fit(args.task_class, getattr(args, "train", None), getattr(args, "dev", None), out=args.out,
                    encoder=args.encoder, keep_tokens=args.keep_tokens, encoder_layers=args.encoder_layers,
                    unshare_layers=args.unshare_layers, format=getattr(args, "format", "auto"),
                    from_model=getattr(args, "from_model", None),
                    old_types=getattr(args, "old_types", RunOptions.old_types), config=config_from_flags(args),
                    resume=not args.no_resume, progress=not args.quiet,
                    **{dest: getattr(args, dest) for dest in args.task_options})


def report_run(args, result: dict) -> None:
    """What a training job's command says at its end (once, under torchrun): the best evaluation and where the model
    is, as one JSON line; and, when the job found its run directory finished and trained nothing, how to train it
    again (a rerun is never a silent no-op)."""
    from zhie.dist import is_main_process

    if not is_main_process():
        return
    print(json.dumps({"best": result["best"], "best_step": result.get("best_step"),
                      "model": str(Path(args.out) / "best")}, ensure_ascii=False))
    if not result.get("session_steps"):
        print(f"zhie: warning: {args.out} holds a finished run of this configuration, so nothing was trained; to "
              f"train it again, give a new run directory (--out NEW) or start this one afresh (--no-resume)",
              file=sys.stderr)


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

        with stream.collector_paused():
            metrics, errors = error_report.evaluate(pipe, examples, batch_size=args.batch_size,
                                                    max_tokens=args.max_tokens)
        error_report.write(args.errors, errors)
    else:
        with stream.collector_paused():
            metrics = pipe.evaluate(examples, batch_size=args.batch_size, max_tokens=args.max_tokens)
    print(pipe.task.report(metrics))
    if metrics.get("n_gold") == 0:  # scored, but against nothing: say why every score is 0
        print(f"zhie: warning: {args.data}: none of its {len(examples)} examples has a gold label, so every score is 0 "
              "(a test split without labels, or another task's file?)", file=sys.stderr)
    unknown = pipe.task.unknown_labels(examples)
    if unknown:  # scored as missed, whatever the model does: another schema's file, or a model of fewer types?
        listed = ", ".join(f"{label} ({n})" for label, n in unknown.most_common())
        print(f"zhie: warning: {args.data}: {sum(unknown.values())} gold label(s) of type(s) the model does not "
              f"predict, each counted as missed: {listed}; the model's own are in its zhie.json (a file of another "
              "schema?)", file=sys.stderr)
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
    outputs.label_studio_names(args)  # the --ls-* flags only with --output-format label-studio
    if args.output:
        check_file_target(Path(args.output))
    pipe = zhie.load(args.model, device=args.device, precision=args.precision)
    if args.output_format == "label-studio" and pipe.task.output_key not in outputs.label_studio().OUTPUT_KEYS:
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
    the rows of an ``.npy`` file and its mask for a command with ``vectors`` and ``--output``; with the garbage
    collector paused (:func:`zhie.deploy.stream.collector_paused`: this process does nothing else)."""
    with stream.collector_paused():
        _write_outputs(args, pipe, command)


def _write_outputs(args, pipe, command) -> None:
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
        names = {"from_name": args.ls_from_name, "to_name": args.ls_to_name, "data_key": args.ls_data_key}
        version = args.ls_model_version or outputs.label_studio().model_version(resolve_model_dir(args.model),
                                                                               pipe.task.name)
        stream.write_lines(args.output, outputs.label_studio_lines(names, version, pipe.task, results),
                           args.chunk_lines)
    else:
        plain = command.plain if command is not None and command.plain is not None and not args.json else None
        record = outputs.output_record(pipe.task, getattr(args, "output_format", "zhie"))
        stream.write_lines(args.output, (outputs.output_line(pipe.task, line, p, plain, record)
                                         for line, p in results), args.chunk_lines)
    reader.report()


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
    if args.api_key is not None and args.api_key_file is not None:
        raise ValueError("give the key once: --api-key-file FILE or --api-key KEY, not both")
    serve.serve(args.model, host=args.host, port=args.port, batching=serve.Batching(**values_from_flags(
                    args, serve.Batching)), limits=serve.Limits(**values_from_flags(args, serve.Limits)),
                api_key=serve.read_api_key(args.api_key, args.api_key_file), device=args.device,
                precision=args.precision, max_connections=args.max_connections, access_log=args.access_log,
                retraining=serve.Retraining(**values_from_flags(args, serve.Retraining)))


def cmd_export(args) -> None:
    export = _extra("zhie.deploy.export", "export")
    for module in ("onnxruntime", "onnxscript"):  # onnxscript: torch.onnx.export(dynamo=True) needs it
        _extra(module, "export")
    given = [flag for flag, value in (("--per-channel", args.per_channel), ("--reduce-range", args.reduce_range),
                                      ("--keep-fp32", args.keep_fp32), ("--calibrate", args.calibrate),
                                      ("--calibrate-lines", args.calibrate_lines is not None),
                                      ("--batch-scales", args.batch_scales)) if value]
    if given and args.quantize != "int8":
        raise ValueError(f"{', '.join(given)} {'is an option' if len(given) == 1 else 'are options'} of int8 "
                         f"quantisation, and this export is fp32: add --quantize int8 (zhie export {args.model} "
                         f"--out {args.out} --quantize int8 {given[0]} ...)")
    if args.calibrate_lines is not None and not args.calibrate:
        raise ValueError("--calibrate-lines N counts the texts of --calibrate FILE: give --calibrate FILE too")
    calibration = None if args.calibrate is None else export.calibration_texts(
        args.calibrate, export.CALIBRATION_TEXTS if args.calibrate_lines is None else args.calibrate_lines)
    out = export.export(args.model, args.out, opset=args.opset, quantize=args.quantize,
                        per_channel=args.per_channel, reduce_range=args.reduce_range, keep_fp32=args.keep_fp32,
                        calibration=calibration, batch_scales=args.batch_scales)
    record = json.loads((out / export.EXPORT_FILE).read_text(encoding="utf-8"))
    keys = ("opset", "quantize", "per_channel", "reduce_range", "keep_fp32", "calibration_texts", "int8_activations",
            "fp32_max_abs_diff", "int8_max_abs_diff")
    print(json.dumps({"export": str(out), **{k: record[k] for k in keys if k in record}}, ensure_ascii=False))


def cmd_pretrain(args) -> None:
    from zhie.training import pretrain

    pretrain.cmd_pretrain(args)


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "predict": cmd_predict, "demo": cmd_demo, "pretrain": cmd_pretrain,
            "serve": cmd_serve, "export": cmd_export}
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
            parser = build_parser(argv)
            args = parser.parse_args(argv)
            if getattr(args, "print_config", False):
                print_config(args)
                return 0
            handler = getattr(args, "handler", None)  # a job's or a task's own command
            result = (handler or (cmd_task_command if hasattr(args, "task_command") else COMMANDS[args.command]))(args)
            if isinstance(result, dict) and "session_steps" in result:  # a training job's summary
                report_run(args, result)
        except KeyboardInterrupt:
            print("zhie: interrupted", file=sys.stderr)
            return 130
        except Exception as err:
            return report_error(err, debug)
    return 0


def print_config(args) -> None:
    """``--print-config``: the job's settings in ``args`` as its configuration file (:mod:`zhie.core.config_file`),
    in the tables its parser names (TrainConfig's in ``[training]``, a task's own in a table of its name)."""
    from zhie.core import config_file

    parser = args.job_parser
    settings = parser.settings(args)
    tables = {name: {dest: settings.pop(dest) for dest in dests if dest in settings}
              for name, dests in parser.tables.items()}
    header = f"# zhie {parser.job}: every setting; run it with zhie {parser.job} --config FILE\n"
    print(config_file.dumps(parser.job, settings, {name: table for name, table in tables.items() if table}, None,
                            header), end="")


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
