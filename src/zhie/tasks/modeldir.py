"""Model directories on disk: writing one (:func:`save_model_dir`), finding it (:func:`resolve_model_dir`), reading its
``zhie.json`` (:func:`read_meta`) and weights (:func:`load_weights`), and renaming the weights of an older format
(:func:`rename_weights`).

A model directory is HF-style: the encoder's ``config.json`` and weights as safetensors, the tokenizer's files,
``head.safetensors`` (every other weight), ``zhie.json`` (task, its configuration, model format, zhie version), the
task's own files, ``training.json`` and the model card ``README.md``. No torch here until a function writes or reads
weights.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from zhie.core import card
from zhie.core.files import replace_dir
from zhie.version import __version__

if TYPE_CHECKING:
    from torch import Tensor

    from zhie.model import Model

META_FILE = "zhie.json"
HEAD_FILE = "head.safetensors"
MODEL_FORMAT = 2  # 1: zhie 0.1.0 before the task protocol (one model class per task); 2: encoder + named heads


def save_model_dir(out: str | os.PathLike, model: Model, tokenizer, meta: dict,
                   files: Callable[[Path], None] | None = None, about: dict | None = None,
                   record: dict | None = None) -> Path:
    """Write ``model`` as an HF-style directory, atomically.

    The encoder's ``config.json`` + ``model.safetensors`` and the tokenizer files (so the directory is also a plain
    fine-tuned encoder for transformers), ``head.safetensors`` with every other weight (``heads.<name>.…``),
    ``zhie.json`` (task, its configuration, model format, zhie version), what ``files(directory)`` writes,
    ``training.json`` (``record``: how a training run made the model, :mod:`zhie.training.record`) when given, and
    the model card ``README.md`` made from them and the task's ``about`` (:meth:`Task.describe`; :mod:`zhie.core.card`).
    """
    from safetensors.torch import save_file

    from zhie.encoders import quiet_transformers

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        with quiet_transformers():
            model.encoder.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        head = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
                if not k.startswith("encoder.")}
        save_file(head, str(tmp / HEAD_FILE), metadata={"format": "pt"})
        meta_text = json.dumps({**meta, "format": MODEL_FORMAT, "zhie_version": __version__}, ensure_ascii=False,
                               indent=2)
        (tmp / META_FILE).write_text(meta_text, encoding="utf-8")
        if files is not None:
            files(tmp)
        if record is not None:
            (tmp / card.RECORD_FILE).write_text(json.dumps(record, ensure_ascii=False, indent=2), encoding="utf-8")
        (tmp / card.CARD_FILE).write_text(card.render(json.loads(meta_text), record, about), encoding="utf-8")

    replace_dir(out, write)
    return out


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """A model directory, or a training run directory whose ``best/`` holds one."""
    path = Path(path)
    if not (path / META_FILE).exists() and (path / "best" / META_FILE).exists():
        return path / "best"
    return path


def read_meta(path: str | os.PathLike) -> dict:
    file = resolve_model_dir(path) / META_FILE
    if not file.exists():
        raise FileNotFoundError(f"{path}: no {META_FILE}; is this a model directory written by `zhie train`?")
    damaged = "the model directory is damaged or was edited: copy it again, or train the model again"
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file}: not valid JSON ({err}); {damaged}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("task"), str):
        raise ValueError(f"{file}: expected a JSON object with the model's \"task\"; {damaged}")
    return meta


def load_weights(load_file: Callable[[str], dict], file: Path) -> dict:
    """``load_file(file)`` (safetensors' torch or numpy ``load_file``), with a clear error for a missing, truncated or
    damaged file."""
    from safetensors import SafetensorError

    again = "copy the model directory again, or train the model again"
    if not file.is_file():
        raise FileNotFoundError(f"{file}: missing from the model directory; {again}")
    try:
        return load_file(str(file))
    except SafetensorError as err:
        raise ValueError(f"{file}: cannot be read ({err}): the file is truncated or damaged; {again}") from None


def rename_weights(weights: dict[str, Tensor], renames: dict[str, str | None]) -> dict[str, Tensor]:
    """Weights with each name's prefix in ``renames`` replaced (``None``: the weight is dropped)."""
    out = {}
    for name, value in weights.items():
        prefix = next((p for p in renames if name.startswith(p)), None)
        if prefix is None:
            out[name] = value
        elif renames[prefix] is not None:
            out[renames[prefix] + name[len(prefix):]] = value
    return out

