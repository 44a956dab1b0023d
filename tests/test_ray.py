"""zhie predict --ray: Ray Data on a local Ray instance, 2 CPU workers, a tiny model; same output as zhie predict."""

from __future__ import annotations

import json

import pytest

from tests.tiny_models import nested_corpus, trained
from zhie.cli import main

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'zhie[ray]')")
pytest.importorskip("pandas", reason="Ray Data needs pandas (the ray extra: ray[data])")

TEXTS = [ex.text for ex in nested_corpus(40, seed=5)]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def read_shards(directory) -> list[dict]:
    return [json.loads(line) for f in sorted(directory.iterdir())
            for line in f.read_text(encoding="utf-8").splitlines()]


def test_ray_output_equals_single_process_output(local_ray, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    model = str(trained("ner-gp"))
    shards = tmp_path / "in"
    shards.mkdir()
    (shards / "a.txt").write_text("\n".join(TEXTS[:15]) + "\n", encoding="utf-8")
    (shards / "b.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in TEXTS[15:30]),
                                    encoding="utf-8")
    pq.write_table(pa.table({"text": TEXTS[30:]}), shards / "c.parquet")

    assert main(["predict", model, *TEXTS[30:], "--input", str(shards / "a.txt"), str(shards / "b.jsonl")]) == 0
    single = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    single = single[10:] + single[:10]  # the command-line texts come first

    assert main(["predict", model, "--ray", "--ray-workers", "2", "--ray-cpus", "0.5", "--chunk-lines", "8",
                 "--input", str(shards), "--output", str(tmp_path / "out")]) == 0
    rows = read_shards(tmp_path / "out")
    rows.sort(key=lambda r: (r["file"], r["line"]))
    assert [r["line"] for r in rows] == [*range(1, 16), *range(1, 16), *range(1, 11)]
    assert [{"text": r["text"], "entities": r["entities"]} for r in rows] == single

    assert main(["predict", model, "--ray", "--input", str(shards), "--output", str(tmp_path / "out")]) == 2
    assert "exists" in capsys.readouterr().err


def test_ray_bad_line_names_file_and_line(local_ray, tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text('{"text": "张三去了北京。"}\n{"id": 1}\n', encoding="utf-8")
    code = main(["predict", str(trained("ner-gp")), "--ray", "--ray-cpus", "0.5", "--input",
                 str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out")])
    assert code == 2 and f"{tmp_path / 'in.jsonl'}:2: a JSON line needs" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["in.jsonl"]
    assert main(["predict", str(trained("ner-gp")), "--ray", "--ray-cpus", "0.5", "--skip-bad-lines", "--input",
                 str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out")]) == 0
    assert [row["text"] for row in read_shards(tmp_path / "out")] == ["张三去了北京。"]
