"""zhie export and the onnxruntime runtime: the graph's logits equal torch's (tolerance :data:`LOGIT_TOLERANCE`, the
largest difference printed) and the predictions are the same, with windows, nested spans and empty texts, for every
NER head, GPLinker, segmentation, sentence embeddings and a multi-task model; int8 against an accuracy floor, and its
variants (per-channel, 7-bit weights, weights kept fp32, static calibration): what they quantise and what they
predict."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="the export extra (onnx, onnxruntime, onnxscript) is not installed")
pytest.importorskip("onnxscript", reason="torch.onnx.export (dynamo) needs onnxscript")

import zhie  # noqa: E402
from tests.tiny_models import nested_corpus, relation_corpus, trained  # noqa: E402
from zhie.cli import main  # noqa: E402
from zhie.deploy import runtime  # noqa: E402
from zhie.deploy.export import (  # noqa: E402
    DEFAULT_OPSET,
    EXPORT_FILE,
    check_inputs,
    export,
    flatten,
    largest_difference,
    weight_names,
)
from zhie.deploy.runtime import OnnxModel  # noqa: E402

LOGIT_TOLERANCE = 1e-4  # fp32 graph vs torch, on unmasked cells (measured: about 1e-5 on these tiny models)
SCORE_TOLERANCE = 1e-4
# ~300 characters: several windows (NER 64 tokens, GPLinker 48), entities and triples all along
LONG = "".join(ex.text + r["text"] for ex, r in zip(nested_corpus(8, seed=11), relation_corpus(8, seed=12)))
TEXTS = [LONG, "吕洋琼在清宁县银行工作。", "", "   ", "好", "蔡涛勇毕业于新平省基金会，住在湖南区。",
         "王伟毕业于远华大学，远华大学位于临江县。"]
# int8's largest logit difference to torch on the check texts (logits span -25..14). Measured on an AVX2 CPU (no VNNI):
# 0.62-0.98 per tensor, 2.2 per channel (onnxruntime's u8s8 kernels saturate there: per-channel weights fill the int8
# range), 0.12-0.38 with 7-bit weights (reduce_range), static or dynamic. A VNNI CPU saturates nothing: less.
INT8_TOLERANCE, REDUCED_RANGE_TOLERANCE = 3.0, 0.6
TRAIN_TEXTS = [ex.text for ex in nested_corpus(240, seed=1)][:64]  # the ner-gp model's first training texts
INT8_VARIANTS = {"per-channel": {"per_channel": True},
                 "per-channel-reduce-range": {"per_channel": True, "reduce_range": True},
                 "keep-embeddings": {"keep_fp32": ("embeddings",)},
                 "keep-last-layer": {"keep_fp32": ("layer.1.",)},  # the tiny encoder has two layers
                 "static": {"calibration": TRAIN_TEXTS},
                 "batch-scales": {"batch_scales": True}}
KINDS = ["ner-gp", "ner-egp", "ner-crf", "ner-softmax", "re", "cws", "similarity", "multitask"]


@pytest.fixture(scope="module", params=KINDS)
def exported(request, tmp_path_factory):
    source = trained(request.param)
    return request.param, source, export(source, tmp_path_factory.mktemp("export") / request.param)


def keyed(prediction) -> list:
    """A prediction as comparable tuples and its scores (spans, triples or words)."""
    rows = [x.to_dict() for x in prediction]
    scores = [r.pop("score", 0.0) for r in rows]
    return [json.dumps(r, sort_keys=True, ensure_ascii=False) for r in rows], scores


def test_exported_logits_and_predictions_equal_torch(exported):
    kind, source, out = exported
    torch_pipe, onnx_pipe = zhie.load(source), zhie.load(out)
    assert isinstance(onnx_pipe.model, OnnxModel) and not (out / "model.safetensors").exists()
    record = json.loads((out / EXPORT_FILE).read_text(encoding="utf-8"))
    assert record["fp32_max_abs_diff"] <= LOGIT_TOLERANCE
    card = (out / "README.md").read_text(encoding="utf-8")  # the source's card facts and training record carry over
    assert (out / "training.json").read_bytes() == (source / "training.json").read_bytes()
    trained_on = json.loads((source / "training.json").read_text(encoding="utf-8"))["data"][0]["path"]
    assert torch_pipe.task.describe()["summary"] in card and "fp32 ONNX export" in card and trained_on in card

    inputs = check_inputs(torch_pipe.task, [t[:40] for t in TEXTS])  # batch of 7, padded, one row all padding
    expected = flatten(torch_pipe.model(**inputs))
    arrays = onnx_pipe.model.arrays(inputs["input_ids"].numpy(), inputs["attention_mask"].numpy())
    got = [a for value in arrays.values() for a in (value.values() if isinstance(value, dict) else [value])]
    diff = largest_difference(expected, got)
    print(f"{kind}: max abs logit difference {diff:.2e} over {sum(g.size for g in got)} cells")
    assert diff <= LOGIT_TOLERANCE

    if kind == "similarity":
        np.testing.assert_allclose(onnx_pipe.encode(TEXTS), torch_pipe.encode(TEXTS), atol=SCORE_TOLERANCE)
        return
    want, have = torch_pipe.predict(TEXTS, batch_size=4), onnx_pipe.predict(TEXTS, batch_size=4)
    if kind == "multitask":  # NER (CRF) and CWS members from one pass, then the embedding member
        want, have = ([p[name] for name in ("ner", "cws") for p in predictions] for predictions in (want, have))
        np.testing.assert_allclose(onnx_pipe.encode(TEXTS, member="sim"), torch_pipe.encode(TEXTS, member="sim"),
                                   atol=SCORE_TOLERANCE)
    print(f"{kind}: {[len(w) for w in want]} hits per text")
    assert sum(map(len, want)) >= 2 and want[2] == have[2] == []  # something to compare; the empty text has nothing
    for w, h in zip(want, have):
        (wk, ws), (hk, hs) = keyed(w), keyed(h)
        assert hk == wk
        np.testing.assert_allclose(hs, ws, atol=SCORE_TOLERANCE)


@pytest.mark.parametrize("exported", ["ner-gp"], indirect=True)  # the well-trained nested model
def test_nested_spans_come_back_from_the_export(exported):
    _, _, out = exported
    (spans,) = zhie.load(out).predict(["吕洋琼在清宁县银行工作。"])
    assert {("清宁县银行", "ORG"), ("清宁县", "LOC")} <= {(s.text, s.label) for s in spans}


@pytest.mark.parametrize("exported", ["ner-gp"], indirect=True)
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs a process that may run on two CPUs or more")
def test_an_export_runs_one_single_threaded_run_per_allowed_cpu_and_never_spins(exported):
    """Under taskset or a cpuset an export splits a batch over as many runs as the process may use CPUs, on the whole
    machine over all of them; each run is single-threaded (its session has one intra-op thread), which never spins."""
    _, _, out = exported
    allowed = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(allowed)})
        pinned = OnnxModel(out)
    finally:
        os.sched_setaffinity(0, allowed)
    whole = OnnxModel(out)
    assert (pinned.threads, whole.threads, OnnxModel(out, threads=3).threads) == (1, len(allowed), 3)
    assert pinned.pool is None
    for model in (pinned, whole):
        options = model.session.get_session_options()
        assert options.intra_op_num_threads == 1
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    with pytest.raises(ValueError, match="threads must be at least 1"):
        OnnxModel(out, threads=0)
    assert zhie.load(out, threads=3).model.threads == 3  # what a process sharing the machine, a Ray actor, asks
    with pytest.raises(ValueError, match="torch model: threads sets an export's threads"):
        zhie.load(trained("ner-gp"), threads=1)


def test_a_batch_split_over_runs_answers_as_one_run(exported):
    """Every kind's outputs are batch first: the rows of a batch split over three runs at once come back in order,
    the same as one run of the whole batch (fp32 exports)."""
    kind, source, out = exported
    task = zhie.load(source).task
    inputs = check_inputs(task, [t[:40] for t in TEXTS])  # 7 rows: parts of 2, 2 and 3
    arrays = [OnnxModel(out, threads=n).arrays(inputs["input_ids"].numpy(), inputs["attention_mask"].numpy())
              for n in (1, 3)]
    flat = [flat_outputs(got) for got in arrays]
    assert [a.shape for a in flat[0]] == [a.shape for a in flat[1]] and flat[0][0].shape[0] == 7
    assert largest_difference([torch.from_numpy(a) for a in flat[0]], flat[1]) <= 1e-5, kind


def flat_outputs(got: dict) -> list[np.ndarray]:
    """The arrays of ``arrays``' answer, GPLinker's fields flattened, in order."""
    return [a for value in got.values() for a in (value.values() if isinstance(value, dict) else [value])]


def source_batches(batches: list, taken: list[int]):
    """``batches``, one at a time, noting in ``taken`` the index of each one taken."""
    for i, batch in enumerate(batches):
        taken.append(i)
        yield batch


def test_batches_run_ahead_answer_batch_by_batch_in_order(exported):
    """``each_arrays`` (zhie predict's batches) runs up to ``threads`` batches at once and takes the next one from its
    source before it gives the outputs of the oldest; what it gives is each batch with :meth:`arrays`' outputs of it,
    in order (every kind, fp32 exports); a caller that stops early stops it."""
    kind, source, out = exported
    task = zhie.load(source).task
    batches = [{k: v.numpy() for k, v in check_inputs(task, [t[a:a + 30] for t in TEXTS[:n]]).items()}
               for a, n in ((0, 2), (5, 3), (10, 1), (0, 7), (20, 4))]
    for threads in (1, 2, 3):
        model = OnnxModel(out, threads=threads)
        taken: list[int] = []
        results = model.each_arrays(source_batches(batches, taken))
        for i, (batch, outputs) in enumerate(results):
            assert batch is batches[i]
            # before the outputs of batch i come back, batches i+1 .. i+threads were taken (as many as there are)
            assert len(taken) == (min(len(batches), i + 1 + threads) if threads > 1 else i + 1), (kind, threads)
            one = model.arrays(batch["input_ids"], batch["attention_mask"])
            assert list(outputs) == list(one)
            assert all(np.array_equal(a, b) for a, b in zip(flat_outputs(outputs), flat_outputs(one))), (kind, i)
        assert i == len(batches) - 1
        early = model.each_arrays(iter(batches))
        next(early)
        early.close()  # the runs not started are cancelled, the started ones end in the pool: nothing hangs


@pytest.mark.parametrize("exported", ["ner-gp"], indirect=True)
def test_the_session_keeps_the_residual_add_and_its_layer_norm_apart(exported, tmp_path):
    """onnxruntime's own default fuses each residual Add and LayerNormalization into a SkipLayerNormalization, slower
    on the CPU measured (runtime.DISABLED_OPTIMIZERS); zhie's session leaves them apart, and answers the same."""
    import onnx
    import onnxruntime as ort

    _, _, out = exported
    graph = out / "model.onnx"
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "default.onnx")
    default = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    ours = runtime.session(graph, optimized_model=tmp_path / "zhie.onnx")
    ops = {name: {n.op_type for n in onnx.load(str(tmp_path / f"{name}.onnx")).graph.node}
           for name in ("default", "zhie")}
    assert "SkipLayerNormalization" in ops["default"]  # the rewrite happens without the option: the test can see it
    assert "SkipLayerNormalization" not in ops["zhie"] and "LayerNormalization" in ops["zhie"]
    feeds = {k: v.numpy() for k, v in check_inputs(zhie.load(out).task, TEXTS[1:]).items()}
    for a, b in zip(default.run(None, feeds), ours.run(None, feeds)):  # float32 rounding of the fused kernel
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-5)  # (logits near 20 differ in their ~6th digit)


@pytest.mark.parametrize("exported", ["ner-crf"], indirect=True)
def test_help_and_predicting_from_an_export_import_no_torch(exported):
    """Start-up (issue 25): `zhie --help`, `zhie --version` and `zhie predict EXPORT TEXT` import neither torch nor
    transformers."""
    _, _, out = exported
    code = ("import atexit, sys; atexit.register(lambda: print('heavy:', sorted({m.split('.')[0] for m in sys.modules} "
            "& {'torch', 'transformers', 'accelerate'}))); from zhie.cli import main; sys.exit(main(sys.argv[1:]))")
    for args in (["--help"], ["--version"], ["predict", str(out), TEXTS[1]]):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stdout.splitlines()[-1] == "heavy: []", (args, done.stdout[-500:],
                                                                                       done.stderr[-2000:])
        assert args != ["--version"] or done.stdout.splitlines()[0] == f"zhie {zhie.__version__}", done.stdout


def test_int8_stays_above_an_accuracy_floor(tmp_path):
    source = trained("ner-gp")
    out = export(source, tmp_path / "int8", quantize="int8")
    record = json.loads((out / EXPORT_FILE).read_text(encoding="utf-8"))
    assert record["quantize"] == "int8"
    dev = nested_corpus(80, seed=7)
    fp32 = zhie.load(source).evaluate(dev)["micro"]["f1"]
    int8 = zhie.load(out).evaluate(dev)["micro"]["f1"]
    print(f"dev F1: torch fp32 {fp32:.4f}, onnxruntime int8 {int8:.4f}; "
          f"int8 logit diff {record['int8_max_abs_diff']:.3g}")
    assert int8 >= fp32 - 0.03 and int8 >= 0.9
    assert (out / "model.onnx").stat().st_size < 0.5 * (source / "model.safetensors").stat().st_size


def test_cli_export_predict_and_serve_an_export(tmp_path, capsys):
    from fastapi.testclient import TestClient

    from zhie.deploy.serve import create_app

    source = trained("ner-gp")
    assert main(["export", str(source), "--out", str(tmp_path / "onnx")]) == 0
    assert json.loads(capsys.readouterr().out)["opset"] == DEFAULT_OPSET
    assert main(["predict", str(tmp_path / "onnx"), TEXTS[1]]) == 0
    line = json.loads(capsys.readouterr().out)
    (spans,) = zhie.load(tmp_path / "onnx").predict(TEXTS[1])
    assert line == {"text": TEXTS[1], "entities": [s.to_dict() for s in spans]}
    with TestClient(create_app(zhie.load(tmp_path / "onnx"))) as client:
        assert client.get("/info").json()["runtime"] == "onnxruntime"
        assert client.post("/predict", json={"texts": [TEXTS[1]]}).json() == [line]


def test_export_errors(tmp_path, capsys):
    source = trained("ner-gp")
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2
    assert "no zhie.json" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown quantisation"):
        export(source, tmp_path / "y", quantize="int4")
    exported = export(source, tmp_path / "z")
    with pytest.raises(ValueError, match="CPU"):
        zhie.load(exported, device="cuda")
    with pytest.raises(ValueError, match="runs in fp32"):
        zhie.load(exported, precision="bf16")
    with pytest.raises(FileNotFoundError, match="no zhie.json"):
        zhie.load(tmp_path / "nothing")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.parametrize("kind", ["ner-gp", "ner-egp", "re", "cws"])
def test_int8_answers_a_text_as_if_it_were_alone(kind, tmp_path):
    """Each token's activations have their own scale (the default): a text's spans, triples or words and their scores
    are the same in a batch of other texts, of other lengths, split over runs or not, as alone, to the last bit. With
    one scale per run (``batch_scales``, onnxruntime's own dynamic quantisation) they are not: another text in the batch
    moves a score."""
    texts = [t for t in TEXTS if t.strip()]  # the long one in windows

    def answers(out, threads: int) -> tuple[list, list]:
        pipe = zhie.load(out, threads=threads)
        batched, alone = pipe.predict(texts, batch_size=len(texts)), [pipe.predict([t])[0] for t in texts]
        return [keyed(p) for p in batched], [keyed(p) for p in alone]

    out = export(trained(kind), tmp_path / "token", quantize="int8", per_channel=True, reduce_range=True)
    for threads in (1, 2):
        batched, alone = answers(out, threads)
        assert sum(len(k) for k, _ in alone) >= 2 and batched == alone, (kind, threads)
    if kind == "ner-gp":
        old = export(trained(kind), tmp_path / "batch", quantize="int8", per_channel=True, reduce_range=True,
                     batch_scales=True)
        batched, alone = answers(old, 1)
        assert [s for _, s in batched] != [s for _, s in alone]


@pytest.fixture(scope="module")
def int8_export(tmp_path_factory):
    """``int8_export(variant)``: the ner-gp model exported with that :data:`INT8_VARIANTS` entry (once each)."""
    done = {}

    def get(variant: str):
        if variant not in done:
            out = tmp_path_factory.mktemp("int8") / variant
            done[variant] = export(trained("ner-gp"), out, quantize="int8", **INT8_VARIANTS[variant])
        return done[variant]
    return get


def graph_of(out):
    import onnx

    return onnx.load(str(out / "model.onnx")).graph


def fp32_weights_left(graph) -> list[str]:
    """The weights that matrix products and Gathers still read as floats (:func:`zhie.deploy.export.weight_names`)."""
    return sorted({name for weights in weight_names(graph).values() for name in weights.values()})


def scale_sizes(graph) -> list[int]:
    """The number of elements of each quantisation scale of the graph."""
    return [int(np.prod(i.dims)) for i in graph.initializer if i.name.endswith("_scale")]


@pytest.mark.parametrize("variant", list(INT8_VARIANTS))
def test_int8_variants_predict_what_fp32_predicts(variant, int8_export):
    options = INT8_VARIANTS[variant]
    source, out = trained("ner-gp"), int8_export(variant)
    record = json.loads((out / EXPORT_FILE).read_text(encoding="utf-8"))
    assert {k: record[k] for k in ("quantize", "per_channel", "reduce_range", "keep_fp32", "calibration_texts",
                                   "int8_activations")} == {
        "quantize": "int8", "per_channel": options.get("per_channel", False),
        "reduce_range": options.get("reduce_range", False), "keep_fp32": list(options.get("keep_fp32", ())),
        "calibration_texts": len(TRAIN_TEXTS) if "calibration" in options else None,
        "int8_activations": "static" if "calibration" in options else "dynamic, per batch" if "batch_scales" in options
        else "dynamic, per token"}
    tolerance = REDUCED_RANGE_TOLERANCE if options.get("reduce_range") else INT8_TOLERANCE
    print(f"{variant}: int8 logit difference {record['int8_max_abs_diff']:.3g} (tolerance {tolerance})")
    assert record["int8_max_abs_diff"] <= tolerance

    # what stayed fp32: the weights the patterns name, and only those
    graph = graph_of(out)
    assert fp32_weights_left(graph) == record["fp32_weights"]
    kept = {"keep-embeddings": ["model.encoder.embeddings.position_embeddings.weight",
                                "model.encoder.embeddings.token_type_embeddings.weight",
                                "model.encoder.embeddings.word_embeddings.weight"],
            "keep-last-layer": [f"model.encoder.encoder.layer.1.{m}.weight" for m in (
                "attention.output.dense", "attention.self.key", "attention.self.query", "attention.self.value",
                "intermediate.dense", "output.dense")]}
    assert record["fp32_weights"] == kept.get(variant, [])
    ops = [node.op_type for node in graph.node]
    static = "calibration" in options
    # static: QDQ nodes around float products; dynamic: int8 products of activations quantised per run or per token
    assert ("MatMulInteger" in ops) != static and ("DynamicQuantizeLinear" in ops) == ("batch_scales" in options)

    torch_pipe, onnx_pipe = zhie.load(source), zhie.load(out)
    assert isinstance(onnx_pipe.model, OnnxModel)
    want, have = torch_pipe.predict(TEXTS[1:]), onnx_pipe.predict(TEXTS[1:])
    assert sum(map(len, want)) >= 4
    assert [keyed(h)[0] for h in have] == [keyed(w)[0] for w in want]
    dev = nested_corpus(80, seed=7)
    fp32, int8 = (pipe.evaluate(dev)["micro"]["f1"] for pipe in (torch_pipe, onnx_pipe))
    print(f"{variant}: dev F1 torch {fp32:.4f}, onnxruntime int8 {int8:.4f}")
    assert int8 >= fp32 - 0.03


@pytest.mark.parametrize("kind", ["ner-egp", "re", "cws"])
def test_static_int8_runs_for_every_head(kind, tmp_path):
    """onnxruntime 1.32 on an x86 CPU rewrites int8 (s8) activations to u8 when it loads a QDQ graph and, on the graphs
    that slice a quantised tensor (Efficient GlobalPointer, GPLinker), wrote a QuantizeLinear it then refused
    ("output_dtype INT8 does not match y_zero_point type UINT8"): static export failed for those heads."""
    source = trained(kind)
    out = export(source, tmp_path / kind, quantize="int8", calibration=TRAIN_TEXTS)
    record = json.loads((out / EXPORT_FILE).read_text(encoding="utf-8"))
    assert record["int8_activations"] == "static" and record["int8_max_abs_diff"] <= INT8_TOLERANCE
    have, want = zhie.load(out).predict(TEXTS[1:]), zhie.load(source).predict(TEXTS[1:])
    assert len(have) == len(want)


def test_keep_fp32_embeddings_leaves_the_gather_fp32_and_quantises_the_matmuls(int8_export):
    from onnx import TensorProto

    graph = graph_of(int8_export("keep-embeddings"))
    floats = {i.name for i in graph.initializer if i.data_type == TensorProto.FLOAT}
    (gather,) = [n for n in graph.node if n.op_type == "Gather" and "word_embeddings" in n.input[0]]
    assert gather.input[0] in floats
    layers = zhie.load(trained("ner-gp")).model.encoder.config.num_hidden_layers
    int8 = [n for n in graph.node if n.op_type == "MatMulInteger"]
    assert len(int8) == 6 * layers + 1  # a BERT layer's six Linears and the GP head's dense
    assert all(not weights for weights in (weight_names(graph).get(n.name) for n in graph.node
                                           if n.op_type == "MatMul"))  # no fp32 matrix product reads a weight


def test_per_channel_gives_one_scale_per_output_channel(int8_export):
    per_tensor, per_channel = (scale_sizes(graph_of(int8_export(v))) for v in ("keep-embeddings", "per-channel"))
    assert per_tensor and set(per_tensor) == {1}
    assert max(per_channel) in (128, 384, 512)  # the tiny encoder's hidden, GP head and intermediate sizes
    assert sum(size > 1 for size in per_channel) == 13  # every quantised Linear (the embeddings' Gathers: per tensor)


def test_int8_option_errors(tmp_path):
    source = trained("ner-gp")
    with pytest.raises(ValueError, match="matches none of the .* quantisable weights .*word_embeddings"):
        export(source, tmp_path / "a", quantize="int8", keep_fp32=("embeddings", "layer.99."))
    with pytest.raises(ValueError, match="per_channel, keep_fp32 are options of int8 quantisation"):
        export(source, tmp_path / "b", per_channel=True, keep_fp32=("embeddings",))
    with pytest.raises(ValueError, match="needs calibration texts"):
        export(source, tmp_path / "c", quantize="int8", calibration=["", " "])
    with pytest.raises(ValueError, match="empty keep_fp32 pattern"):
        export(source, tmp_path / "d", quantize="int8", keep_fp32=[""])
    assert not list(tmp_path.iterdir())


def test_cli_int8_flags(tmp_path, capsys):
    source, out = trained("ner-gp"), tmp_path / "static"
    texts = tmp_path / "train.txt"
    texts.write_text("\n".join(TRAIN_TEXTS[:20]) + "\n\n" + json.dumps({"text": TRAIN_TEXTS[20]}, ensure_ascii=False)
                     + "\n" + "\n".join(TRAIN_TEXTS[21:]) + "\n", encoding="utf-8")
    assert main(["export", str(source), "--out", str(out), "--quantize", "int8", "--calibrate", str(texts),
                 "--calibrate-lines", "30", "--keep-fp32", "word_embeddings", "--keep-fp32", "heads.",
                 "--per-channel", "--reduce-range"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert {k: line[k] for k in ("quantize", "per_channel", "reduce_range", "keep_fp32", "calibration_texts")} == {
        "quantize": "int8", "per_channel": True, "reduce_range": True, "keep_fp32": ["word_embeddings", "heads."],
        "calibration_texts": 30}
    print(f"static, per channel, 7-bit: int8 logit difference {line['int8_max_abs_diff']:.3g}")
    assert line["int8_max_abs_diff"] <= REDUCED_RANGE_TOLERANCE
    graph = graph_of(out)
    assert fp32_weights_left(graph) == ["model.encoder.embeddings.word_embeddings.weight",
                                        "model.heads.ner.dense.weight"]
    assert max(scale_sizes(graph)) > 1 and "QuantizeLinear" in {n.op_type for n in graph.node}
    (want,), (have,) = zhie.load(source).predict(TEXTS[1]), zhie.load(out).predict(TEXTS[1])
    assert keyed(have)[0] == keyed(want)[0]

    for args, message in ((["--per-channel", "--keep-fp32", "x"], "--per-channel, --keep-fp32 are options of int8 "
                                                                  "quantisation, and this export is fp32: add "
                                                                  "--quantize int8"),
                          (["--quantize", "int8", "--calibrate", str(tmp_path / "missing.txt")],
                           "missing.txt: no such file; give a text file, one text per line"),
                          (["--quantize", "int8", "--calibrate-lines", "5"], "give --calibrate FILE too"),
                          (["--quantize", "int8", "--keep-fp32", "layer.99."], "matches none")):
        assert main(["export", str(source), "--out", str(tmp_path / "bad"), *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("zhie: error: ") and message in err, (args, err)
    assert not (tmp_path / "bad").exists()


def test_export_never_replaces_what_is_not_an_export(tmp_path, capsys):
    """--out that is a file, the model itself or any other non-empty directory is refused before any work (the
    export would replace its content); so is an export of an export, and an opset ONNX does not have."""
    source = trained("ner-gp")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    (tmp_path / "a-file").write_text("keep me too")
    for out, message in ((tmp_path / "notes", "a non-empty directory that is not a zhie export"),
                         (tmp_path / "a-file", "exists and is not a directory"),
                         (source, "a non-empty directory that is not a zhie export")):
        assert main(["export", str(source), "--out", str(out)]) == 2
        assert f"zhie: error: --out {out}: {message}" in capsys.readouterr().err
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    assert (tmp_path / "a-file").read_text() == "keep me too" and (source / "model.safetensors").exists()
    with pytest.raises(ValueError, match="--opset 99: ONNX has opsets 1 to"):
        export(source, tmp_path / "x", opset=99)
    exported = export(source, tmp_path / "onnx")
    assert export(source, exported) == exported  # an export is replaced by a new one
    with pytest.raises(ValueError, match="is already an ONNX export; export the model directory it was made from"):
        export(exported, tmp_path / "again")
    assert not (tmp_path / "x").exists() and not (tmp_path / "again").exists()


def test_an_opset_the_exporter_cannot_write_is_an_error_not_a_false_record(tmp_path):
    """torch writes opset 18 when it cannot convert the graph down to the opset asked; export.json said 16."""
    with pytest.raises(ValueError, match="--opset 16: torch's exporter could not write the model in that opset "
                                         r"\(the graph has opset 18\)"):
        export(trained("ner-gp"), tmp_path / "old", opset=16)
    assert not (tmp_path / "old").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / EXPORT_FILE).write_text("{"), f"{EXPORT_FILE}: not an export's record"),
    (lambda d: (d / EXPORT_FILE).write_text("[]"), f"{EXPORT_FILE}: not an export's record"),
    (lambda d: (d / "model.onnx").write_bytes((d / "model.onnx").read_bytes()[:500]),
     "model.onnx: onnxruntime cannot load the graph"),
    (lambda d: (d / "head.safetensors").write_bytes(b"\x00" * 10), "head.safetensors: cannot be read")])
def test_a_damaged_export_is_one_clear_error(damage, message, exported_once, tmp_path, capsys):
    import shutil

    out = shutil.copytree(exported_once, tmp_path / "onnx")
    damage(out)
    assert main(["predict", str(out), TEXTS[1]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zhie: error: ") and message in err and "again" in err, err


@pytest.fixture(scope="module")
def exported_once(tmp_path_factory):
    return export(trained("ner-crf"), tmp_path_factory.mktemp("export") / "ner-crf")
