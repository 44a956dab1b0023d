"""The student of ``zhie distill student`` before it trains: which of the teacher's layers a cut student keeps
(:func:`student_layers`), the options that each kind takes (:func:`check_student`), and the student model of each
kind (:data:`STUDENTS`, :func:`student_model`): the teacher cut to fewer (and narrower) layers, a convolutional or a
narrower transformer encoder over the teacher's embeddings (:func:`narrow_student`), or the teacher's architecture
started again from the encoder it was fine-tuned from (:func:`fresh_encoder`); with the teacher's heads, or another
head of the same output type (:func:`other_head`)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import torch
from torch import Tensor, nn

from zhie import encoders
from zhie.encoders import student_bert
from zhie.encoders.conv import STUDENT_DILATIONS, ConvConfig
from zhie.model import Model
from zhie.tasks.batching import seeded

__all__ = ["STUDENTS", "check_student", "other_head", "student_layers", "student_model"]

STUDENTS = ("cut", "conv", "narrow", "fresh")


def student_layers(keep: str, layers: int | None, total: int) -> list[int]:
    """The teacher layers a student keeps: ``keep`` is ``"first"`` (the first ``layers``), ``"spread"`` (``layers``
    evenly spaced, ending with the last: 12 -> 4 keeps 2, 5, 8, 11) or comma-separated indices (then ``layers`` must
    be None or their number)."""
    if keep not in ("first", "spread"):
        try:
            chosen = [int(x) for x in keep.split(",")]
        except ValueError:
            raise ValueError(f"--keep-layers {keep!r}: use first, spread or comma-separated layer indices") from None
        if layers is not None and layers != len(chosen):
            raise ValueError(f"--keep-layers names {len(chosen)} layers but --encoder-layers says {layers}")
        return chosen
    if layers is None:
        raise ValueError(f"--keep-layers {keep} needs --encoder-layers N (how many of the teacher's {total} to keep)")
    if not 1 <= layers <= total:
        raise ValueError(f"--encoder-layers {layers}: the teacher has {total} layers; keep 1 to {total}")
    if keep == "first":
        return list(range(layers))
    return [round((i + 1) * total / layers) - 1 for i in range(layers)]


def check_student(encoder: nn.Module, student: str, *, keep_layers: str, encoder_layers: int | None, width: int,
                  ffn_width: int | None, attention_heads: int | None, dilations: list[int] | None,
                  bigrams: int) -> tuple[list[int] | None, list[int]]:
    """The options of a ``student`` of the teacher's ``encoder`` (an ensemble's first), checked before the teachers'
    pass, not after it: each option is refused where the student kind does not take it, and each kind's settings
    where that kind cannot be built with them. Returns the kept layers of a cut student (:func:`student_layers`;
    None for the other kinds) and a convolutional student's dilations (default
    :data:`zhie.encoders.conv.STUDENT_DILATIONS`)."""
    total = encoder.config.num_hidden_layers
    if student not in STUDENTS:
        raise ValueError(f"--student {student}: choose one of {', '.join(STUDENTS)}")
    kept = student_layers(keep_layers, encoder_layers, total) if student == "cut" else None
    if student == "fresh" and encoder_layers not in (None, total):
        raise ValueError(f"--student fresh keeps the teacher's architecture ({total} layers); leave out "
                         f"--encoder-layers {encoder_layers}, or use --student cut for fewer layers")
    if ffn_width is not None and student != "cut":
        raise ValueError("--ffn-width narrows the teacher's layers: it is for --student cut (a conv student's width "
                         "is --width)")
    if attention_heads is not None and student != "cut":
        raise ValueError("--attention-heads narrows the teacher's layers: it is for --student cut")
    if dilations is not None and student != "conv":
        raise ValueError("--dilations sets a convolutional student's blocks: it is for --student conv")
    if bigrams and student not in ("conv", "cut"):
        raise ValueError("--bigrams adds a table of character bigrams to a convolutional or a cut student: it is for "
                         "--student conv or --student cut")
    dilations = list(STUDENT_DILATIONS if dilations is None else dilations)
    if student == "conv":
        ConvConfig(dilations=dilations, bigram_buckets=bigrams)
    elif student == "narrow":
        narrow_config(encoder, width, encoder_layers or 4)
    elif student == "cut" and (bigrams or attention_heads is not None):
        student_bert.check_student_bert(encoder, bigrams, attention_heads)
    if ffn_width is not None:
        encoders.ffn_layers(encoder)  # a clear error for an encoder without them
    return kept, dilations


HEAD_FAMILIES = ({"gp", "egp"}, {"crf", "softmax"})  # heads of one output type: span logits, tag emissions


def other_head(task, head: str, directory: Path):
    """The teacher's ``task`` with the head ``head`` instead of its own, which must give the same output type (the
    student learns from the teacher's outputs); its files (a segmenter's vocabulary) read from ``directory``. The
    student's head of that kind starts afresh (:func:`student_model`)."""
    own = task.config.head
    if not any({own, head} <= family for family in HEAD_FAMILIES):
        raise ValueError(f"--head {head}: a student of a {own} teacher takes a head of the same output type "
                         f"({' or '.join(sorted(next(f for f in HEAD_FAMILIES if own in f)))})")
    other = type(task)(dataclasses.replace(task.config, head=head), task.tokenizer)
    other.load_files(directory)
    return other


def student_model(teacher: Model, task, kind: str, kept: list[int] | None, blocks: int, width: int,
                  seed: int, ffn: tuple[int, list[Tensor]] | None = None,
                  dilations: list[int] | tuple[int, ...] = STUDENT_DILATIONS, origin: str | None = None,
                  bigrams: int = 0, attention: tuple[int, list[Tensor]] | None = None,
                  fresh_head: bool = False) -> Model:
    """The student before training: ``"cut"``, a copy of ``teacher`` with only the encoder layers ``kept`` (their
    feed-forward blocks narrowed by ``ffn``, ``(width, each kept layer's activity)``, :func:`zhie.encoders.prune_ffn`;
    with ``bigrams`` rows of hashed bigrams, zeros at first, and the attention heads of ``attention``, ``(count, each
    kept layer's head activity)``, :func:`zhie.encoders.student_bert.student_bert`) and the teacher's heads (with
    ``fresh_head``, the task's fresh heads instead: another head kind than the teacher's); ``"conv"``, a
    convolutional encoder of ``blocks`` blocks of ``width`` and ``dilations``, with ``bigrams`` rows of hashed bigrams
    (:func:`zhie.encoders.conv.conv_student`: the teacher's embedding table, the rest initialised from ``seed``) with
    the task's fresh heads of that width; ``"narrow"``, :func:`narrow_student` of ``blocks`` layers of ``width`` with
    the task's fresh heads of that width; ``"fresh"``, :func:`fresh_encoder` of the teacher's encoder and ``origin``
    (the encoder the teacher was fine-tuned from) with the task's fresh heads."""
    if kind == "cut":
        encoder = encoders.select_layers(copy.deepcopy(teacher.encoder), kept)
        if ffn is not None:
            encoders.prune_ffn(encoder, *ffn)
        if bigrams or attention is not None:
            encoder = student_bert.student_bert(encoder, bigrams, attention)
        if not fresh_head:
            return Model(encoder, copy.deepcopy(dict(teacher.heads.items()))).cpu().train()
    elif kind == "conv":
        from zhie.encoders.conv import conv_student

        encoder = conv_student(teacher.encoder, hidden_size=width, layers=blocks, dilations=dilations,
                               bigram_buckets=bigrams, seed=seed)
    elif kind == "narrow":
        encoder = narrow_student(teacher.encoder, width, blocks, seed)
    else:
        encoder = fresh_encoder(teacher.encoder, task.tokenizer, origin, seed)
    with seeded(seed):
        model = Model(encoder, task.build_heads(encoder.config.hidden_size))
    return model.cpu().train()


def narrow_student(teacher_encoder: nn.Module, width: int, layers: int, seed: int) -> nn.Module:
    """A transformer narrower than the teacher over the teacher's own embeddings: ALBERT's layout with nothing shared
    (``num_hidden_groups`` = ``layers``), whose embeddings (words, positions, token types and their LayerNorm, of the
    teacher's width) are copies of the teacher's, so that its first activations are the teacher's, followed by a learnt
    projection to ``width`` and ``layers`` transformer layers of ``width`` (heads of 64, feed-forward 4 × ``width``,
    the teacher's activation), initialised from ``seed``. Only BERT-like teachers have such embeddings (e5-small and
    ``tiny``); others are refused."""
    student = encoders.build(narrow_config(teacher_encoder, width, layers), seed=seed)
    with torch.no_grad():
        for name in NARROW_COPIED:
            getattr(student.embeddings, name).load_state_dict(getattr(teacher_encoder.embeddings, name).state_dict())
    return student


NARROW_COPIED = ("word_embeddings", "position_embeddings", "token_type_embeddings", "LayerNorm")


def narrow_config(teacher_encoder: nn.Module, width: int, layers: int):
    """The ALBERT configuration of :func:`narrow_student`; a clear error for a teacher that is not BERT-like or a
    ``width`` that is not a positive multiple of 64."""
    from transformers import AlbertConfig

    teacher = teacher_encoder.config
    emb = getattr(teacher_encoder, "embeddings", None)
    if emb is None or not all(hasattr(emb, name) for name in NARROW_COPIED) or teacher.model_type != "bert":
        raise ValueError(f"--student narrow copies a BERT-like teacher's embeddings (words, positions, token types); "
                         f"this teacher's encoder is {teacher.model_type!r}: use --student conv")
    if width % 64 or width <= 0:
        raise ValueError(f"--width {width}: a narrow student's width is a multiple of 64 (its attention heads are 64 "
                         "wide)")
    return AlbertConfig(vocab_size=teacher.vocab_size, embedding_size=teacher.hidden_size, hidden_size=width,
                        num_hidden_layers=layers, num_hidden_groups=layers, num_attention_heads=width // 64,
                        intermediate_size=4 * width, inner_group_num=1, hidden_act=teacher.hidden_act,
                        hidden_dropout_prob=teacher.hidden_dropout_prob,
                        attention_probs_dropout_prob=teacher.attention_probs_dropout_prob,
                        max_position_embeddings=teacher.max_position_embeddings,
                        type_vocab_size=teacher.type_vocab_size, layer_norm_eps=teacher.layer_norm_eps,
                        pad_token_id=teacher.pad_token_id)


def teacher_origin(directory: Path) -> str:
    """The encoder the model in ``directory`` was fine-tuned from (its ``training.json``'s ``encoder``)."""
    try:
        return json.loads((directory / "training.json").read_text(encoding="utf-8"))["encoder"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"{directory}: no training.json naming the encoder it was trained from; --student fresh "
                         "starts again from that encoder, so it needs a model that zhie trained") from None


def fresh_encoder(teacher_encoder: nn.Module, tokenizer, origin: str | None, seed: int) -> nn.Module:
    """The teacher's encoder as it was before its training (a born-again student's): the pre-trained encoder
    ``origin`` (the teacher's ``training.json`` ``encoder``, e.g. ``e5-small``) with its vocabulary cut to the
    teacher's tokens (``tokenizer``'s, in its order) and its first ``num_hidden_layers`` layers; when the teacher
    was trained from a random encoder (``tiny``, ``new:...``, or ``origin`` None), the teacher's architecture
    initialised anew from ``seed``."""
    layers = teacher_encoder.config.num_hidden_layers
    if origin is None or encoders.is_random(origin):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return type(teacher_encoder)(copy.deepcopy(teacher_encoder.config))
    model, full = encoders.load(origin)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    ids = full.convert_tokens_to_ids(tokens)
    unknown = [t for t, i in zip(tokens, ids) if i is None or (i == full.unk_token_id and t != full.unk_token)]
    if unknown:
        raise ValueError(f"the teacher's tokens {unknown[:5]} are not in {origin}'s vocabulary: it was not fine-tuned "
                         f"from {origin}, so --student fresh cannot start again from it")
    model, pruned = encoders.prune_vocab(model, full, ids)
    if pruned.convert_ids_to_tokens(list(range(len(pruned)))) != tokens:
        raise ValueError(f"{origin}'s vocabulary cut to the teacher's tokens does not give the teacher's token ids; "
                         "--student fresh needs the teacher's vocabulary to be a cut of its encoder's")
    if model.config.num_hidden_layers != layers:
        encoders.truncate_layers(model, layers)
    return model

