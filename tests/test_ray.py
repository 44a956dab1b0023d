"""zhie predict --ray: Ray Data on a local Ray instance, 2 CPU workers, a tiny model; same output as zhie predict."""

from __future__ import annotations

import json

import pytest

from tests.tiny_models import nested_corpus, trained
from zhie.cli import main
from zhie.data import DataError

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


@pytest.mark.parametrize("url", ["s3://bucket/texts.txt", "gs://bucket/shards/", "file:///shared/texts.txt"])
def test_ray_input_urls_are_refused(url, tmp_path, capsys):
    """The input is read with the local file system on every node: a URL is refused, saying what to give instead."""
    assert main(["predict", str(tmp_path / "model"), "--ray", "--input", url, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--input {url}: --ray reads local paths" in err and "shared file system" in err, err
    assert not (tmp_path / "out").exists()


def test_each_ray_task_reads_a_piece_of_a_file(local_ray, tmp_path):
    """20 lines in pieces of 8 lines are 3 read tasks (blocks), not one for the file; a Parquet file's pieces are its
    row groups; the line numbers are the file's (line 10, blank, has no text), also in a bad line's message."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zhie.deploy.ray_predict import pieces, read_piece, read_rows

    lines = TEXTS[:9] + [""] + TEXTS[9:19]
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pq.write_table(pa.table({"text": TEXTS[:12]}), tmp_path / "b.parquet", row_group_size=5)
    files = [str(tmp_path / "a.txt"), str(tmp_path / "b.parquet")]
    assert [p["first"] for f in files for p in pieces(f, 8)] == [1, 9, 17, 1, 6, 11]
    ds = read_rows(files, 8).materialize()
    assert ds.num_blocks() == 6
    rows = sorted(ds.take_all(), key=lambda r: (r["file"], r["line"]))
    assert [(r["line"], r["text"]) for r in rows] == (
        [(n, t) for n, t in enumerate(lines, 1) if t] + list(enumerate(TEXTS[:12], 1)))
    (tmp_path / "c.jsonl").write_text("".join(f'{{"text": "{t}"}}\n' for t in TEXTS[:9]) + '{"id": 1}\n',
                                      encoding="utf-8")
    with pytest.raises(DataError, match=r"c\.jsonl:10: a JSON line needs"):
        read_piece(pieces(str(tmp_path / "c.jsonl"), 8)[1])


def test_a_ray_actor_runs_an_export_on_its_share_of_the_cpus(tmp_path):
    """Each actor's export splits a batch over the CPUs Ray gave the actor (--ray-cpus, at least one), not over every
    CPU of the machine as a process of its own would; a torch model keeps the threads Ray sets for the actor."""
    pytest.importorskip("onnxruntime", reason="the export extra is not installed")
    from zhie.deploy.export import export
    from zhie.deploy.ray_predict import Predictor

    source = trained("ner-gp")
    out = export(source, tmp_path / "export")
    assert [Predictor(str(out), "fp32", 32, None, cpus).pipe.model.threads for cpus in (0.5, 1.0, 2.0)] == [1, 1, 2]
    assert Predictor(str(source), "fp32", 32, None, 2.0).pipe.task.name == "ner"
