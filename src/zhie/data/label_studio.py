"""Label Studio: its JSON export read as training data, and zhie's predictions written as its pre-annotations.

**Reading** (``--format label-studio``, or ``auto`` for a JSON list of tasks with ``data`` and ``annotations``): the
export Label Studio writes with "Export → JSON", a JSON list of tasks ``{"id", "data": {"text": ...},
"annotations": [{"result": [...], "was_cancelled", "ground_truth", "updated_at", ...}], ...}``. The text is
``data["text"]`` (or the one string field of ``data``). Of a task's annotations one is taken: among those not
cancelled, the ground-truth ones if any, the latest of them (``updated_at``, else ``created_at``, else the last in
the list); a task with none (not annotated yet, or only skipped) is left out and counted in the log. Its results:

* ``labels`` results ``{"id", "type": "labels", "value": {"start", "end", "text", "labels": [...]}}`` are spans
  (character offsets, end exclusive; a region with several labels is one span per label, and two regions of one
  range and label are one span): the entities of NER,
  the words of word segmentation (every labelled region a word, whatever its label; the words must not overlap,
  and what lies between them must be whitespace, which is dropped, as in segmented text), the mentions of
  relations (their labels the types);
* ``relation`` results ``{"type": "relation", "from_id", "to_id", "labels": [...], "direction"}`` link two regions
  of the same annotation: ``from_id`` is the subject and ``to_id`` the object (``direction: "left"`` swaps them), one
  triple per label;
* other results (choices, text areas, ratings...) are not read. Predictions in the export are not read either: only
  the annotations are labels.

A ``value.text`` must be the text at ``[start, end)``; offsets that count UTF-16 code units (what a browser counts,
so that a character outside the BMP, an emoji, counts twice) are recognised as such when ``value.text`` matches
there and converted. Anything else that cannot be taken raises :class:`~zhie.data.DataError` naming the file, the
line where the task starts and the task (``export.json:12: task 3 (id 17): ...``).

**Writing** (:func:`prediction_task`, ``zhie predict --output-format label-studio`` and ``zhie serve``'s
``/label-studio/`` routes): a task ``{"data": {"text"}, "predictions": [{"model_version", "score", "result"}]}`` whose
``result`` items are ``labels`` results (``from_name``, ``to_name``, ``type``, ``value``, ``score``) and, for
relations, ``relation`` results between them, which a project with a matching labelling config imports as they are.
"""

from __future__ import annotations

import hashlib
import logging
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

from zhie.core.spans import Span
from zhie.data.base import DataError, PathLike, iter_json_list, shown
from zhie.data.cws import words_to_example
from zhie.data.example import NerExample
from zhie.data.spo import SpoExample, Triple

FORMAT = "label-studio"
WORD_LABEL = "WORD"  # the label of a word region that zhie writes, when the labelling config does not name one
OUTPUT_KEYS = ("entities", "words", "relations")  # the predictions (a task's output_key) Label Studio is given
ENTITY_LABEL = "ENTITY"  # the label of a relation's mention that has no type (GPLinker predicts none)
logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------- detection
def is_export(path: PathLike) -> bool:
    """Whether the file ``path`` is a Label Studio export: a JSON list whose first element is a task, an object with
    ``data`` and ``annotations`` (or ``predictions``). Only the first element is decoded."""
    try:
        with open(path, "rb") as f:
            if not f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
                return False
        first = next(iter_json_list(path))[1]
    except (DataError, StopIteration, OSError):
        return False
    return isinstance(first, dict) and isinstance(first.get("data"), dict) and \
        ("annotations" in first or "predictions" in first)


def asked(path: PathLike, format: str) -> bool:
    """Whether ``--format FORMAT`` asks to read ``path`` as a Label Studio export: ``label-studio``, or ``auto`` and
    the file is one (:func:`is_export`)."""
    return format == FORMAT or (format == "auto" and is_export(path))


# ---------------------------------------------------------------------------------------------------- reading
@dataclass
class Labelled:
    """One task of an export with the annotation taken from it: its text, its labelled regions by id (a region of
    several labels: one span per label) and its relations ``(subject id, object id, predicate, result index)``."""

    where: str  # "task 3 (id 17)", for errors
    lineno: int
    text: str
    regions: dict[str, list[Span]] = field(default_factory=dict)
    relations: list[tuple[str, str, str, int]] = field(default_factory=list)

    def spans(self) -> list[Span]:
        return sorted({s for spans in self.regions.values() for s in spans})


def _fail(path: PathLike, lineno: int, where: str, reason: str) -> DataError:
    return DataError(path, lineno, f"{where}: {reason}")


def _task_text(path, lineno: int, where: str, data: object) -> str:
    if not isinstance(data, dict):
        raise _fail(path, lineno, where, f"'data' must be an object with the text, got {type(data).__name__}")
    if "text" in data:
        key = "text"
    else:
        strings = [k for k, v in data.items() if isinstance(v, str)]
        if len(strings) != 1:
            fields = ", ".join(shown(k)[1:-1] for k in list(data)[:8]) + (", ..." if len(data) > 8 else "") or "none"
            raise _fail(path, lineno, where, f"no field 'text' in 'data' (fields: {fields}), and not one string field "
                                             "to take instead: name the text field 'text'")
        key = strings[0]
    if not isinstance(data[key], str):
        raise _fail(path, lineno, where, f"data[{shown(key)}] must be a string, got {type(data[key]).__name__}")
    return data[key]


def _annotation(path, lineno: int, where: str, task: dict) -> tuple[int, dict] | None:
    """``(index, annotation)`` taken from ``task`` (see the module's doc), or None when it has none to take."""
    annotations = task.get("annotations", [])
    if not isinstance(annotations, list):
        raise _fail(path, lineno, where, f"'annotations' must be a list, got {type(annotations).__name__}")
    kept = []
    for i, a in enumerate(annotations):
        if not isinstance(a, dict):
            raise _fail(path, lineno, where, f"annotations[{i}] must be an object, got {type(a).__name__}")
        if not a.get("was_cancelled"):
            kept.append((i, a))
    if any(a.get("ground_truth") for _, a in kept):
        kept = [(i, a) for i, a in kept if a.get("ground_truth")]
    if not kept:
        return None
    return max(kept, key=lambda ia: (str(ia[1].get("updated_at") or ia[1].get("created_at") or ""), ia[0]))


def utf16_to_chars(text: str, offset: int) -> int | None:
    """The character offset in ``text`` of the UTF-16 code unit ``offset`` (None inside a surrogate pair or past the
    end)."""
    units = 0
    for i, ch in enumerate(text):
        if units == offset:
            return i
        units += 2 if ord(ch) > 0xFFFF else 1
        if units > offset:
            return None
    return len(text) if units == offset else None


def _region(path, lineno: int, where: str, text: str, k: int, value: object) -> tuple[int, int, list[str]]:
    what = f"result[{k}]"
    if not isinstance(value, dict):
        raise _fail(path, lineno, where, f"{what}: 'value' must be an object, got {type(value).__name__}")
    start, end, labels = value.get("start"), value.get("end"), value.get("labels")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, end)):
        raise _fail(path, lineno, where, f"{what}: 'value' needs integer character offsets 'start' and 'end', got "
                                         f"{shown(start)}, {shown(end)} (is this a region of text? HyperText and "
                                         f"Paragraphs regions are not read)")
    if not (isinstance(labels, list) and labels and all(isinstance(x, str) and x for x in labels)):
        raise _fail(path, lineno, where, f"{what}: 'value.labels' must be a non-empty list of labels, got "
                                         f"{shown(labels)}")
    mention = value.get("text")
    if mention is not None and not isinstance(mention, str):
        raise _fail(path, lineno, where, f"{what}: 'value.text' must be a string, got {type(mention).__name__}")
    if 0 <= start < end <= len(text) and (mention is None or text[start:end] == mention):
        return start, end, labels
    a, b = utf16_to_chars(text, start), utf16_to_chars(text, end)  # a browser's offsets (UTF-16 code units)?
    if mention is not None and a is not None and b is not None and a < b and text[a:b] == mention:
        return a, b, labels
    reads = shown(text[start:end]) if 0 <= start < end <= len(text) else \
        f"nothing (the text has {len(text)} characters)"
    raise _fail(path, lineno, where, f"{what}: the offsets [{shown(start)}, {shown(end)}) do not match 'value.text' "
                                     f"{shown(mention)}: the text reads {reads} there; fix the region in Label Studio "
                                     "and export again")


def _labelled(path, lineno: int, index: int, task: object) -> Labelled | None:
    if not isinstance(task, dict):
        raise DataError(path, lineno, f"task {index}: expected a JSON object, got {type(task).__name__}")
    where = f"task {index}" + (f" (id {shown(task['id'])})" if "id" in task else "")
    text = _task_text(path, lineno, where, task.get("data"))
    taken = _annotation(path, lineno, where, task)
    if taken is None:
        return None
    a, annotation = taken
    where = f"{where}, annotations[{a}]" + (f" (id {shown(annotation['id'])})" if "id" in annotation else "")
    result = annotation.get("result", [])
    if not isinstance(result, list):
        raise _fail(path, lineno, where, f"'result' must be a list, got {type(result).__name__}")
    out, links = Labelled(where, lineno, text), []
    for k, item in enumerate(result):
        if not isinstance(item, dict):
            raise _fail(path, lineno, where, f"result[{k}] must be an object, got {type(item).__name__}")
        if item.get("type") == "labels":
            start, end, labels = _region(path, lineno, where, text, k, item.get("value"))
            region = str(item.get("id", f"#{k}"))
            out.regions.setdefault(region, []).extend(Span(start, end, label, text[start:end]) for label in labels)
        elif item.get("type") == "relation":
            links.append((k, item))
    for k, item in links:
        ends = [item.get("from_id"), item.get("to_id")]
        missing = [str(x) for x in ends if str(x) not in out.regions]
        if missing:
            raise _fail(path, lineno, where, f"result[{k}]: a relation from {shown(ends[0])} to {shown(ends[1])}, but "
                                             f"no labelled region of this annotation has the id "
                                             f"{' or '.join(map(shown, missing))}; a relation links two labelled spans")
        labels = item.get("labels")
        if not (isinstance(labels, list) and labels and all(isinstance(x, str) and x for x in labels)):
            raise _fail(path, lineno, where, f"result[{k}]: a relation from {shown(ends[0])} to {shown(ends[1])} "
                                             "without a label (its predicate): label it in Label Studio (<Relations> "
                                             "in the labelling config) and export again")
        direction = item.get("direction", "right")
        if direction not in ("right", "left"):
            raise _fail(path, lineno, where, f"result[{k}]: a relation with direction {shown(direction)} has no "
                                             "subject and object; make it point from the subject to the object "
                                             "(right)")
        subject, obj = (ends if direction == "right" else ends[::-1])
        out.relations += [(str(subject), str(obj), label, k) for label in labels]
    return out


def read_tasks(path: PathLike) -> list[Labelled]:
    """The annotated tasks of a Label Studio export, each with the annotation taken from it (see the module's doc);
    the tasks left out are counted in the log. An export with no annotated task raises :class:`DataError`."""
    out, unannotated, several = [], 0, 0
    for index, (lineno, task) in enumerate(iter_json_list(path)):
        labelled = _labelled(path, lineno, index, task)
        if labelled is None:
            unannotated += 1
            continue
        several += sum(not a.get("was_cancelled") for a in task.get("annotations", [])) > 1
        out.append(labelled)
    if several:
        logger.info("%s: %d task(s) have several annotations; of each, the latest not cancelled (ground truth first) "
                    "was taken", path, several)
    if unannotated:
        logger.warning("%s: %d task(s) without an annotation (not annotated yet, or skipped) were left out",
                       path, unannotated)
    if not out:
        raise DataError(path, 1, f"no annotated task: the {unannotated} task(s) of this export have no annotation that "
                                 "is not cancelled; annotate them in Label Studio and export again")
    return out


def read_entities(path: PathLike) -> list[NerExample]:
    """NER examples of a Label Studio export: each annotated task's text and its labelled spans (nested and
    overlapping spans kept: whether a head can learn them is the task's to say)."""
    return [NerExample(t.text, t.spans(), source=f"{path}:{t.lineno}: {t.where}") for t in read_tasks(path)]


def read_words(path: PathLike) -> list[NerExample]:
    """Word segmentation examples of a Label Studio export: every labelled region of a task is a word; the words
    must not overlap and only whitespace may lie between them (it is dropped, as in segmented text)."""
    out = []
    for t in read_tasks(path):
        words, at = [], 0
        for span in sorted({(s.start, s.end) for s in t.spans()}):
            if span[0] < at:
                raise DataError(path, t.lineno, f"{t.where}: the words {shown(t.text[words[-1][0]:words[-1][1]])} and "
                                                f"{shown(t.text[span[0]:span[1]])} overlap ([{words[-1][0]}, "
                                                f"{words[-1][1]}) and [{span[0]}, {span[1]})); a word segmentation "
                                                "labels each character once")
            gap = t.text[at:span[0]]
            if gap.strip():
                raise DataError(path, t.lineno, f"{t.where}: {shown(gap.strip())} at [{at}, {span[0]}) is in no word; "
                                                "label every word of the text (a one-character word too)")
            words.append(span)
            at = span[1]
        if t.text[at:].strip():
            raise DataError(path, t.lineno, f"{t.where}: {shown(t.text[at:].strip())} at [{at}, {len(t.text)}) is in "
                                            "no word; label every word of the text (a one-character word too)")
        if words:
            out.append(words_to_example([t.text[a:b] for a, b in words]))
    if not out:
        raise DataError(path, 1, "no annotated task has a labelled word")
    return out


def read_triples(path: PathLike) -> list[SpoExample]:
    """Relation examples of a Label Studio export: one triple per ``relation`` result (and label), its subject and
    object the two regions it links, their labels the types (a region of several labels: the first)."""
    out = []
    for t in read_tasks(path):
        triples = [Triple(t.regions[s][0], predicate, t.regions[o][0]) for s, o, predicate, _ in t.relations]
        out.append(SpoExample(t.text, list(dict.fromkeys(triples))))
    return out


# ---------------------------------------------------------------------------------------------------- writing
@dataclass(frozen=True)
class LabelConfig:
    """What zhie's results name in a project: ``from_name`` (the ``<Labels>`` control), ``to_name`` (the ``<Text>``
    object it labels), ``data_key`` (the task field the ``<Text>`` shows, its ``value="$text"``) and ``labels`` (the
    ``<Label>`` values of the control; the first is a word's label in a word segmentation project)."""

    from_name: str = "label"
    to_name: str = "text"
    data_key: str = "text"
    labels: tuple[str, ...] = ()

    @classmethod
    def parse(cls, xml: str) -> LabelConfig:
        """The names of a labelling config (Label Studio's XML): its first ``<Labels>`` whose ``toName`` is a
        ``<Text>``; a ValueError says what is missing."""
        try:
            root = ElementTree.fromstring(xml)
        except ElementTree.ParseError as err:
            raise ValueError(f"the labelling config is not valid XML ({err})") from None
        texts = {el.get("name"): el.get("value", "") for el in root.iter("Text")}
        for el in root.iter("Labels"):
            if el.get("toName") in texts:
                value = texts[el.get("toName")]
                if not value.startswith("$"):
                    raise ValueError(f"the labelling config's <Text name={el.get('toName')!r}> shows {value!r}, not a "
                                     "task field ($name); zhie reads the text from a task field")
                return cls(el.get("name"), el.get("toName"), value[1:],
                           tuple(x.get("value") for x in el.iter("Label") if x.get("value")))
        raise ValueError("the labelling config has no <Labels> control on a <Text> object, where zhie puts its spans; "
                         "use a named-entity template (<Labels name=\"label\" toName=\"text\"> with <Text "
                         "name=\"text\" value=\"$text\"/>)")


def model_version(model_dir: PathLike, task: str) -> str:
    """A model's ``model_version`` in Label Studio: ``zhie-TASK-`` and 8 hex digits of the sha256 of its
    ``zhie.json`` and, where there is one, ``training.json`` (which dates the training run): another model, or the same
    one trained again, has another version, and Label Studio asks it for predictions anew."""
    digest = hashlib.sha256()
    for name in ("zhie.json", "training.json"):
        file = Path(model_dir) / name
        if file.is_file():
            digest.update(file.read_bytes())
    return f"zhie-{task}-{digest.hexdigest()[:8]}"


def _labels_item(region: str, span: dict, labels: list[str], config: LabelConfig) -> dict:
    item = {"id": region, "from_name": config.from_name, "to_name": config.to_name, "type": "labels",
            "value": {"start": span["start"], "end": span["end"], "text": span["text"], "labels": labels}}
    if span.get("score") is not None:
        item["score"] = span["score"]
    return item


def prediction_result(output_key: str, prediction: list, config: LabelConfig = LabelConfig()) -> list[dict]:
    """The ``result`` items of one text's prediction as ``zhie predict`` writes it under ``output_key`` (the task's
    JSON: ``entities``, ``words`` or ``relations``): a ``labels`` region per entity, word (labelled with the config's
    first label, or ``WORD``) or mention of a triple (its type, or ``ENTITY``), and a ``relation`` per triple."""
    if output_key == "entities":
        return [_labels_item(f"e{i}", s, [s["label"]], config) for i, s in enumerate(prediction)]
    if output_key == "words":
        word = (config.labels or (WORD_LABEL,))[0]
        return [_labels_item(f"w{i}", s, [word], config) for i, s in enumerate(prediction)]
    if output_key == "relations":
        regions: dict[tuple[int, int], dict] = {}
        links = []
        for t in prediction:
            ends = []
            for role in ("subject", "object"):
                span = t[role]
                key = (span["start"], span["end"])
                if key not in regions:
                    label = span.get("label") or ENTITY_LABEL
                    regions[key] = _labels_item(f"m{len(regions)}", {**span, "score": None}, [label], config)
                ends.append(regions[key]["id"])
            link = {"from_id": ends[0], "to_id": ends[1], "type": "relation", "direction": "right",
                    "labels": [t["predicate"]]}
            if t.get("score") is not None:
                link["score"] = t["score"]
            links.append(link)
        return list(regions.values()) + links
    raise ValueError(f"a model whose predictions are {output_key!r} has no Label Studio output: it is written for "
                     f"NER, word segmentation and relation models (predictions: {', '.join(OUTPUT_KEYS)})")


def prediction(result: list[dict], version: str) -> dict:
    """A prediction of ``model_version`` ``version`` with the items ``result`` (:func:`prediction_result`), scored by
    the mean score of its items (no score without any)."""
    scores = [item["score"] for item in result if item.get("score") is not None]
    out = {"model_version": version, "result": result}
    if scores:
        out["score"] = round(sum(scores) / len(scores), 4)
    return out


def prediction_task(text: str, result: list[dict], version: str, config: LabelConfig = LabelConfig()) -> dict:
    """A task to import into Label Studio: ``data`` with the text (under ``config.data_key``) and zhie's prediction
    (:func:`prediction`) as its pre-annotation."""
    return {"data": {config.data_key: text}, "predictions": [prediction(result, version)]}
