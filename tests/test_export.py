"""zhie export and the onnxruntime runtime: the graph's logits equal torch's (tolerance :data:`LOGIT_TOLERANCE`, the
largest difference printed) and the predictions are the same, with windows, nested spans and empty texts, for every
NER head, GPLinker, segmentation, sentence embeddings and a multi-task model; int8 against an accuracy floor."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the export extra (onnx, onnxruntime, onnxscript) is not installed")
pytest.importorskip("onnxscript", reason="torch.onnx.export (dynamo) needs onnxscript")

import zhie  # noqa: E402
from tests.tiny_models import nested_corpus, relation_corpus, trained  # noqa: E402
from zhie.cli import main  # noqa: E402
from zhie.deploy.export import EXPORT_FILE, check_inputs, export, flatten, largest_difference  # noqa: E402
from zhie.deploy.runtime import OnnxModel  # noqa: E402

LOGIT_TOLERANCE = 1e-4  # fp32 graph vs torch, on unmasked cells (measured: about 1e-5 on these tiny models)
SCORE_TOLERANCE = 1e-4
# ~300 characters: several windows (NER 64 tokens, GPLinker 48), entities and triples all along
LONG = "".join(ex.text + r["text"] for ex, r in zip(nested_corpus(8, seed=11), relation_corpus(8, seed=12)))
TEXTS = [LONG, "吕洋琼在清宁县银行工作。", "", "   ", "好", "蔡涛勇毕业于新平省基金会，住在湖南区。",
         "王伟毕业于远华大学，远华大学位于临江县。"]
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


@pytest.mark.parametrize("exported", ["ner-crf"], indirect=True)
def test_help_and_predicting_from_an_export_import_no_torch(exported):
    """Start-up (issue 25): `zhie --help` and `zhie predict EXPORT TEXT` import neither torch nor transformers."""
    _, _, out = exported
    code = ("import atexit, sys; atexit.register(lambda: print('heavy:', sorted({m.split('.')[0] for m in sys.modules} "
            "& {'torch', 'transformers', 'accelerate'}))); from zhie.cli import main; sys.exit(main(sys.argv[1:]))")
    for args in (["--help"], ["predict", str(out), TEXTS[1]]):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stdout.splitlines()[-1] == "heavy: []", (args, done.stdout[-500:],
                                                                                       done.stderr[-2000:])


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
    assert json.loads(capsys.readouterr().out)["opset"] == 18
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
    with pytest.raises(ValueError, match="CPU"):
        zhie.load(export(source, tmp_path / "z"), device="cuda")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
