"""A convolutional encoder (``model_type="zhie_conv"``): the small, fast, non-transformer student of distillation.

Iterated dilated convolutions as in the ID-CNN of Strubell et al. 2017 ("Fast and Accurate Entity Recognition with
Iterated Dilated Convolutions"): character embeddings (usually copied from the teacher, :func:`conv_student`), a
linear projection to ``hidden_size`` with LayerNorm and dropout, then ``num_hidden_layers`` blocks

    ``x <- LayerNorm(x + Dropout(act(Conv1d_d(x * mask))))``

(``residual="postnorm"``) or

    ``x <- x + a_i * Dropout(act(Conv1d_d(x * mask)))``, and one LayerNorm after the last block

(``residual="scaled"``: ``a_i`` a learnt scalar starting at 1; as in ReZero, Bachlechner et al. 2020, the blocks need
no normalisation of their own, but started at 0 as there, a short run learned less: 0.83 against 0.92 dev F1 on the
tests' tiny NER sample). Without a normalisation per block the int8 graph runs faster: in onnxruntime's int8 graph
the four fused Add + LayerNorm of the post-norm stack took about a third of the time (profiled on a 256-wide
student; ``benchmarks/RESULTS.md``, "Fast students"). Block ``i`` has the dilation ``dilations[i % len(dilations)]``
(``[1, 2, 4, 1]``: each token sees 17 characters after four blocks of kernel 3) and "same" zero padding. Padding
positions are zeroed before every convolution, so a right-padded row computes exactly what the row alone computes:
padding never leaks into real tokens. With ``bigram_buckets`` (``zhie distill --bigrams N``), each token
also adds the row of a second, learnt table for the pair it starts (itself and the next token; the last one, and one
before padding, pair with the padding id), hashed into ``bigram_buckets`` rows (:func:`bigram_ids`): character
bigrams, the classic lexical feature of Chinese character taggers, at the cost of one more gather. There
are no position embeddings (convolutions are local) and no attention: per token and block, one ``kernel_size x hidden x
hidden`` product, computed as one matrix product over the token's window (:class:`DilatedConv1d`), which ONNX int8
quantisation turns into a fast integer MatMul.

``ConvModel.forward(input_ids, attention_mask, output_hidden_states=False)`` returns a transformers
:class:`~transformers.modeling_outputs.BaseModelOutput` (``last_hidden_state [b, n, hidden_size]``; with
``output_hidden_states`` the projected embeddings, then each block's output), as a BERT does, so zhie's heads, saving
(``config.json`` + ``model.safetensors``), :func:`zhie.encoders.load_pretrained`, ``zhie export`` (fp32 and int8) take
it as any other encoder. Module names follow BERT's where there is one (``embeddings.word_embeddings``,
``encoder.layer.N``), so ``--keep-fp32 embeddings``, :func:`zhie.encoders.prune_vocab` and
:func:`zhie.encoders.truncate_layers` (a first N blocks) work on it too; keeping other blocks
(:func:`zhie.encoders.select_layers`) does not, since a block's dilation follows from its position.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutput

__all__ = ["RESIDUALS", "STUDENT_DILATIONS", "STUDENT_RESIDUAL", "ConvConfig", "ConvModel", "DilatedConv1d",
           "bigram_ids", "conv_student", "fold_embeddings"]

RESIDUALS = ("postnorm", "scaled")
STUDENT_RESIDUAL = "scaled"  # the block of a distilled student (conv_student): the faster one
STUDENT_DILATIONS = (1, 2, 4, 1)  # a distilled student's default: each token sees 17 characters after four blocks
BIGRAM_PRIME = 1_000_003  # above any vocabulary's size: (first * BIGRAM_PRIME + second) is one number per pair


class ConvConfig(PretrainedConfig):
    """The convolutional encoder's configuration (see the module docstring).

    ``embedding_size``: the width of the character embeddings (a teacher's hidden size, e.g. 384); ``hidden_size``:
    the convolutions' width; ``kernel_size``: odd; ``dilations``: a list cycled over the blocks, one int for all, or
    the text ``"1-2-4-1"`` (how a ``new:conv:dilations=1-2-4-1`` spec writes it); ``residual``: ``"postnorm"`` (a
LayerNorm after every block; the default, which a saved model without the field was trained with) or ``"scaled"``
(no normalisation per block, one at the end: see the module docstring); ``folded_embeddings``: the table's rows are
the embeddings' outputs already (projection and LayerNorm folded in by :func:`fold_embeddings`; ``embedding_size``
is then ``hidden_size``); ``bigram_buckets``: the rows of the bigram table (0: none; see the module docstring);
``max_position_embeddings`` is only
    informational (a convolution has no length limit; a tokenizer built for it takes it as its length).
    """

    model_type = "zhie_conv"

    def __init__(self, vocab_size: int = 21128, embedding_size: int = 384, hidden_size: int = 256,
                 num_hidden_layers: int = 4, kernel_size: int = 3, dilations: Sequence[int] | int | str = (1, 2, 4, 1),
                 hidden_act: str = "relu", hidden_dropout_prob: float = 0.1, layer_norm_eps: float = 1e-5,
                 initializer_range: float = 0.02, pad_token_id: int = 0, max_position_embeddings: int = 512,
                 residual: str = "postnorm", folded_embeddings: bool = False, bigram_buckets: int = 0,
                 **kwargs) -> None:
        kwargs.pop("attention_probs_dropout_prob", None)  # what new:conv:dropout=P also sets: there is no attention
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        if isinstance(dilations, str):
            dilations = [int(d) for d in dilations.replace(",", "-").split("-")]
        elif isinstance(dilations, int):
            dilations = [dilations]
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.kernel_size = kernel_size
        self.dilations = [int(d) for d in dilations]
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.max_position_embeddings = max_position_embeddings
        self.residual = residual
        self.folded_embeddings = folded_embeddings
        self.bigram_buckets = int(bigram_buckets)
        if self.bigram_buckets < 0:
            raise ValueError(f"bigram_buckets {bigram_buckets}: give 0 (no bigram table) or the table's rows, "
                             "e.g. 65536")
        if folded_embeddings and embedding_size != hidden_size:
            raise ValueError(f"folded_embeddings reads the table's rows as they are: embedding_size ({embedding_size}) "
                             f"must be hidden_size ({hidden_size})")
        if residual not in RESIDUALS:
            raise ValueError(f"residual {residual!r}: use one of {', '.join(RESIDUALS)}")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size {kernel_size}: use an odd size (3, 5, ...), so that a token's output is "
                             "centred on it")
        if not self.dilations or min(self.dilations) < 1:
            raise ValueError(f"dilations {dilations!r}: give one or more dilations of 1 or more, e.g. [1, 2, 4, 1]")
        if hidden_act not in ACT2FN:
            raise ValueError(f"unknown hidden_act {hidden_act!r}; use e.g. relu or gelu")

    def dilation(self, block: int) -> int:
        """The dilation of block ``block`` (0-based): :attr:`dilations` cycled."""
        return self.dilations[block % len(self.dilations)]


def bigram_ids(input_ids: Tensor, buckets: int, pad_id: int, mask: Tensor | None = None) -> Tensor:
    """``[b, n]`` token ids -> the row of the bigram each token starts: ``(id_t * BIGRAM_PRIME + id_{t+1}) % buckets``,
    where ``id_n`` and the ids under a zero ``mask`` (``[b, n]``, None: every token) read as the padding id: a
    right-padded row's tokens get the rows that the row alone gets."""
    ids = input_ids if mask is None else torch.where(mask.bool(), input_ids, pad_id)
    following = F.pad(ids[:, 1:], (0, 1), value=pad_id)
    return (ids * BIGRAM_PRIME + following) % buckets


class ConvEmbeddings(nn.Module):
    """Character embeddings, projected to ``hidden_size``, LayerNorm, dropout; with ``config.folded_embeddings`` the
    rows, then dropout (the projection and the LayerNorm are in the table: :func:`fold_embeddings`). With
    ``config.bigram_buckets``, the row of each token's bigram (:func:`bigram_ids`) is added before the dropout."""

    def __init__(self, config: ConvConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        if config.folded_embeddings:
            self.projection, self.LayerNorm = nn.Identity(), nn.Identity()  # noqa: N815 (BERT's name)
        else:
            self.projection = nn.Linear(config.embedding_size, config.hidden_size)
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # noqa: N815
        self.bigram_embeddings = (nn.Embedding(config.bigram_buckets, config.hidden_size) if config.bigram_buckets
                                  else None)
        self.pad_id = config.pad_token_id
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, mask: Tensor | None = None) -> Tensor:
        """``input_ids [b, n]``; ``mask [b, n]`` (1 = token; None: every one): what the bigrams read as padding."""
        x = self.LayerNorm(self.projection(self.word_embeddings(input_ids)))
        if self.bigram_embeddings is not None:
            rows = bigram_ids(input_ids, self.bigram_embeddings.num_embeddings, self.pad_id, mask)
            x = x + self.bigram_embeddings(rows)
        return self.dropout(x)


class DilatedConv1d(nn.Linear):
    """A dilated 1-d convolution along the sequence, ``[b, n, size] -> [b, n, size]``, with "same" zero padding, written
    as one matrix product over each token's window of ``kernel_size`` neighbours ``dilation`` apart (im2col):
    ``y_t = W [x_{t-rd}; ...; x_t; ...; x_{t+rd}] + b`` with ``r = (kernel_size - 1) / 2``.

    The same function as ``nn.Conv1d(size, size, kernel_size, dilation=dilation, padding=r * dilation)`` on
    ``x.transpose(1, 2)`` with ``conv.weight[o, c, j] == W[o, j * size + c]``, and the same initialisation (fan-in
    ``kernel_size * size``). Written as a matrix product for the int8 export: onnxruntime (1.32, x86) quantises a Conv
    into a ConvInteger that ran a 4-block stack of width 256 about 2.5x slower than its fp32 Conv, while this MatMul
    quantises into one that ran about 1.6x faster than the fp32 Conv (2 threads, measured ad hoc on a loaded CPU)."""

    def __init__(self, size: int, kernel_size: int, dilation: int) -> None:
        super().__init__(kernel_size * size, size)
        self.kernel_size, self.dilation = kernel_size, dilation

    def forward(self, x: Tensor) -> Tensor:
        n, reach = x.shape[1], self.dilation * (self.kernel_size - 1) // 2
        padded = F.pad(x, (0, 0, reach, reach))  # zeros before the first token and after the last
        window = torch.cat([padded[:, j * self.dilation:j * self.dilation + n] for j in range(self.kernel_size)], -1)
        return super().forward(window)


class ConvBlock(nn.Module):
    """``LayerNorm(x + Dropout(act(conv(x * mask))))`` (post-norm) or ``x + scale * Dropout(act(conv(x * mask)))``
    (scaled, ``scale`` starting at 1) with a :class:`DilatedConv1d`."""

    def __init__(self, config: ConvConfig, dilation: int) -> None:
        super().__init__()
        self.conv = DilatedConv1d(config.hidden_size, config.kernel_size, dilation)
        self.activation = ACT2FN[config.hidden_act]
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        if config.residual == "postnorm":
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # noqa: N815 (BERT's name)
        else:
            self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """``x [b, n, h]``, ``mask [b, n, 1]`` (1 for tokens, 0 for padding, x's dtype)."""
        update = self.dropout(self.activation(self.conv(x * mask)))
        return x + self.scale * update if hasattr(self, "scale") else self.LayerNorm(x + update)


class ConvModel(PreTrainedModel):
    """The convolutional encoder; ``forward`` as a transformers base model (see the module docstring)."""

    config_class = ConvConfig
    base_model_prefix = "zhie_conv"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False

    def __init__(self, config: ConvConfig) -> None:
        super().__init__(config)
        self.embeddings = ConvEmbeddings(config)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(ConvBlock(config, config.dilation(i))
                                           for i in range(config.num_hidden_layers))
        if config.residual == "scaled":  # the blocks add to an unnormalised stream: one norm at the end
            self.encoder.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # noqa: N815
        with torch.no_grad():  # as transformers initialises a BERT's: normal, the padding row zero
            nn.init.normal_(self.embeddings.word_embeddings.weight, std=config.initializer_range)
            if self.embeddings.bigram_embeddings is not None:
                nn.init.normal_(self.embeddings.bigram_embeddings.weight, std=config.initializer_range)
            if config.pad_token_id is not None:
                self.embeddings.word_embeddings.weight[config.pad_token_id].zero_()
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing: every weight is initialised when the model is built (the embeddings from a normal of
        ``initializer_range``; convolutions, projections and norms as torch initialises them), and loading from a
        checkpoint is strict, so no weight is ever left to initialise."""

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, output_hidden_states: bool = False,
                return_dict: bool = True, **_unused) -> BaseModelOutput:
        """``input_ids``, ``attention_mask`` ``[b, n]`` (None: every token that is not the padding id) -> the hidden
        states; other keyword arguments a BERT takes (``token_type_ids`` ...) are accepted and ignored."""
        valid = (input_ids != self.config.pad_token_id) if attention_mask is None else attention_mask
        x = self.embeddings(input_ids, valid)
        mask = valid.unsqueeze(-1).to(x.dtype)
        states = [x]
        for block in self.encoder.layer:
            x = block(x, mask)
            states.append(x)
        if self.config.residual == "scaled":
            x = states[-1] = self.encoder.LayerNorm(x)
        return BaseModelOutput(last_hidden_state=x, hidden_states=tuple(states) if output_hidden_states else None)


def conv_student(teacher_encoder: nn.Module, *, hidden_size: int = 256, layers: int = 4, kernel_size: int = 3,
                 dilations: Sequence[int] = STUDENT_DILATIONS, residual: str = STUDENT_RESIDUAL,
                 bigram_buckets: int = 0, seed: int = 0) -> ConvModel:
    """A fresh :class:`ConvModel` reading the teacher's tokens: its embedding table is a copy of the teacher's word
    embeddings (``teacher_encoder.get_input_embeddings().weight``: vocabulary and embedding width), its padding id the
    teacher's; ``residual`` and ``bigram_buckets`` as in :class:`ConvConfig`; every other weight is
    initialised from ``seed`` (the global random state is left as it was). The teacher's tokenizer is the student's."""
    table = teacher_encoder.get_input_embeddings().weight.detach()
    teacher = teacher_encoder.config
    pad = getattr(teacher, "pad_token_id", None)
    config = ConvConfig(vocab_size=table.shape[0], embedding_size=table.shape[1], hidden_size=hidden_size,
                        num_hidden_layers=layers, kernel_size=kernel_size, dilations=list(dilations),
                        residual=residual, bigram_buckets=bigram_buckets, pad_token_id=0 if pad is None else pad,
                        max_position_embeddings=getattr(teacher, "max_position_embeddings", 512))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        student = ConvModel(config)
    with torch.no_grad():
        student.get_input_embeddings().weight.copy_(table.to(student.dtype))
    return student


def fold_embeddings(model: ConvModel) -> ConvModel:
    """The same function with the embeddings folded into their table: a :class:`ConvModel` with
    ``folded_embeddings=True`` whose row ``i`` is ``LayerNorm(projection(word_embeddings[i]))`` (``hidden_size``
    wide; both act on one row at a time; a bigram table is added after them, so it stays as it is), every other
    weight the same, in eval mode (the embeddings' dropout then does
    nothing, as in prediction). Per token one row gather instead of a gather, an ``embedding_size x hidden_size``
    product (a fifth of a 4 x 128 student's multiply-adds) and a LayerNorm; ``zhie export`` writes a convolutional
    encoder this way. A folded model comes back as it is."""
    if model.config.folded_embeddings:
        return model
    config = ConvConfig.from_dict({**model.config.to_dict(), "embedding_size": model.config.hidden_size,
                                   "folded_embeddings": True})
    folded = ConvModel(config)
    state = {k: v for k, v in model.state_dict().items()
             if not k.startswith(("embeddings.projection.", "embeddings.LayerNorm."))}
    embeddings = model.embeddings
    with torch.no_grad():
        rows = embeddings.LayerNorm(embeddings.projection(embeddings.word_embeddings.weight))
    state["embeddings.word_embeddings.weight"] = rows
    folded.load_state_dict(state)
    return folded.eval()
