"""zhie and a real Label Studio server, round trip: pre-annotations in, annotations out, a model trained from them.

    python benchmarks/label_studio.py            # ~3 min with Label Studio installed; its install, once: 2-5 min more
    python benchmarks/label_studio.py --model RUNS/al-cluener-s1/round-200/model/best --dataset cluener --gold 400 \
        --exclude RUNS/al-cluener-s1/round-200/train.jsonl --work RUNS/ls-real/work       # the real mode, ~10 CPU min

The tiny mode (no ``--model``):

1. Label Studio 1.20.0 and its SDK go into a venv of their own (``--venv``, default
   ``~/.cache/zhie/label-studio-1.20.0``), installed once and reused.
2. A tiny NER model (``zhie train ner --encoder tiny --head egp``) on made-up sentences with nested entities.
3. ``zhie predict --output-format label-studio`` writes tasks C, with its predictions as pre-annotations.
4. The server starts on 127.0.0.1 with a temporary data dir (``LABEL_STUDIO_BASE_DATA_DIR``) and a user and legacy
   API token set by ``LABEL_STUDIO_USERNAME``, ``LABEL_STUDIO_PASSWORD``, ``LABEL_STUDIO_USER_TOKEN`` and
   ``LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN``; ``zhie serve MODEL`` starts beside it.
5. With the SDK (this file run by the Label Studio venv's Python, ``--sdk PLAN``): a project with a NER labelling
   config; tasks A imported with gold annotations (nested spans), B as texts, C as zhie predict wrote them; zhie serve
   connected as the ML backend (``http://127.0.0.1:PORT/label-studio``); predictions retrieved for B; half of B's
   predictions turned into annotations (what an annotator who accepts them does); the project exported as JSON.
6. Headless Chromium (playwright, Debian's chromium) logs in through the login form, opens a B task that kept only
   its prediction, reads the highlighted regions and takes a screenshot (``results/label_studio_page.png``).
7. Checks: the export read by zhie gives A's gold spans and the accepted B spans unchanged (offsets, labels, texts);
   the predictions Label Studio stored for B and C are what zhie predicts; the page highlights the predicted texts.
   Then ``zhie train ner --train EXPORT --dev EXPORT --format auto --encoder tiny --epochs 1`` trains from the export.
8. The training loop (``zhie serve --retrain-dir``): the SDK's "Start Training" (``ls.ml.train``) makes Label Studio
   send START_TRAINING to the backend, which fetches the project's annotations from Label Studio with the token it
   was given at setup, trains a new version, scores both on the held-out tasks and swaps; meanwhile a client asks the
   backend for predictions every 0.25 s (each failure counted); then Label Studio retrieves predictions again and
   stores them under the version now served.

The real mode (``--model DIR``, a trained NER model: issue 52's "a benchmark with a real model"), under the machine
lock (``common.machine_lock``), the same steps with these differences:

- no model is trained here: ``zhie serve`` serves ``--model`` and trains its new versions with ``--retrain-args``
  (default ``--epochs 2``; ``--seed`` is appended when they name none); the labelling config's labels are the
  model's (its ``zhie.json``; CLUENER: 10 types), with any other label of the gold annotations;
- the texts come from ``--dataset``'s training set (``benchmarks/ner.py``'s files; ``--data-files TRAIN DEV``
  instead, for a smoke run): its distinct texts less those of ``--exclude`` (the model's own training set, e.g. an
  active-learning round's ``train.jsonl``) and of the dev set, shuffled with ``--seed``. The first ``--gold`` (400)
  are tasks A, their gold annotations the annotator's: about 320 train the new version, about 80 are held out; the
  next texts in which the model finds an entity are B (6, and the emoji text when the model finds one in it) and C
  (5), so that every prediction and accepted annotation checked has spans. The page opened is the last B task whose
  prediction was not accepted (the emoji text's when it is there: the row's ``page_text``), its screenshot
  ``results/label_studio_page_real.png``;
- after the training, ``zhie eval`` scores the base model and the new version on the dataset's dev set; the row
  records ``dev_f1_before``, ``dev_f1_after`` (the version served after the training), ``dev_f1_new``, the held-out
  F1s of the versions line, the prediction requests made during the training and those that failed, the model
  versions Label Studio stored for B afterwards, and the seconds of each step.

Cost of the real mode on the 2-core machine (e5-small GP, 400 CLUENER gold tasks): Label Studio's start on a fresh
data dir ~1 min; the new version ~320 training tasks x 2 epochs and the held-out scoring, a few minutes (niced, while
a client asks for predictions every 0.25 s); the two dev evaluations of CLUENER's 1,343 sentences ~1 min each; about
10 CPU minutes in all. ``--work`` keeps the Label Studio data, the versions (``versions/``: the new model, ~100 MB;
its ``checkpoint.pt`` is removed once it is scored) and the files sent; a rerun starts Label Studio, the versions and
the training from the export afresh.

A JSON line goes to ``results/label_studio.jsonl`` with its ``mode`` (``tiny`` / ``real``; ``--no-results``: printed
only, the screenshot in ``--work``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import date
from pathlib import Path

LABEL_STUDIO = "1.20.0"
VENV = Path(os.environ.get("ZHIE_LABEL_STUDIO_VENV")
            or Path.home() / ".cache" / "zhie" / f"label-studio-{LABEL_STUDIO}")
ROOT = Path(__file__).resolve().parents[1]
CONFIG = """<View>
  <Labels name="label" toName="text">
    <Label value="PER" background="#f4a582"/><Label value="LOC" background="#92c5de"/>
    <Label value="ORG" background="#a6dba0"/>
  </Labels>
  <Text name="text" value="$text"/>
</View>"""
USER, PASSWORD = "zhie@example.com", "zhie-label-studio"
EMOJI_TEXT = "😀王伟在青山市大学工作。"  # a character outside the BMP: offsets must count code points
COLOURS = ["#f4a582", "#92c5de", "#a6dba0", "#fddbc7", "#c2a5cf", "#ffffb3", "#fb8072", "#80b1d3", "#fdb462",
           "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5"]
REAL_RETRAIN_ARGS = "--epochs 2"
REAL_TEXTS, REAL_PREDICTED = 6, 5  # the real mode's B (besides the emoji text) and C tasks


def labelling_config(labels: list[str]) -> str:
    """A NER labelling config with ``labels`` (the real mode's; the tiny mode's is :data:`CONFIG`)."""
    tags = "".join(f'<Label value="{label}" background="{COLOURS[i % len(COLOURS)]}"/>'
                   for i, label in enumerate(labels))
    return f"""<View>
  <Labels name="label" toName="text">
    {tags}
  </Labels>
  <Text name="text" value="$text"/>
</View>"""


# ---------------------------------------------------------------------------------------------------- processes
def install(venv: Path) -> float:
    """Label Studio and its SDK in ``venv``, once (a marker file says it is done); the seconds it took."""
    marker = venv / "zhie-installed.txt"
    if marker.exists():
        return 0.0
    start = time.perf_counter()
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                    f"label-studio=={LABEL_STUDIO}", "label-studio-sdk"], check=True)
    versions = subprocess.run([str(venv / "bin" / "pip"), "freeze"], check=True, capture_output=True, text=True).stdout
    marker.write_text(versions, encoding="utf-8")
    return time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, process: subprocess.Popen, seconds: float, log: Path) -> float:
    """Poll ``url`` until it answers 200 (the seconds it took); fail if ``process`` ends or time runs out."""
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[:3]} ended with {process.returncode}; its log: {log}\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return time.perf_counter() - start
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} did not answer within {seconds:.0f} s; the log: {log}")


def zhie_cli(*args: str) -> str:
    """``zhie ARGS`` run with this worktree's code; its stdout (its stderr in the error if it fails)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([sys.executable, "-m", "zhie", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"zhie {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


# ---------------------------------------------------------------------------------------------------- the SDK side
def sdk(plan_file: str) -> None:
    """Run by the Label Studio venv's Python: the project, imports, the ML backend, predictions, the export."""
    from label_studio_sdk.client import LabelStudio

    plan = json.loads(Path(plan_file).read_text(encoding="utf-8"))
    ls = LabelStudio(base_url=plan["url"], api_key=plan["token"])
    project = ls.projects.create(title="zhie round trip", label_config=plan["config"])
    ids = {name: ls.projects.import_tasks(id=project.id, request=plan[name], return_task_ids=True).task_ids
           for name in ("gold", "texts", "predicted")}
    backend = ls.ml.create(url=plan["backend"], project=project.id, title="zhie", is_interactive=False)
    if backend.state != "CO":
        raise RuntimeError(f"the ML backend is not connected: {backend.state} {backend.error_message}")
    ls.actions.create(id="retrieve_tasks_predictions", project=project.id,
                      selected_items={"all": False, "included": ids["texts"]})
    stored = {t.id: t.predictions for t in ls.tasks.list(project=project.id, fields="all")}
    accepted = ids["texts"][: len(ids["texts"]) // 2]
    ls.actions.create(id="predictions_to_annotations", project=project.id,
                      selected_items={"all": False, "included": accepted})
    export = ls.projects.exports.as_json(project.id)
    Path(plan["export"]).write_text(json.dumps(export, ensure_ascii=False, indent=2), encoding="utf-8")
    ls.ml.train(id=backend.id)  # Label Studio sends START_TRAINING to the backend's /webhook
    predictions = {name: [[{"model_version": p["model_version"], "score": p.get("score"), "result": p["result"]}
                           for p in stored[i]] for i in ids[name]] for name in ("texts", "predicted")}
    print(json.dumps({"project": project.id, "ids": ids, "accepted": accepted, "predictions": predictions,
                      "backend": {"id": backend.id, "state": backend.state, "model_version": backend.model_version}},
                     ensure_ascii=False))


def sdk_retrieve(plan_file: str) -> None:
    """Run by the Label Studio venv's Python after the training: predictions retrieved again for the text tasks;
    the model versions Label Studio stored for each."""
    from label_studio_sdk.client import LabelStudio

    plan = json.loads(Path(plan_file).read_text(encoding="utf-8"))
    ls = LabelStudio(base_url=plan["url"], api_key=plan["token"])
    ls.actions.create(id="retrieve_tasks_predictions", project=plan["project"],
                      selected_items={"all": False, "included": plan["tasks"]})
    stored = {t.id: t.predictions for t in ls.tasks.list(project=plan["project"], fields="all")}
    print(json.dumps({"versions": [[p["model_version"] for p in stored[i]] for i in plan["tasks"]]}))


# ---------------------------------------------------------------------------------------------------- the page
def screenshot(url: str, project: int, task: int, out: Path) -> list[str]:
    """Log in, open ``task``'s labelling page, screenshot it to ``out``; the texts of its highlighted regions."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise RuntimeError("Debian's chromium is not installed (apt-get install -y chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 640})
        page.goto(f"{url}/user/login/", timeout=120_000)
        page.fill("input[name=email]", USER)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_load_state("networkidle", timeout=120_000)
        page.goto(f"{url}/projects/{project}/data?task={task}", timeout=120_000)
        page.wait_for_selector("span.htx-highlight", timeout=120_000)
        page.wait_for_load_state("networkidle", timeout=120_000)
        highlighted = [el.inner_text() for el in page.query_selector_all("span.htx-highlight")]
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        browser.close()
    return highlighted


# ---------------------------------------------------------------------------------------------------- the retraining
RETRAIN_ARGS = "--epochs 6 --lr 2e-3 --head-lr 2e-3 --batch-size 8 --seed 0"


def watch_training(backend: str, texts: list[str], seconds: float = 900, config: str = CONFIG) -> dict:
    """Ask ``backend`` for predictions every 0.25 s until its training has ended; the training's line, the answers
    and failures counted, and the versions that answered."""
    tasks = [{"id": i, "data": {"text": t}} for i, t in enumerate(texts)]
    body = json.dumps({"tasks": tasks, "label_config": config}).encode("utf-8")
    answers, failures, versions, start = 0, [], set(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        with urllib.request.urlopen(f"{backend}/versions", timeout=30) as answer:
            report = json.loads(answer.read())
        if report["state"] == "idle" and report["versions"] and not report["queued"]:
            return {"line": report["versions"][-1], "predict_requests": answers, "failed_requests": failures,
                    "versions_answering": sorted(versions)}
        request = urllib.request.Request(f"{backend}/predict", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                versions.add(json.loads(answer.read())["model_version"])
        except OSError as err:
            failures.append(str(err))
        answers += 1
        time.sleep(0.25)
    raise RuntimeError(f"the backend's training did not end within {seconds:.0f} s: {report}")


# ---------------------------------------------------------------------------------------------------- the run
def dev_f1(model: Path, dev_file: Path, out: Path) -> float:
    """``zhie eval MODEL --data DEV --json OUT``'s micro F1."""
    zhie_cli("eval", str(model), "--data", str(dev_file), "--json", str(out))
    return round(json.loads(out.read_text(encoding="utf-8"))["micro"]["f1"], 4)


def real_figures(work: Path, real: dict, setup: dict, retraining: dict, seconds: dict) -> dict:
    """The real mode's figures: both models scored on the dev set (``dev_f1_before``: the base model,
    ``dev_f1_new``: the version trained, ``dev_f1_after``: the one served after the training), with what the
    retraining's line says."""
    line = retraining["line"]
    start = time.perf_counter()
    before = dev_f1(setup["model"], setup["dev_file"], work / "dev-base.json")
    new = dev_f1(Path(line["model"]), setup["dev_file"], work / "dev-new.json") if line.get("model") else None
    seconds["dev_eval"] = round(time.perf_counter() - start, 1)
    for checkpoint in (work / "versions" / "runs").glob("*/run/checkpoint.pt"):  # done with; ~3x the model's size
        checkpoint.unlink()
    return {"mode": "real", "model": str(real["model"]), "dataset": real["dataset"],
            "data_files": [str(f) for f in real["data_files"]] if real["data_files"] else None,
            "exclude": str(real["exclude"]) if real["exclude"] else None, "seed": real["seed"],
            "retrain_args": setup["retrain_args"], "labels": setup["labels"],
            "pool": setup["pool"], "excluded_texts": setup["excluded"], "emoji_text": setup["emoji"],
            "dev_f1_before": before, "dev_f1_after": new if line.get("swapped") else before, "dev_f1_new": new,
            "held_out_f1_before": line.get("held_out_f1_current"), "held_out_f1_after": line.get("held_out_f1_new"),
            "swapped": line.get("swapped"), "outcome": line.get("outcome"),
            "predict_requests_during_training": retraining["predict_requests"],
            "failed_requests_during_training": len(retraining["failed_requests"]),
            "stored_model_versions": retraining["stored_after"], "command": "python " + shlex.join(sys.argv)}


def regions(result: list[dict]) -> list[tuple]:
    """The labelled regions of a Label Studio result: (start, end, label, text), sorted."""
    return sorted((r["value"]["start"], r["value"]["end"], r["value"]["labels"][0], r["value"]["text"])
                  for r in result if r["type"] == "labels")


def spans(spans) -> list[tuple]:
    return sorted((s.start, s.end, s.label, s.text) for s in spans)


def scores(result: list[dict]) -> list[float]:
    return [r["score"] for r in sorted(result, key=lambda r: (r["value"]["start"], r["value"]["end"]))]


def unchanged(pairs) -> tuple[int, int]:
    """(spans, spans of the pairs whose two sides are equal) over ``(expected, got)`` pairs of span lists."""
    pairs = list(pairs)
    return sum(len(a) for a, _ in pairs), sum(len(a) for a, b in pairs if a == b)


def tiny_setup(work: Path, seconds: dict) -> dict:
    """The tiny mode: a tiny model trained here on made-up sentences, tasks A, B and C from the same generator."""
    from tests.tiny_models import nested_corpus
    from zhie.data import NerExample, write_ner_jsonl

    start = time.perf_counter()
    write_ner_jsonl(nested_corpus(160, seed=1), work / "train.jsonl")
    write_ner_jsonl(nested_corpus(30, seed=2), work / "dev.jsonl")
    zhie_cli("train", "ner", "--train", str(work / "train.jsonl"), "--dev", str(work / "dev.jsonl"),
             "--encoder", "tiny", "--head", "egp", "--epochs", "3", "--lr", "2e-3", "--head-lr", "2e-3",
             "--max-length", "64", "--out", str(work / "model"), "--quiet")
    seconds["train_model"] = round(time.perf_counter() - start, 1)
    return {"model": work / "model" / "best", "config": CONFIG, "retrain_args": RETRAIN_ARGS,
            "gold": [NerExample(ex.text, sorted(ex.spans)) for ex in nested_corpus(80, seed=7)],  # 80 annotated
            "texts": [ex.text for ex in nested_corpus(6, seed=8)] + [EMOJI_TEXT],  # B: the emoji text is the page's
            "c_texts": [ex.text for ex in nested_corpus(5, seed=9)], "watch_s": 900}


def real_setup(work: Path, real: dict) -> dict:
    """The real mode: ``real["model"]`` served as it is; tasks A, B and C drawn from the dataset's training set (the
    module's doc)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ner import dataset_files

    import zhie
    from zhie.data import NerExample, read_ner
    from zhie.tasks.modeldir import resolve_model_dir

    model = resolve_model_dir(real["model"])
    if not (model / "zhie.json").is_file():
        raise SystemExit(f"--model {real['model']}: no zhie.json; a model directory written by `zhie train` is needed")
    meta = json.loads((model / "zhie.json").read_text(encoding="utf-8"))
    if meta.get("task") != "ner":
        raise SystemExit(f"--model {real['model']}: a {meta.get('task')} model; the backend retrains NER models")
    train_file, dev_file = real["data_files"] or dataset_files(real["dataset"], work / "dataset")
    dev_texts = {ex.text for ex in read_ner(dev_file)}
    excluded = {ex.text for ex in read_ner(real["exclude"])} if real["exclude"] else set()
    pool, seen = [], excluded | dev_texts
    for ex in read_ner(train_file):  # distinct texts, the first record of each
        if ex.text not in seen and ex.text.strip() and "\n" not in ex.text:
            seen.add(ex.text)
            pool.append(NerExample(ex.text, sorted(ex.spans)))
    random.Random(real["seed"]).shuffle(pool)
    if len(pool) < real["gold"] + REAL_TEXTS + REAL_PREDICTED:
        raise SystemExit(f"{train_file}: {len(pool)} texts to draw from, fewer than --gold {real['gold']} + "
                         f"{REAL_TEXTS + REAL_PREDICTED}")
    gold, rest = pool[: real["gold"]], [ex.text for ex in pool[real["gold"]:]]
    pipe = zhie.load(model)
    found: list[str] = []  # the next texts in which the model finds an entity: B's and C's
    for i in range(0, len(rest), 32):
        batch = rest[i:i + 32]
        found += [t for t, p in zip(batch, pipe.predict(batch)) if p]
        if len(found) >= REAL_TEXTS + REAL_PREDICTED:
            break
    if len(found) < REAL_TEXTS + REAL_PREDICTED:
        raise SystemExit(f"{model} finds entities in {len(found)} texts of the pool: too few for the B and C tasks")
    emoji = bool(pipe.predict([EMOJI_TEXT])[0])  # the emoji text only where it has a prediction to highlight
    del pipe
    labels = list(meta["labels"]) + sorted({s.label for ex in gold for s in ex.spans} - set(meta["labels"]))
    args = real["retrain_args"] if real["retrain_args"] is not None else REAL_RETRAIN_ARGS
    if "--seed" not in args.split() and not any(a.startswith("--seed=") for a in args.split()):
        args = f"{args} --seed {real['seed']}".strip()
    return {"model": model, "config": labelling_config(labels), "labels": labels, "retrain_args": args,
            "gold": gold, "texts": found[:REAL_TEXTS] + ([EMOJI_TEXT] if emoji else []),
            "c_texts": found[REAL_TEXTS:REAL_TEXTS + REAL_PREDICTED], "emoji": emoji, "dev_file": dev_file,
            "pool": len(pool), "excluded": len(excluded), "watch_s": 3600}


def run(work: Path, venv: Path, screenshot_path: Path, real: dict | None = None) -> dict:
    """The round trip (the module's doc): the tiny mode, or the real mode with ``real`` (``main``'s options)."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "src"))
    from common import machine

    import zhie
    from zhie.data import read_ner
    from zhie.data.ner import detect_format

    # a --work used before: Label Studio, the versions and the training from the export (its export differs) afresh
    for stale in ("label-studio-data", "versions", "from-export"):
        shutil.rmtree(work / stale, ignore_errors=True)
    seconds = {"install": round(install(venv), 1)}
    setup = tiny_setup(work, seconds) if real is None else real_setup(work, real)
    model, gold, texts, config = setup["model"], setup["gold"], setup["texts"], setup["config"]
    (work / "c.txt").write_text("\n".join(setup["c_texts"]) + "\n", encoding="utf-8")
    zhie_cli("predict", str(model), "--input", str(work / "c.txt"), "--output-format", "label-studio",
             "--output", str(work / "predicted.json"))
    predicted_file = json.loads((work / "predicted.json").read_text(encoding="utf-8"))

    token, port, backend_port = secrets.token_hex(16), free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "LABEL_STUDIO_BASE_DATA_DIR": str(work / "label-studio-data"), "LABEL_STUDIO_USERNAME": USER,
           "LABEL_STUDIO_PASSWORD": PASSWORD, "LABEL_STUDIO_USER_TOKEN": token,
           "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true", "LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK": "true",
           "COLLECT_ANALYTICS": "false"}
    processes = []
    try:
        log = work / "label-studio.log"
        with open(log, "wb") as f:
            processes.append(subprocess.Popen(
                [str(venv / "bin" / "label-studio"), "start", "--no-browser", "--internal-host", "127.0.0.1", "--port",
                 str(port)], env=env, stdout=f, stderr=subprocess.STDOUT, cwd=work))
        serve_log = work / "serve.log"
        with open(serve_log, "wb") as f:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "zhie", "serve", str(model), "--port", str(backend_port), "--retrain-dir",
                 str(work / "versions"), "--retrain-args", setup["retrain_args"]], stdout=f,
                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}))
        seconds["label_studio_start"] = round(wait_for(f"{url}/health", processes[0], 600, log), 1)
        wait_for(f"http://127.0.0.1:{backend_port}/label-studio/health", processes[1], 300, serve_log)

        start = time.perf_counter()
        gold_tasks = [{"data": {"text": ex.text}, "annotations": [{"result": [
            {"id": f"g{j}", "from_name": "label", "to_name": "text", "type": "labels",
             "value": {"start": s.start, "end": s.end, "text": s.text, "labels": [s.label]}}
            for j, s in enumerate(ex.spans)]}]} for ex in gold]
        plan = {"url": url, "token": token, "config": config, "backend": f"http://127.0.0.1:{backend_port}/label-studio",
                "gold": gold_tasks, "texts": [{"data": {"text": t}} for t in texts], "predicted": predicted_file,
                "export": str(work / "export.json")}
        (work / "plan.json").write_text(json.dumps(plan, ensure_ascii=False), encoding="utf-8")
        answer = subprocess.run([str(venv / "bin" / "python"), __file__, "--sdk", str(work / "plan.json")],
                                capture_output=True, text=True, check=False, cwd=work)
        if answer.returncode != 0:
            raise RuntimeError(f"the SDK steps failed:\n{answer.stderr[-4000:]}")
        done = json.loads(answer.stdout.strip().splitlines()[-1])
        seconds["sdk_steps"] = round(time.perf_counter() - start, 1)

        start = time.perf_counter()
        retraining = watch_training(f"http://127.0.0.1:{backend_port}/label-studio", texts, setup["watch_s"], config)
        seconds["retraining"] = round(time.perf_counter() - start, 1)
        again = {"url": url, "token": token, "project": done["project"], "tasks": done["ids"]["texts"]}
        (work / "again.json").write_text(json.dumps(again), encoding="utf-8")
        answer = subprocess.run([str(venv / "bin" / "python"), __file__, "--sdk-retrieve", str(work / "again.json")],
                                capture_output=True, text=True, check=False, cwd=work)
        if answer.returncode != 0:
            raise RuntimeError(f"retrieving predictions again failed:\n{answer.stderr[-4000:]}")
        stored_versions = json.loads(answer.stdout.strip().splitlines()[-1])["versions"]
        retraining["stored_after"] = sorted({v[-1] for v in stored_versions if v})

        # tiny: the emoji text, its prediction not accepted; real: the last B task not accepted with a prediction
        stored = done["predictions"]["texts"]
        page = len(texts) - 1 if real is None else \
            max(i for i in range(len(done["accepted"]), len(texts)) if stored[i] and stored[i][0]["result"])
        start = time.perf_counter()
        highlighted = screenshot(url, done["project"], done["ids"]["texts"][page], screenshot_path)
        seconds["screenshot"] = round(time.perf_counter() - start, 1)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()

    # what zhie predicts, against what went through Label Studio
    pipe = zhie.load(model)
    predicted = pipe.predict(texts)
    stored_b = [p[0]["result"] for p in done["predictions"]["texts"]]
    stored_c = [p[0]["result"] for p in done["predictions"]["predicted"]]
    imported = [t["predictions"][0]["result"] for t in predicted_file]
    export = work / "export.json"
    assert detect_format(export) == "label-studio", detect_format(export)
    read_back = read_ner(export)  # the annotated tasks, in the export's order: A, then the accepted B
    accepted = len(done["accepted"])
    assert [ex.text for ex in read_back] == [ex.text for ex in gold] + texts[:accepted], [ex.text for ex in read_back]
    checks = {"backend_predictions": unchanged((spans(p), regions(r)) for p, r in zip(predicted, stored_b)),
              "imported_predictions": unchanged((regions(a), regions(b)) for a, b in zip(imported, stored_c)),
              "gold_annotations": unchanged((spans(ex.spans), spans(r.spans)) for ex, r in zip(gold, read_back)),
              "accepted_annotations": unchanged((spans(p), spans(r.spans))
                                                for p, r in zip(predicted, read_back[len(gold):])),
              "page_highlights": unchanged([(sorted(s.text for s in predicted[page]), sorted(highlighted))])}
    score_diff = max(abs(a - round(s.score, 4)) for p, r in zip(predicted, stored_b)
                     for a, s in zip(scores(r), sorted(p, key=lambda s: (s.start, s.end))))
    score_diff = max([score_diff] + [abs(a - b) for x, y in zip(imported, stored_c)
                                     for a, b in zip(scores(x), scores(y))])

    start = time.perf_counter()
    trained = zhie_cli("train", "ner", "--train", str(export), "--dev", str(export), "--format", "auto",
                   "--encoder", "tiny", "--epochs", "1", "--out", str(work / "from-export"), "--quiet")
    seconds["train_from_export"] = round(time.perf_counter() - start, 1)
    best = json.loads(trained.strip().splitlines()[-1])
    labels = json.loads((work / "from-export" / "best" / "zhie.json").read_text(encoding="utf-8"))["labels"]
    versions = dict(line.split("==") for line in (venv / "zhie-installed.txt").read_text().split() if "==" in line)
    head = {"mode": "tiny"} if real is None else \
        {**real_figures(work, real, setup, retraining, seconds), "page_text": texts[page]}
    return {**head, "date": date.today().isoformat(), "label_studio": versions.get("label-studio"),
            "label_studio_sdk": versions.get("label-studio-sdk"), "backend": done["backend"],
            "tasks": {"gold": len(gold), "backend_predicted": len(texts), "accepted": accepted,
                      "imported_predicted": len(predicted_file)},
            "checks": {k: {"spans": n, "unchanged": ok} for k, (n, ok) in checks.items()},
            "spans_checked": sum(n for n, _ in checks.values()),
            "spans_unchanged": sum(ok for _, ok in checks.values()),
            "trained_from_export": {"labels": labels, "dev_f1": round(best["best"]["f1"], 4)},
            "retraining": retraining,
            "max_score_difference": round(score_diff, 6), "page_highlights": highlighted,
            "screenshot": str(screenshot_path.relative_to(ROOT) if screenshot_path.is_relative_to(ROOT) else
                              screenshot_path), "seconds": seconds,
            "machine": machine()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--venv", type=Path, default=VENV, help=f"Label Studio's venv, made once (default {VENV})")
    p.add_argument("--work", type=Path, default=None, help="working directory (default: a temporary one, removed)")
    p.add_argument("--no-results", action="store_true",
                   help="print the row only; the screenshot goes to --work (what the pytest test runs)")
    p.add_argument("--retrain-args", default=None,
                   help=f"zhie serve's --retrain-args (default: {RETRAIN_ARGS!r}; with --model: "
                        f"{REAL_RETRAIN_ARGS!r}, and --seed SEED when they name none)")
    real = p.add_argument_group("the real mode (a trained model; without --model: the tiny mode)")
    real.add_argument("--model", type=Path, default=None, help="a trained NER model (or its run directory): served "
                      "and retrained as it is")
    real.add_argument("--dataset", choices=("cluener", "cmeee", "peoples_daily"), default=None,
                      help="the texts and gold annotations: benchmarks/ner.py's files (default cluener)")
    real.add_argument("--data-files", type=Path, nargs=2, default=None, metavar=("TRAIN", "DEV"),
                      help="these train and dev files instead of --dataset's (a smoke run with a small model)")
    real.add_argument("--gold", type=int, default=None, help="texts imported with their gold annotations (default "
                      "400; one in five is held out by the backend)")
    real.add_argument("--exclude", type=Path, default=None,
                      help="a NER file (any format zhie reads) whose texts are not drawn: the model's training set")
    real.add_argument("--seed", type=int, default=None, help="the draw of the texts, and the retraining's seed "
                      "(default 1)")
    p.add_argument("--sdk", default=None, help=argparse.SUPPRESS)  # the Label Studio venv's side
    p.add_argument("--sdk-retrieve", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sdk or args.sdk_retrieve:
        sdk(args.sdk) if args.sdk else sdk_retrieve(args.sdk_retrieve)
        return 0
    given = [f"--{name.replace('_', '-')}" for name in ("dataset", "data_files", "gold", "exclude", "seed")
             if getattr(args, name) is not None]
    if args.model is None and given:
        p.error(f"{', '.join(given)}: only with --model (the real mode)")
    if args.gold is not None and args.gold < 10:
        p.error("--gold: at least 10 (the backend's --retrain-min-tasks)")
    settings = None if args.model is None else {
        "model": args.model, "dataset": args.dataset or "cluener", "data_files": args.data_files,
        "gold": 400 if args.gold is None else args.gold, "exclude": args.exclude,
        "seed": 1 if args.seed is None else args.seed, "retrain_args": args.retrain_args}
    work = args.work or Path(tempfile.mkdtemp(prefix="zhie-label-studio-"))
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import RESULTS, append_result, machine_lock

    name = "label_studio_page.png" if settings is None else "label_studio_page_real.png"
    shot = work / name if args.no_results else RESULTS / name
    # the real mode measures a training: the machine to itself (the tiny one, pytest's, runs beside anything)
    with machine_lock() if settings is not None else contextlib.nullcontext():
        start = time.perf_counter()
        try:
            row = run(work, args.venv, shot, settings)
        finally:
            if args.work is None:
                shutil.rmtree(work, ignore_errors=True)
        row["seconds"]["total"] = round(time.perf_counter() - start, 1)
        if args.no_results:
            print(json.dumps(row, ensure_ascii=False))
        else:
            append_result("label_studio", row)
    line = row["retraining"]["line"]
    ok = row["spans_unchanged"] == row["spans_checked"] > 0 and row["max_score_difference"] <= 1e-3 and \
        not row["retraining"]["failed_requests"] and "held_out_f1_new" in line and \
        row["retraining"]["stored_after"] == [line.get("model_version", row["backend"]["model_version"])]
    print(f"retraining: {line['outcome']}; {row['retraining']['predict_requests']} prediction requests meanwhile, "
          f"{len(row['retraining']['failed_requests'])} failed", file=sys.stderr)
    print(f"{row['spans_unchanged']} of {row['spans_checked']} spans went around the loop unchanged", file=sys.stderr)
    if settings is not None:
        print(f"dev F1 {row['dev_f1_before']} before, {row['dev_f1_after']} after (the new version: "
              f"{row['dev_f1_new']})", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
