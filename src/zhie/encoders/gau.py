"""zhie's own encoders: RoFormerV2 and GAU-α (spec §6, §11.2), with FLASH (§6.1) and DeepNorm (§7) as options.

Over 400 lines: one model family, as a transformers modeling file is (the two share their config, embeddings, norm,
initialisation, DeepNorm and encoder class).

Both share the RoFormerV2 skeleton: token + segment embeddings (no absolute positions), RoPE (interleaved,
spec §0.1) inside every attention, **no biases** (``use_bias=False``), **post-norm** with an RMS norm that has no
gain and no offset, ``x <- Norm(alpha * x + Dropout(F(x)))`` (alpha = 1 unless DeepNorm). They differ in F:

* :class:`RoFormerV2Model` (``model_type="roformer_v2"``): per block, multi-head attention then a feed-forward
  layer (two post-norm residual branches; torch's SDPA kernels do the attention).
* :class:`GAUAlphaModel` (``model_type="gau_alpha"``): per layer one gated attention unit (spec §6.1-6.2),
  ``U, V, Z = swish(X W_i)``, ``Q, K = Z*gamma_q (+beta_q), Z*gamma_k (+beta_k)``, RoPE on Q and K,
  ``O = (U * (A V)) W_o`` where ``A`` is one of ``normalization``:

  - ``squared_relu``: ``relu(QK^T / sqrt(s))^2 / l`` (FLASH's), ``l`` = number of valid (unpadded) keys;
  - ``softmax``: ``softmax(QK^T / sqrt(s))`` (through torch's SDPA kernels, as ``softmax_plus``);
  - ``softmax_plus`` (GAU-α's, entropy-invariant): ``softmax(QK^T / sqrt(s) * log(l) / log(512))``. bert4keras
    counts ``l`` as the valid keys since 2022-04 and clamps it to ``l >= 16`` since 2023-03-09 ("too-short
    sequences should not be down-scaled"); ``softmax_plus_min_length`` (default 16, the 2023 behaviour) sets
    the clamp, 1 gives the April-2022 code that the released GAU-α weights and the ``gau-alpha`` port use.

  ``attention="flash"`` is FLASH's linear-time mode (spec §6.1) for long inputs: the sequence is cut into chunks
  of ``chunk_size`` tokens; inside a chunk the quadratic ``relu^2(Q K^T)/(c s)``, across chunks the (non-causal)
  linear attention ``Q_lin (sum_h K_lin_h^T V_h) / l``; four scale/offset heads from Z (``q_scaleoffset`` and
  ``k_scaleoffset`` for the quadratic part, ``lin_q_scaleoffset`` and ``lin_k_scaleoffset`` for the linear one).
  Memory and time grow linearly with the length, so a 10k-character document is one pass instead of windows.

GAU-α's module names are the ``gau-alpha`` port's (``encoder.layer.{i}.gau.i_dense`` ...), so the released
PyTorch checkpoint (``chinese_GAU-alpha-char_L-24_H-768``, ``model_type="gau_alpha"``) loads as it is; RoFormerV2
uses HF RoFormer's layer names. Both are ``PreTrainedModel``s: ``save_pretrained`` writes ``config.json`` and
safetensors, and :func:`zhie.encoders.load` dispatches on ``model_type``.

**Initialisation** (``initializer="su"``, spec §6.3): truncated normal (at two std) with
``std = 1.13684723 / sqrt(fan) * N^(-1/order)``, ``fan`` = input size (for an embedding matrix of shape
``[rows, dim]``: ``dim`` if ``rows > 10000`` or ``rows < 10``, else ``rows``, bert4keras' rule), ``N`` = number of
layers, ``order`` 2 for RoFormerV2 and 3 for GAU-α. ``initializer="xavier"``: Xavier-normal weights, as DeepNet
and the "does GAU need warm-up" study (§6.4) start from. Scale/offset gains start at 1, offsets at 0.

**DeepNorm** (``deepnorm="paper"`` or ``"adam"``, spec §7): the residual becomes ``Norm(alpha * x + F(x))`` and
the value, output and feed-forward projections (for a GAU: the U and V rows of ``i_dense`` and ``o_dense``; the
query/key part Z keeps gain 1) are multiplied by ``beta`` after initialisation. :func:`deepnorm_constants`: the
paper's encoder-only constants ``alpha = (2N)^(1/4)``, ``beta = (8N)^(-1/4)`` (torchscale's), or Su's for Adam
``alpha = (2N)^(1/2)``, ``beta = (2N)^(-1/2)`` (spec §7.2 table). N counts attention+FFN blocks (2N residual
branches); a GAU stack of L layers has L branches, so N = L/2 there.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutput

from zhie.heads.rope import apply_rope

__all__ = ["GAUAlphaConfig", "GAUAlphaModel", "RoFormerV2Config", "RoFormerV2Model", "deepnorm_constants"]

NORMALISATIONS = ("squared_relu", "softmax", "softmax_plus")
TRUNCATED_NORMAL_STD = 1.13684723  # 1 / std of a unit normal truncated at two standard deviations


def deepnorm_constants(blocks: float, variant: str = "paper") -> tuple[float, float]:
    """``(alpha, beta)`` of DeepNorm for an encoder of ``blocks`` attention+FFN blocks (spec §7).

    ``"paper"``: ``alpha = (2N)^(1/4)``, ``beta = (8N)^(-1/4)`` (DeepNet, encoder-only, as torchscale);
    ``"adam"``: ``alpha = (2N)^(1/2)``, ``beta = (2N)^(-1/2)`` (Su's re-derivation for Adam, spec §7.2).
    """
    if variant == "paper":
        return (2 * blocks) ** 0.25, (8 * blocks) ** -0.25
    if variant == "adam":
        return (2 * blocks) ** 0.5, (2 * blocks) ** -0.5
    raise ValueError(f"unknown DeepNorm variant {variant!r}; use 'paper' or 'adam'")


def rms_norm(x: Tensor, eps: float) -> Tensor:
    """RMS norm without gain or offset (bert4keras ``LayerNormalization(zero_mean=False, scale=False,
    offset=False)``), computed in fp32."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class _Config(PretrainedConfig):
    """Fields both families share; see the module docstring for their meaning."""

    def __init__(self, vocab_size=12000, hidden_size=768, num_hidden_layers=12, intermediate_size=3072,
                 hidden_act="relu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, type_vocab_size=2,
                 layer_norm_eps=1e-12, pad_token_id=0, use_bias=False, embedding_size=None, max_position_embeddings=512,
                 initializer="su", init_order=2, deepnorm=None, **kwargs):
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.type_vocab_size = type_vocab_size
        self.layer_norm_eps = layer_norm_eps
        self.use_bias = use_bias
        self.embedding_size = hidden_size if embedding_size is None else embedding_size
        self.max_position_embeddings = max_position_embeddings  # informational: RoPE has no length limit
        self.initializer = initializer
        self.init_order = init_order
        self.deepnorm = deepnorm
        if initializer not in ("su", "xavier"):
            raise ValueError(f"unknown initializer {initializer!r}; use 'su' or 'xavier'")
        if deepnorm is not None:
            deepnorm_constants(1, deepnorm)  # validates the variant


class RoFormerV2Config(_Config):
    """RoFormerV2 (spec §11.2); defaults are the base model's (12 x 768, 12 heads, relu FFN of 3072)."""

    model_type = "roformer_v2"

    def __init__(self, num_attention_heads=12, **kwargs):
        super().__init__(**kwargs)
        self.num_attention_heads = num_attention_heads
        if self.hidden_size % num_attention_heads or (self.hidden_size // num_attention_heads) % 2:
            raise ValueError(f"hidden_size {self.hidden_size} must split into {num_attention_heads} heads of an "
                             "even size (RoPE rotates pairs)")


class GAUAlphaConfig(_Config):
    """GAU-α (spec §6.3); defaults are the released model's (24 GAU layers, 768, e=1536, s=128, softmax_plus)."""

    model_type = "gau_alpha"

    def __init__(self, attention_key_size=128, normalization="softmax_plus", attention_scale=True,
                 softmax_plus_min_length=16, attention="quadratic", chunk_size=256, **kwargs):
        kwargs = {"num_hidden_layers": 24, "intermediate_size": 1536, "hidden_act": "swish", "init_order": 3,
                  **kwargs}
        super().__init__(**kwargs)
        self.attention_key_size = attention_key_size
        self.normalization = normalization
        self.attention_scale = attention_scale
        self.softmax_plus_min_length = softmax_plus_min_length
        self.attention = attention
        self.chunk_size = chunk_size
        if normalization not in NORMALISATIONS:
            raise ValueError(f"unknown normalization {normalization!r}; use one of {', '.join(NORMALISATIONS)}")
        if attention not in ("quadratic", "flash"):
            raise ValueError(f"unknown attention {attention!r}; use 'quadratic' or 'flash'")
        if attention == "flash" and normalization != "squared_relu":
            raise ValueError("attention='flash' mixes quadratic and linear attention, which needs "
                             "normalization='squared_relu' (softmax has no linear form)")
        if attention_key_size % 2:
            raise ValueError(f"attention_key_size must be even (RoPE rotates pairs), got {attention_key_size}")


# ----------------------------------------------------------------------------------------------- initialisation
def _init_linear(layer: nn.Linear, config: _Config, scale: float = 1.0, rows: slice = slice(None)) -> None:
    """Initialise ``layer.weight[rows]`` (zero its bias) by ``config.initializer``, times ``scale``."""
    weight = layer.weight.data[rows]
    fan_in, fan_out = weight.shape[1], weight.shape[0]
    if config.initializer == "xavier":
        weight.normal_(0.0, math.sqrt(2.0 / (fan_in + fan_out)))
    else:
        std = TRUNCATED_NORMAL_STD / math.sqrt(fan_in) * config.num_hidden_layers ** (-1 / config.init_order)
        nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)
    weight.mul_(scale)
    if layer.bias is not None:
        layer.bias.data[rows].zero_()


def _init_embedding(embedding: nn.Embedding, config: _Config) -> None:
    rows, dim = embedding.weight.shape
    fan = dim if rows > 10000 or rows < 10 else rows  # bert4keras' rule for embedding-like matrices
    std = TRUNCATED_NORMAL_STD / math.sqrt(fan)
    if config.initializer == "su":
        std *= config.num_hidden_layers ** (-1 / config.init_order)
    nn.init.trunc_normal_(embedding.weight.data, std=std, a=-2 * std, b=2 * std)


def _deepnorm(config: _Config) -> tuple[float, float]:
    """``(alpha, beta)`` of ``config`` (1, 1 without DeepNorm); a GAU stack of L layers counts as L/2 blocks."""
    if config.deepnorm is None:
        return 1.0, 1.0
    blocks = config.num_hidden_layers / 2 if isinstance(config, GAUAlphaConfig) else config.num_hidden_layers
    return deepnorm_constants(blocks, config.deepnorm)


# ------------------------------------------------------------------------------------------------------ modules
class Embeddings(nn.Module):
    """Token + segment embeddings, dropout, the parameter-free RMS norm, then a projection to ``hidden_size``
    when ``embedding_size`` differs (bert4keras RoFormerV2 order)."""

    def __init__(self, config: _Config) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.embedding_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.eps = config.layer_norm_eps
        self.embeddings_project = (nn.Linear(config.embedding_size, config.hidden_size, bias=config.use_bias)
                                   if config.embedding_size != config.hidden_size else None)

    def reset_parameters(self, config: _Config) -> None:
        _init_embedding(self.word_embeddings, config)
        _init_embedding(self.token_type_embeddings, config)
        if self.embeddings_project is not None:
            _init_linear(self.embeddings_project, config)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = rms_norm(self.dropout(x), self.eps)
        return x if self.embeddings_project is None else self.embeddings_project(x)


class ScaleOffset(nn.Module):
    """``x * gamma (+ beta)``: per-dimension gain (init 1) and, with biases, offset (init 0)."""

    def __init__(self, size: int, offset: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size)) if offset else None

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight if self.bias is None else x * self.weight + self.bias


class GatedAttentionUnit(nn.Module):
    """One GAU (spec §6.1-6.2), quadratic or FLASH (module docstring); returns ``F(x)`` before the residual."""

    def __init__(self, config: GAUAlphaConfig) -> None:
        super().__init__()
        self.config = config
        e, s = config.intermediate_size, config.attention_key_size
        self.i_dense = nn.Linear(config.hidden_size, 2 * e + s, bias=config.use_bias)
        self.o_dense = nn.Linear(e, config.hidden_size, bias=config.use_bias)
        self.q_scaleoffset = ScaleOffset(s, config.use_bias)
        self.k_scaleoffset = ScaleOffset(s, config.use_bias)
        if config.attention == "flash":
            self.lin_q_scaleoffset = ScaleOffset(s, config.use_bias)
            self.lin_k_scaleoffset = ScaleOffset(s, config.use_bias)
        self.activation = ACT2FN[config.hidden_act]
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def reset_parameters(self, config: GAUAlphaConfig) -> None:
        beta, e = _deepnorm(config)[1], config.intermediate_size
        _init_linear(self.i_dense, config)
        self.i_dense.weight.data[: 2 * e].mul_(beta)  # U and V; Z (queries/keys) keeps gain 1
        _init_linear(self.o_dense, config, beta)
        for module in self.children():
            if isinstance(module, ScaleOffset):
                module.weight.data.fill_(1.0)
                if module.bias is not None:
                    module.bias.data.zero_()

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        e, s = self.config.intermediate_size, self.config.attention_key_size
        u, v, z = torch.split(self.activation(self.i_dense(x)), [e, e, s], dim=-1)
        keys = valid.sum(-1).clamp(min=1).to(x.dtype)[:, None, None]  # l: valid keys per sequence, [b, 1, 1]
        if self.config.attention == "flash":
            mixed = self._flash(u, v, z, valid, keys)
        else:
            mixed = self._quadratic(v, z, valid, keys)
        return self.o_dense(u * mixed)

    def _scores(self, q: Tensor, k: Tensor) -> Tensor:
        a = q @ k.transpose(-1, -2)
        return a / math.sqrt(self.config.attention_key_size) if self.config.attention_scale else a

    def _quadratic(self, v: Tensor, z: Tensor, valid: Tensor, keys: Tensor) -> Tensor:
        q, k = apply_rope(self.q_scaleoffset(z)), apply_rope(self.k_scaleoffset(z))
        method = self.config.normalization
        if method == "squared_relu":
            attn = torch.relu(self._scores(q, k)).square() / keys * valid[:, None, :]
            return self.dropout(attn) @ v
        if method == "softmax_plus":  # scaling the queries scales every logit of their row
            q = q * (keys.clamp(min=self.config.softmax_plus_min_length).log() / math.log(512)).to(q.dtype)
        scale = 1 / math.sqrt(self.config.attention_key_size) if self.config.attention_scale else 1.0
        out = F.scaled_dot_product_attention(  # one head; torch's fused kernels where they apply
            q[:, None], k[:, None], v[:, None], attn_mask=valid[:, None, None, :], scale=scale,
            dropout_p=self.dropout.p if self.training else 0.0)
        return out[:, 0]

    def _flash(self, u: Tensor, v: Tensor, z: Tensor, valid: Tensor, keys: Tensor) -> Tensor:
        b, n = valid.shape
        c = self.config.chunk_size
        pad = (-n) % c
        quad_q, quad_k = apply_rope(self.q_scaleoffset(z)), apply_rope(self.k_scaleoffset(z))
        lin_q, lin_k = apply_rope(self.lin_q_scaleoffset(z)), apply_rope(self.lin_k_scaleoffset(z))
        lin_k = lin_k * valid[..., None]

        def chunks(t: Tensor) -> Tensor:  # [b, n, d] -> [b, groups, c, d], zero-padded
            return F.pad(t, (0, 0, 0, pad)).unflatten(1, (-1, c))

        quad_q, quad_k, lin_q, lin_k, v = map(chunks, (quad_q, quad_k, lin_q, lin_k, v))
        key_mask = F.pad(valid, (0, pad)).unflatten(1, (-1, c))[:, :, None, :]  # [b, g, 1, c]
        attn = torch.relu(self._scores(quad_q, quad_k)).square() / c * key_mask
        quad = self.dropout(attn) @ v
        context = torch.einsum("bgnd,bgne->bde", lin_k, v) / keys  # sum over every chunk, / valid tokens
        lin = torch.einsum("bgnd,bde->bgne", lin_q, context)
        return (quad + lin).flatten(1, 2)[:, :n]


class GAULayer(nn.Module):
    """``x <- Norm(alpha * x + Dropout(GAU(x)))``."""

    def __init__(self, config: GAUAlphaConfig) -> None:
        super().__init__()
        self.gau = GatedAttentionUnit(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.alpha = _deepnorm(config)[0]
        self.eps = config.layer_norm_eps

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        return rms_norm(self.alpha * x + self.dropout(self.gau(x, valid)), self.eps)


class SelfAttention(nn.Module):
    """Multi-head attention with RoPE on each head's queries and keys, softmax, no biases by default."""

    def __init__(self, config: RoFormerV2Config) -> None:
        super().__init__()
        h = config.hidden_size
        self.heads = config.num_attention_heads
        self.query = nn.Linear(h, h, bias=config.use_bias)
        self.key = nn.Linear(h, h, bias=config.use_bias)
        self.value = nn.Linear(h, h, bias=config.use_bias)
        self.dropout = config.attention_probs_dropout_prob

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        q, k, v = (layer(x).unflatten(-1, (self.heads, -1)) for layer in (self.query, self.key, self.value))
        q, k = apply_rope(q), apply_rope(k)  # [b, n, heads, d]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=valid[:, None, None, :],
            dropout_p=self.dropout if self.training else 0.0)
        return out.transpose(1, 2).flatten(2)


class RoFormerV2Layer(nn.Module):
    """Attention then feed-forward, each ``x <- Norm(alpha * x + Dropout(F(x)))`` (HF RoFormer's names)."""

    def __init__(self, config: RoFormerV2Config) -> None:
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = SelfAttention(config)
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.use_bias)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.use_bias)
        self.output = nn.Module()
        self.output.dense = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.use_bias)
        self.activation = ACT2FN[config.hidden_act]
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.alpha = _deepnorm(config)[0]
        self.eps = config.layer_norm_eps

    def reset_parameters(self, config: RoFormerV2Config) -> None:
        beta = _deepnorm(config)[1]
        attention = self.attention.self
        _init_linear(attention.query, config)
        _init_linear(attention.key, config)
        for layer in (attention.value, self.attention.output.dense, self.intermediate.dense, self.output.dense):
            _init_linear(layer, config, beta)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        x = rms_norm(self.alpha * x + self.dropout(self.attention.output.dense(self.attention.self(x, valid))),
                     self.eps)
        ffn = self.output.dense(self.activation(self.intermediate.dense(x)))
        return rms_norm(self.alpha * x + self.dropout(ffn), self.eps)


class _Encoder(PreTrainedModel):
    """Embeddings + ``encoder.layer`` stack; ``forward`` as a transformers base model."""

    config_class = _Config
    base_model_prefix = "encoder_model"
    supports_gradient_checkpointing = False

    def __init__(self, config: _Config, layer_class: type[nn.Module]) -> None:
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(layer_class(config) for _ in range(config.num_hidden_layers))
        self.reset_parameters()
        self.post_init()

    def reset_parameters(self) -> None:
        """The initialisation of the module docstring (``initializer``, ``init_order``, ``deepnorm``)."""
        self.embeddings.reset_parameters(self.config)
        for layer in self.encoder.layer:
            (layer.gau if isinstance(layer, GAULayer) else layer).reset_parameters(self.config)

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing: :meth:`reset_parameters` initialises every weight when the model is built (it needs the
        whole stack's depth), and loading from a checkpoint is strict, so no weight is ever left to initialise."""

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                output_hidden_states: bool = False, return_dict: bool = True, **_unused) -> BaseModelOutput:
        valid = (input_ids != self.config.pad_token_id) if attention_mask is None else attention_mask.bool()
        x = self.embeddings(input_ids, torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids)
        states = [x]
        for layer in self.encoder.layer:
            x = layer(x, valid)
            states.append(x)
        return BaseModelOutput(last_hidden_state=x, hidden_states=tuple(states) if output_hidden_states else None)


class RoFormerV2Model(_Encoder):
    config_class = RoFormerV2Config
    base_model_prefix = "roformer"

    def __init__(self, config: RoFormerV2Config) -> None:
        super().__init__(config, RoFormerV2Layer)


class GAUAlphaModel(_Encoder):
    config_class = GAUAlphaConfig
    base_model_prefix = "gau_alpha"

    def __init__(self, config: GAUAlphaConfig) -> None:
        super().__init__(config, GAULayer)
