"""New versions of a served NER model trained from a Label Studio project's annotations (``zhie serve MODEL
--retrain-dir DIR``; :class:`Retraining`, :class:`Retrainer`).

Label Studio asks its ML backend to train with a ``START_TRAINING`` event on the backend's ``/webhook`` (the model's
"Start Training" in the project's settings; or every N annotations, where the project's "Start model training on
annotation submission" asks for it). A training, in a thread of the service that waits on processes of its own:

1. **fetch** the project's annotated tasks from Label Studio (``GET /api/projects/ID/export?exportType=JSON``, with
   ``Authorization: Token TOKEN``): the address and token are ``LABEL_STUDIO_URL`` and ``LABEL_STUDIO_API_KEY`` where
   set, else the ``hostname`` and ``access_token`` that Label Studio sent to ``/setup`` when the model was connected;
2. **split** them (:func:`held_out`): a task whose text's sha256 is 0 modulo :data:`HOLD_OUT` is held out, the rest
   train; a task never changes side as annotations grow, and the same text is never on both sides. With
   ``--retrain-dev FILE`` (a labelled file, e.g. the dev set of the project's task) every task trains and the file
   scores;
3. **train** ``zhie train ner --from CURRENT --train train.jsonl --dev heldout.jsonl --out DIR/runs/KEY --quiet``
   with ``--retrain-args``, niced: warm-started from the model being served, on ``zhie train``'s engine and
   configuration, a label that the project added becoming a new entity type (``--from``'s rules). KEY hashes the
   current model's version, both files and the arguments: the same training asked again is reused when it finished
   and resumes exactly when it was cut off (``zhie train``'s run lock and checkpoint);
4. **score** the current model and the new one on the held-out tasks (``zhie eval``, each in a process of its own;
   a run's scores are kept in it, so a training asked again is not scored again);
5. **swap**: the new model is loaded and served if its F1 is at least the current one's: predictions made after
   carry its ``model_version``. Until then, and always when it is worse, they come from the current model, and the
   service answers as before (the training runs in other processes, niced).

Every attempt appends a line to ``DIR/versions.jsonl`` (``GET /label-studio/versions`` answers them with the state
now); ``DIR/current.json`` names the model served last, which ``zhie serve MODEL --retrain-dir DIR`` serves again
after a restart. A ``START_TRAINING`` that comes during a training asks for one more after it, on the annotations of
then. Other events that Label Studio sends to ``/webhook`` (annotations created, tasks deleted, ...) need nothing:
the annotations are fetched when a training starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from zhie.core.files import append_whole, atomic_write_text
from zhie.core.options import option, positive_int
from zhie.data import label_studio, read_ner, write_ner_jsonl
from zhie.tasks.modeldir import resolve_model_dir

__all__ = ["HOLD_OUT", "Retrainer", "Retraining", "held_out", "served_model"]

logger = logging.getLogger(__name__)

HOLD_OUT = 5  # one task in HOLD_OUT is held out to score the versions
SET_HERE = ("--train", "--dev", "--out", "--from", "--format", "--config")  # what a training's command line sets
FETCH_TIMEOUT_S = 120
CURRENT = "current.json"
VERSIONS = "versions.jsonl"


@dataclass(frozen=True)
class Retraining:
    """How ``zhie serve`` trains new versions of its model from Label Studio (off without ``retrain_dir``)."""

    retrain_dir: str | None = option(None, "train new versions of the NER model from a Label Studio project's "
                                           "annotations when Label Studio asks (START_TRAINING), each run, the "
                                           "annotations and versions.jsonl in DIR; off without it", metavar="DIR")
    retrain_args: str | None = option(None, "zhie train ner flags for each version, quoted as one argument (e.g. "
                                            "'--epochs 2 --lr 5e-5'); the model's own settings otherwise",
                                      metavar="ARGS")
    retrain_min_tasks: int = option(10, "annotated tasks needed to train a version (one in 5 is held out)",
                                    type=positive_int, metavar="N")
    retrain_dev: str | None = option(None, "score the versions on this labelled file (a format zhie train reads) "
                                           "instead of one annotated task in 5, which then trains too",
                                     metavar="FILE")


def held_out(text: str) -> bool:
    """Whether a task of this text scores the versions instead of training them (one text in :data:`HOLD_OUT`)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") % HOLD_OUT == 0


def served_model(model_dir: str, retrain_dir: str | None) -> str:
    """The model that ``zhie serve model_dir --retrain-dir retrain_dir`` serves: the last version swapped in from
    ``model_dir`` (``retrain_dir/current.json``), or ``model_dir``."""
    if retrain_dir is None or not (Path(retrain_dir) / CURRENT).is_file():
        return model_dir
    current = json.loads((Path(retrain_dir) / CURRENT).read_text(encoding="utf-8"))
    if current.get("base") != str(resolve_model_dir(model_dir).resolve()) or not Path(current["model"]).is_dir():
        return model_dir
    logger.warning("serving %s, the version last trained from %s in %s", current["model"], model_dir, retrain_dir)
    return current["model"]


def zhie_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "zhie", *args]


class Retrainer:
    """The trainings of one served model (see the module's doc): :meth:`remember` what ``/setup`` says, :meth:`start`
    on ``START_TRAINING``, :meth:`report` for ``/label-studio/versions``. ``swap(model_dir)`` loads a model and serves
    it (the service's)."""

    def __init__(self, settings: Retraining, model_dir: str, task_name: str, version: str, swap) -> None:
        if task_name != "ner":
            raise ValueError(f"--retrain-dir: a {task_name} model; new versions are trained for NER models (zhie "
                             "train ner --from)")
        model = resolve_model_dir(model_dir)
        if (model / "export.json").is_file():
            raise ValueError(f"--retrain-dir: {model_dir} is an export; new versions start from a trained model: "
                             "serve the model directory it was exported from")
        args = shlex.split(settings.retrain_args or "")
        if taken := [a for a in args if a.split("=")[0] in SET_HERE]:
            raise ValueError(f"--retrain-args {settings.retrain_args!r}: {', '.join(taken)} is set for each training "
                             f"(it sets {', '.join(SET_HERE)})")
        self.dir = Path(settings.retrain_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.args, self.min_tasks, self.swap = args, settings.retrain_min_tasks, swap
        self.dev_file = settings.retrain_dev
        self.dev = read_ner(self.dev_file, "auto") if self.dev_file else None  # None: held-out tasks score
        self.model, self.version = model.resolve(), version
        self.base = str(self.model) if not (self.dir / CURRENT).is_file() else \
            json.loads((self.dir / CURRENT).read_text(encoding="utf-8"))["base"]
        self.places: dict[str, tuple[str, str]] = {}  # project id -> (Label Studio's address, token), from /setup
        self.state, self.again, self.lock = "idle", None, threading.Lock()
        self.thread: threading.Thread | None = None
        self.process: subprocess.Popen | None = None  # the training's (or scoring's) process, while it runs
        self.stopped = False

    def run_quietly(self, command: list[str], log: Path) -> None:
        """Run ``command`` niced, its output to ``log`` (:meth:`stop` ends it); a failure raises RuntimeError with
        the log's last lines."""
        with open(log, "ab") as out, self.lock:
            if self.stopped:
                raise RuntimeError("the service is stopping")
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                            preexec_fn=lambda: os.nice(10))
        code = self.process.wait()
        if code != 0:
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-6:]
            raise RuntimeError(f"`zhie {command[3]}` failed ({code}): " + " | ".join(tail))

    def stop(self, seconds: float = 30) -> None:
        """End the training process, if one runs (the service stops): SIGTERM, then SIGKILL after ``seconds``; the
        run resumes from its checkpoint when the same training is asked for again."""
        with self.lock:
            self.stopped, process = True, self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(seconds)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def check_args(self) -> None:
        """Refuse, before the service starts, ``--retrain-args`` that ``zhie train ner`` would refuse."""
        done = subprocess.run(zhie_command("train", "ner", "--train", "x.jsonl", "--from", str(self.model), "--out",
                                           str(self.dir / "runs" / "check"), *self.args, "--print-config"),
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ValueError(f"--retrain-args: {' '.join(self.args)}: "
                             f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")

    def remember(self, project: object, hostname: object, token: object) -> None:
        """Label Studio's address and token for ``project`` (its ``/setup``: ``"ID.TIMESTAMP"``)."""
        if isinstance(project, (str, int)) and isinstance(hostname, str) and isinstance(token, str) and token:
            self.places[str(project).split(".")[0]] = (hostname.rstrip("/"), token)

    def place(self, project_id: str) -> tuple[str, str]:
        url, token = os.environ.get("LABEL_STUDIO_URL"), os.environ.get("LABEL_STUDIO_API_KEY")
        if url and token:
            return url.rstrip("/"), token
        if project_id in self.places:
            return self.places[project_id]
        raise LookupError(f"no Label Studio address and token for project {project_id} to fetch its annotations "
                          "from: connect the model to the project again (Label Studio sends them to /setup), or set "
                          "LABEL_STUDIO_URL and LABEL_STUDIO_API_KEY where zhie serve runs")

    def start(self, project_id: str) -> str:
        """Train a new version from ``project_id``'s annotations in the background; ``"started"``, or ``"queued"``
        when a training runs (one more follows it). LookupError when the project's Label Studio is unknown."""
        place = self.place(project_id)
        with self.lock:
            if self.thread is not None and self.thread.is_alive():
                self.again = (project_id, place)
                return "queued"
            self.thread = threading.Thread(target=self._trainings, args=(project_id, place), daemon=True,
                                           name="zhie-retrain")
            self.state = "starting"
            self.thread.start()
        return "started"

    def report(self) -> dict:
        versions = []
        if (self.dir / VERSIONS).is_file():
            versions = [json.loads(line) for line in (self.dir / VERSIONS).read_text(encoding="utf-8").splitlines()
                        if line.strip()]
        return {"state": self.state, "queued": self.again is not None, "model": str(self.model),
                "model_version": self.version, "versions": versions}

    def wait(self, timeout: float | None = None) -> None:
        """Until the trainings asked for so far have ended (tests, shutdown)."""
        while (thread := self.thread) is not None and thread.is_alive():
            thread.join(timeout)
            if timeout is not None:
                return

    def _trainings(self, project_id: str, place: tuple[str, str]) -> None:
        while True:
            self._record(self._train(project_id, place))
            with self.lock:
                if self.again is None:
                    self.state = "idle"
                    return
                (project_id, place), self.again = self.again, None

    def _record(self, line: dict) -> None:
        line["date"] = datetime.now(UTC).isoformat(timespec="seconds")
        append_whole(self.dir / VERSIONS, (json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))
        logger.warning("retraining: %s", line.get("outcome"))

    def _train(self, project_id: str, place: tuple[str, str]) -> dict:
        start = time.perf_counter()
        line = {"project": project_id, "from_version": self.version, "from_model": str(self.model)}
        try:
            line = self._attempt(project_id, place, line)
        except Exception as err:  # recorded, and the service goes on with the model it has
            logger.warning("retraining failed", exc_info=err)
            line |= {"swapped": False, "outcome": f"failed: {err}"}
        line["seconds"] = round(time.perf_counter() - start, 1)
        return line

    def _attempt(self, project_id: str, place: tuple[str, str], line: dict) -> dict:
        """One training (the module's steps), its figures added to ``line`` as they come."""
        self.state = "fetching"
        tasks = fetch_export(*place, project_id)
        work = self.dir / "annotations" / project_id
        work.mkdir(parents=True, exist_ok=True)
        atomic_write_text(work / "export.json", json.dumps(tasks, ensure_ascii=False))
        examples = label_studio.read_entities(work / "export.json") if tasks else []
        if self.dev is None:
            train, dev = [ex for ex in examples if not held_out(ex.text)], [ex for ex in examples if held_out(ex.text)]
        else:  # --retrain-dev: every annotated task trains
            train, dev = examples, self.dev
        line |= {"annotated_tasks": len(examples), "train_tasks": len(train), "held_out_tasks": len(dev),
                 "scored_on": self.dev_file or "held-out tasks"}
        if len(examples) < self.min_tasks or not dev or not train:
            return line | {"swapped": False, "outcome": f"not trained: {len(examples)} annotated tasks, "
                                                          f"{len(train)} to train on, {len(dev)} to score; a version "
                                                          f"needs {self.min_tasks} (--retrain-min-tasks), some of "
                                                          "each"}
        write_ner_jsonl(train, work / "train.jsonl")
        write_ner_jsonl(dev, work / "heldout.jsonl")
        files = {name: (work / name).read_text("utf-8") for name in ("train.jsonl", "heldout.jsonl")}
        key = hashlib.sha256("\n".join([self.version, *self.args, *files.values()]).encode("utf-8")).hexdigest()[:12]
        run = self.dir / "runs" / key
        run.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():  # the run's own copies: the next fetch rewrites work/
            atomic_write_text(run / name, text)
        log = run / "zhie.log"
        self.state = "training"
        self.run_quietly(zhie_command("train", "ner", "--from", str(self.model), "--train", str(run / "train.jsonl"),
                                 "--dev", str(run / "heldout.jsonl"), "--format", "jsonl", "--out", str(run / "run"),
                                 "--quiet", *self.args), log)
        new = resolve_model_dir(run / "run")
        self.state = "scoring"
        scores = {}
        for name, model in (("current", self.model), ("new", new)):
            if not (run / f"heldout-{name}.json").is_file():  # written whole (atomically), once per run
                self.run_quietly(zhie_command("eval", str(model), "--data", str(run / "heldout.jsonl"), "--format",
                                         "jsonl", "--json", str(run / f"heldout-{name}.json")), log)
            scores[name] = json.loads((run / f"heldout-{name}.json").read_text(encoding="utf-8"))["micro"]["f1"]
        line |= {"run": str(run), "model": str(new), "held_out_f1_current": scores["current"],
                 "held_out_f1_new": scores["new"]}
        if scores["new"] < scores["current"]:
            return line | {"swapped": False, "outcome": f"kept {self.version}: the new version scores "
                                                        f"{scores['new']:.4f} on {line['scored_on']}, the current "
                                                        f"{scores['current']:.4f}"}
        self.state = "loading"
        version = self.swap(str(new))
        self.model, self.version = new.resolve(), version
        atomic_write_text(self.dir / CURRENT, json.dumps({"model": str(self.model), "model_version": version,
                                                          "base": self.base}, ensure_ascii=False))
        return line | {"model_version": version, "swapped": True,
                       "outcome": f"serving {version}: {scores['new']:.4f} on {line['scored_on']}, the previous "
                                  f"{scores['current']:.4f}"}


def fetch_export(url: str, token: str, project_id: str) -> list:
    """A Label Studio project's annotated tasks (its JSON export), or an error that says what failed."""
    address = f"{url}/api/projects/{project_id}/export?exportType=JSON&download_all_tasks=false"
    request = urllib.request.Request(address, headers={"Authorization": f"Token {token}"})
    try:
        with contextlib.closing(urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S)) as answer:
            tasks = json.loads(answer.read())
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"Label Studio answered {err.code} to {address}" + (
            " (the token is refused: a legacy API token is needed, or set LABEL_STUDIO_API_KEY)"
            if err.code in (401, 403) else "")) from None
    except (OSError, ValueError) as err:
        raise RuntimeError(f"could not fetch {address}: {err}") from None
    if not isinstance(tasks, list):
        raise RuntimeError(f"{address} answered a JSON {type(tasks).__name__}, not Label Studio's list of tasks")
    return tasks
