"""zhie's own encoders (zhie.encoders.gau): GAU-α against the `gau-alpha` port, FLASH against `flash-pytorch`,
DeepNorm's constants and initialisation against `torchscale`, RoFormerV2 against a plain re-statement of spec §11.2,
the spec's initialisation, and building encoders from a config (`new:...`)."""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import types

import pytest
import torch

from zhie import encoders
from zhie.encoders.gau import (
    GatedAttentionUnit,
    GAUAlphaConfig,
    GAUAlphaModel,
    RoFormerV2Config,
    RoFormerV2Model,
    deepnorm_constants,
)


@pytest.fixture
def gau_alpha_port(monkeypatch):
    """The `gau-alpha` package (the PyTorch port the GAU-α weights were released for). Its module imports
    ``SequenceSummary``, which transformers 5 removed and which only its classification heads use: a placeholder
    stands in for the duration of the test."""
    if importlib.util.find_spec("gau_alpha") is None:
        pytest.skip("gau-alpha is not installed")
    import transformers.modeling_utils

    monkeypatch.setattr(transformers.modeling_utils, "SequenceSummary", object, raising=False)
    return importlib.import_module("gau_alpha.modeling_gau_alpha")


def padded_batch(vocab: int, lengths: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    mask = torch.tensor([[1] * k + [0] * (n - k) for k in lengths])
    return torch.randint(1, vocab, (len(lengths), n), generator=g) * mask, mask


@pytest.mark.parametrize("normalization", ["softmax_plus", "squared_relu", "softmax"])
def test_gau_alpha_equals_the_gau_alpha_port(gau_alpha_port, normalization):
    sizes = dict(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=3, attention_key_size=16,
                 normalization=normalization)
    torch.manual_seed(0)
    ref = gau_alpha_port.GAUAlphaModel(gau_alpha_port.GAUAlphaConfig(**sizes)).eval()
    ours = GAUAlphaModel(GAUAlphaConfig(softmax_plus_min_length=1, **sizes)).eval()  # the port: no length clamp
    ours.load_state_dict(ref.state_dict(), strict=True)  # same module names
    ids, mask = padded_batch(60, [11, 7, 2])
    expected = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=1e-5, rtol=1e-5)


def test_softmax_plus_clamp_only_changes_short_sequences(gau_alpha_port):
    sizes = dict(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2, attention_key_size=16)
    clamped, unclamped = (GAUAlphaModel(GAUAlphaConfig(softmax_plus_min_length=k, **sizes)).eval() for k in (16, 1))
    unclamped.load_state_dict(clamped.state_dict())
    ids, mask = padded_batch(60, [20, 16, 5])
    a = clamped(input_ids=ids, attention_mask=mask).last_hidden_state
    b = unclamped(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(a[:2][mask[:2].bool()], b[:2][mask[:2].bool()])  # l >= 16: identical
    assert not torch.allclose(a[2, :5], b[2, :5])  # l = 5 < 16: scaled as if 16 keys


def test_the_released_gau_alpha_layout_loads_strictly(gau_alpha_port, tmp_path):
    """A directory as the released checkpoint is laid out (GAUAlphaForMaskedLM: ``gau_alpha.*`` + ``cls.*``, config
    ``model_type: gau_alpha``) loads through ``encoders.load``; the MLM head is dropped, the rest equals the port."""
    config = gau_alpha_port.GAUAlphaConfig(vocab_size=len(encoders.SPECIAL_TOKENS) + 4, hidden_size=32,
                                           intermediate_size=64, num_hidden_layers=2, attention_key_size=16)
    ref = gau_alpha_port.GAUAlphaForMaskedLM(config).eval()
    ref.save_pretrained(tmp_path)
    encoders.wordpiece_tokenizer(encoders.SPECIAL_TOKENS + list("你好世界")).save_pretrained(tmp_path)
    model, tokenizer = encoders.load(tmp_path)
    assert isinstance(model, GAUAlphaModel)
    ids = tokenizer(["你好世界"], return_tensors="pt")["input_ids"]
    torch.testing.assert_close(model.eval()(input_ids=ids).last_hidden_state,
                               ref.gau_alpha(input_ids=ids).last_hidden_state, atol=1e-5, rtol=1e-5)


def flash_pair(use_bias: bool = True):
    """flash-pytorch's FLASH and zhie's GAU in FLASH mode on the same weights. Where the layouts differ:
    flash-pytorch is pre-norm (its norm is set to identity and its residual subtracted), always adds a T5
    relative-position bias (zeroed here: spec §6.1, RoPE alone), scales the in-chunk scores by 1/c^2 where the
    spec has 1/(c s) (equal when s = c, as here), and divides the linear part by the padded batch length where
    zhie divides by each sequence's valid tokens (equal without padding)."""
    from flash_pytorch import FLASH
    from rotary_embedding_torch import RotaryEmbedding

    d, s, e = 32, 8, 64
    torch.manual_seed(0)
    ref = FLASH(dim=d, group_size=s, query_key_dim=s, expansion_factor=e / d, rotary_pos_emb=RotaryEmbedding(dim=s),
                norm_klass=torch.nn.Identity).eval()
    config = GAUAlphaConfig(hidden_size=d, intermediate_size=e, attention_key_size=s, num_hidden_layers=1,
                            attention="flash", normalization="squared_relu", chunk_size=s, use_bias=use_bias,
                            attention_probs_dropout_prob=0.0)
    ours = GatedAttentionUnit(config).eval()
    with torch.no_grad():
        torch.nn.init.zeros_(ref.rel_pos_bias.relative_attention_bias.weight)
        ref.qk_offset_scale.gamma.normal_()
        ref.qk_offset_scale.beta.normal_()
        value, gate = ref.to_hidden[0].weight.chunk(2)
        value_bias, gate_bias = ref.to_hidden[0].bias.chunk(2)
        ours.i_dense.weight.copy_(torch.cat([gate, value, ref.to_qk[0].weight]))  # zhie: U, V, Z
        ours.i_dense.bias.copy_(torch.cat([gate_bias, value_bias, ref.to_qk[0].bias]))
        ours.o_dense.weight.copy_(ref.to_out.weight)
        ours.o_dense.bias.copy_(ref.to_out.bias)
        heads = (ours.q_scaleoffset, ours.lin_q_scaleoffset, ours.k_scaleoffset, ours.lin_k_scaleoffset)
        for i, head in enumerate(heads):  # flash-pytorch's order: quad_q, lin_q, quad_k, lin_k
            head.weight.copy_(ref.qk_offset_scale.gamma[i])
            head.bias.copy_(ref.qk_offset_scale.beta[i])
    return ref, ours


@pytest.mark.parametrize("length", [8, 13, 30])
def test_flash_equals_flash_pytorch(length):
    pytest.importorskip("flash_pytorch")
    ref, ours = flash_pair()
    x = torch.randn(2, length, 32)
    torch.testing.assert_close(ours(x, torch.ones(2, length, dtype=torch.bool)), ref(x) - x, atol=1e-5, rtol=1e-5)


def test_flash_outputs_do_not_depend_on_padding():
    config = GAUAlphaConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            attention_key_size=16, attention="flash", normalization="squared_relu", chunk_size=4)
    model = GAUAlphaModel(config).eval()
    ids, mask = padded_batch(60, [13, 6])
    batch = model(input_ids=ids, attention_mask=mask).last_hidden_state
    alone = model(input_ids=ids[1:, :6], attention_mask=mask[1:, :6]).last_hidden_state
    torch.testing.assert_close(batch[1, :6], alone[0], atol=1e-5, rtol=1e-5)


def roformer_v2_by_hand(model: RoFormerV2Model, ids: torch.Tensor) -> torch.Tensor:
    """Spec §11.2 written out for one unpadded sequence: token + segment embedding, RMS norm, then per block
    ``x = norm(x + Attn(x))``, ``x = norm(x + FFN(x))``, with per-head RoPE (spec §0.1 formula, pair by pair)."""
    c = model.config

    def norm(x):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.layer_norm_eps)

    def rope(x):  # [n, d]: rotate pairs (2i, 2i+1) by m * 10000^(-2i/d)
        out = x.clone()
        for m in range(x.shape[0]):
            for i in range(x.shape[1] // 2):
                theta = m * 10000 ** (-2 * i / x.shape[1])
                a, b = x[m, 2 * i], x[m, 2 * i + 1]
                out[m, 2 * i], out[m, 2 * i + 1] = a * math.cos(theta) - b * math.sin(theta), \
                    b * math.cos(theta) + a * math.sin(theta)
        return out

    e = model.embeddings
    x = norm(e.word_embeddings.weight[ids] + e.token_type_embeddings.weight[0])
    d = c.hidden_size // c.num_attention_heads
    for layer in model.encoder.layer:
        att = layer.attention.self
        q, k, v = att.query(x), att.key(x), att.value(x)
        heads = []
        for h in range(c.num_attention_heads):
            cols = slice(h * d, (h + 1) * d)
            scores = rope(q[:, cols]) @ rope(k[:, cols]).T / math.sqrt(d)
            heads.append(torch.softmax(scores, -1) @ v[:, cols])
        x = norm(x + layer.attention.output.dense(torch.cat(heads, -1)))
        x = norm(x + layer.output.dense(torch.relu(layer.intermediate.dense(x))))
    return x


def test_roformer_v2_follows_the_spec_and_ignores_padding():
    model = RoFormerV2Model(RoFormerV2Config(vocab_size=40, hidden_size=16, num_attention_heads=2,
                                             intermediate_size=32, num_hidden_layers=2)).eval()
    assert not [n for n, _ in model.named_parameters() if n.endswith("bias")]  # no biases anywhere
    ids, mask = padded_batch(40, [7, 4])
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    with torch.no_grad():
        torch.testing.assert_close(out[0], roformer_v2_by_hand(model, ids[0]), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[1, :4], roformer_v2_by_hand(model, ids[1, :4]), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ DeepNorm
@pytest.fixture
def torchscale_encoder(monkeypatch):
    """torchscale's Encoder. torchscale imports ``timm`` for one function (drop_path, unused at rate 0), and timm
    imports torchvision, which has no build for this CPU torch: a module with that one function stands in."""
    pytest.importorskip("torchscale")
    try:
        import timm.models.layers  # noqa: F401
    except Exception:
        stub = types.ModuleType("timm.models.layers")
        stub.drop_path = lambda x, *args, **kwargs: x
        for name, module in (("timm", types.ModuleType("timm")), ("timm.models", types.ModuleType("timm.models")),
                             ("timm.models.layers", stub)):
            monkeypatch.setitem(sys.modules, name, module)
    pytest.importorskip("fairscale")
    for name in [n for n in sys.modules if n.startswith("torchscale.architecture.encoder")]:
        monkeypatch.delitem(sys.modules, name)
    from torchscale.architecture.config import EncoderConfig
    from torchscale.architecture.encoder import Encoder

    def build(layers: int, deepnorm: bool):
        torch.manual_seed(0)
        return Encoder(EncoderConfig(deepnorm=deepnorm, subln=False, encoder_layers=layers, encoder_embed_dim=32,
                                     encoder_ffn_embed_dim=64, encoder_attention_heads=4, vocab_size=10))
    return build


@pytest.mark.parametrize("layers", [6, 24, 96])
def test_deepnorm_constants_and_initialisation_equal_torchscale(torchscale_encoder, layers):
    ts_plain, ts_deep = torchscale_encoder(layers, False), torchscale_encoder(layers, True)
    alpha, beta = deepnorm_constants(layers, "paper")
    assert ts_deep.layers[0].alpha == pytest.approx(alpha)
    deep_weights = dict(ts_deep.named_parameters())
    ts_scale = {name.split(".")[-2]: (deep_weights[name] / plain).mean().item()
                for name, plain in ts_plain.named_parameters()
                if name.startswith("layers.0.") and name.endswith("weight") and plain.dim() == 2}
    assert ts_scale["q_proj"] == ts_scale["k_proj"] == pytest.approx(1.0)
    for scaled in ("v_proj", "out_proj", "fc1", "fc2"):
        assert ts_scale[scaled] == pytest.approx(beta)

    sizes = dict(vocab_size=10, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=layers)
    torch.manual_seed(0)
    plain = RoFormerV2Model(RoFormerV2Config(**sizes))
    torch.manual_seed(0)
    deep = RoFormerV2Model(RoFormerV2Config(deepnorm="paper", **sizes))
    assert deep.encoder.layer[0].alpha == pytest.approx(alpha) and plain.encoder.layer[0].alpha == 1.0
    for (name, a), (_, b) in zip(plain.named_parameters(), deep.named_parameters()):
        if name.startswith("encoder.layer.0."):
            ratio = (b / a).mean().item()
            expected = 1.0 if ("query" in name or "key" in name) else beta
            assert ratio == pytest.approx(expected), name


def test_deepnorm_adam_constants_and_gau_scaling():
    assert deepnorm_constants(6, "adam") == pytest.approx((12 ** 0.5, 12 ** -0.5))
    sizes = dict(vocab_size=10, hidden_size=32, intermediate_size=64, attention_key_size=16, num_hidden_layers=8)
    torch.manual_seed(0)
    plain = GAUAlphaModel(GAUAlphaConfig(**sizes))
    torch.manual_seed(0)
    deep = GAUAlphaModel(GAUAlphaConfig(deepnorm="adam", **sizes))
    alpha, beta = deepnorm_constants(4, "adam")  # 8 GAU layers = 8 residual branches = 4 blocks
    assert deep.encoder.layer[3].alpha == pytest.approx(alpha)
    a, b = plain.encoder.layer[0].gau, deep.encoder.layer[0].gau
    ratio = b.i_dense.weight / a.i_dense.weight
    torch.testing.assert_close(ratio[:128], torch.full_like(ratio[:128], beta))  # U and V rows
    torch.testing.assert_close(ratio[128:], torch.ones_like(ratio[128:]))  # Z (queries/keys): gain 1
    torch.testing.assert_close(b.o_dense.weight, a.o_dense.weight * beta)


# ------------------------------------------------------------------------------------------ initialisation
@pytest.mark.parametrize("cls,order", [(RoFormerV2Config, 2), (GAUAlphaConfig, 3)])
def test_initialisation_follows_the_spec(cls, order):
    config = cls(vocab_size=20000, hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                 **({"num_attention_heads": 4} if cls is RoFormerV2Config else {}))
    model = (RoFormerV2Model if cls is RoFormerV2Config else GAUAlphaModel)(config)
    depth = 8 ** (-1 / order)
    layer = model.encoder.layer[0]
    linear = layer.intermediate.dense if cls is RoFormerV2Config else layer.gau.i_dense
    assert linear.weight.std().item() == pytest.approx(1 / math.sqrt(256) * depth, rel=0.03)
    assert linear.weight.abs().max().item() <= 2 * 1.13684723 / math.sqrt(256) * depth + 1e-6  # truncated at 2 std
    emb = model.embeddings.word_embeddings.weight  # 20000 rows > 10000: fan = the embedding size
    assert emb.std().item() == pytest.approx(1 / math.sqrt(256) * depth, rel=0.03)


def test_gau_starts_much_smaller_than_its_input():
    """Spec §6.4: with Xavier/LeCun-like init a GAU's output is ~1e-2 of its input, so post-norm stacks start near
    the identity."""
    config = GAUAlphaConfig(hidden_size=256, intermediate_size=512, attention_key_size=128, num_hidden_layers=1,
                            normalization="squared_relu", initializer="xavier", attention_probs_dropout_prob=0.0)
    gau = GatedAttentionUnit(config)
    x = torch.randn(2, 512, 256)
    ratio = gau(x, torch.ones(2, 512, dtype=torch.bool)).std() / x.std()
    assert ratio < 0.05


# ------------------------------------------------------------------------------------------- new:... specs
def test_new_encoder_specs_build_every_family(tmp_path):
    texts = ["你好世界", "中国人民"]
    for spec, cls in [("new:gau-alpha:layers=2,hidden=32,intermediate=64,key_size=8", "GAUAlphaModel"),
                      ("new:roformer-v2:layers=2,hidden=32,heads=2,intermediate=64,deepnorm=adam", "RoFormerV2Model"),
                      ("new:bert:layers=1,hidden=32,heads=2,intermediate=64", "BertModel"),
                      ("new:albert:layers=2,hidden=32,heads=2,embedding=16,intermediate=64", "AlbertModel"),
                      ("new:roformer:layers=1,hidden=32,heads=2,intermediate=64,embedding=32", "RoFormerModel")]:
        model, tokenizer = encoders.load(spec, texts=texts)
        assert type(model).__name__ == cls
        assert model.config.vocab_size == len(tokenizer) == len(encoders.SPECIAL_TOKENS) + 8
        assert getattr(model, "pooler", None) is None
    (tmp_path / "enc.json").write_text('{"model_type": "gau_alpha", "hidden_size": 16, "intermediate_size": 32, '
                                       '"attention_key_size": 8, "num_hidden_layers": 1}', encoding="utf-8")
    model, _ = encoders.load(tmp_path / "enc.json", texts=texts)
    assert isinstance(model, GAUAlphaModel) and model.config.hidden_size == 16


@pytest.mark.parametrize("spec,message", [
    ("new:gpt:layers=2", "unknown encoder family 'gpt'"),
    ("new:gau-alpha:layer=2", "has no setting 'layer'"),
    ("new:gau-alpha:layers", "is not key=value"),
    ("new:gau-alpha:attention=flash", "needs normalization='squared_relu'"),
    ("new:roformer-v2:deepnorm=sgd", "unknown DeepNorm variant"),
])
def test_bad_new_encoder_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        encoders.load(spec, texts=["你好"])
