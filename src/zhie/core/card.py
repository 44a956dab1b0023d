"""The model card: the ``README.md`` of a model directory, for a person and for the Hugging Face Hub.

:func:`render` is a pure function of what the directory holds: ``zhie.json`` (the machine-readable source: task,
configuration, zhie version), ``training.json`` (the record of the training run that saved it, when one did:
:mod:`zhie.training.record`) and the task's card facts (:meth:`zhie.tasks.base.Task.describe`). The card opens with
the Hub's YAML metadata (library name, pipeline tag, language, base model, tags, metrics), then says what the model
does and what it knows (labels), what it was trained on (files with their sizes and sha256), how (the command, the
settings, the time and the machine), how well (dev metrics, per type where the task has types), its limits, and how to
load it. No torch here.
"""

from __future__ import annotations

import json
import shlex

CARD_FILE = "README.md"
RECORD_FILE = "training.json"
SETTINGS = ("epochs", "max_steps", "batch_size", "lr", "head_lr", "warmup", "ema", "grad_accum", "precision", "seed")
PRF = ("precision", "recall", "f1")


def render(meta: dict, record: dict | None = None, about: dict | None = None) -> str:
    """The card of a model directory whose ``zhie.json`` is ``meta`` (``record``: its ``training.json``, ``about``:
    its task's :meth:`~zhie.tasks.base.Task.describe`; either may be missing)."""
    about = about or {"summary": f"a zhie {meta.get('task')} model", "pipeline_tag": None, "metrics": [],
                      "labels": None, "limits": []}
    title = f"# {meta.get('task')} model\n\nA zhie model: {about['summary']}."
    sections = [front_matter(meta, record, about), title, task_section(meta, about), data_section(record),
                training_section(meta, record), metrics_section(meta, record), limits_section(about),
                usage_section(meta)]
    return "\n\n".join(sections) + "\n"


def _yaml(value) -> str:
    """A YAML scalar: JSON's double-quoted string is one."""
    return json.dumps(value, ensure_ascii=False)


def front_matter(meta: dict, record: dict | None, about: dict) -> str:
    lines = ["---", "library_name: zhie"]
    if about.get("pipeline_tag"):
        lines.append(f"pipeline_tag: {_yaml(about['pipeline_tag'])}")
    language = about.get("language", "zh")
    if language:
        lines += ["language:", f"- {_yaml(language)}"]
    if record and record.get("base_model"):
        lines.append(f"base_model: {_yaml(record['base_model'])}")
    tags = dict.fromkeys(["zhie", str(meta.get("task")), *([meta["head"]] if meta.get("head") else [])])
    lines += ["tags:", *(f"- {_yaml(t)}" for t in tags)]
    if about.get("metrics"):
        lines += ["metrics:", *(f"- {_yaml(m)}" for m in about["metrics"])]
    return "\n".join([*lines, "---"])


def _labels(about: dict) -> list[str]:
    labels = about.get("labels")
    if not labels:
        return []
    return [f"- {labels['title']} ({len(labels['values'])}): " + ", ".join(f"`{v}`" for v in labels["values"])]


def task_section(meta: dict, about: dict) -> str:
    lines = ["## Task and labels", "", f"- Task: `{meta.get('task')}`: {about['summary']}", *_labels(about)]
    for m in about.get("members", []):
        lines.append(f"- Member `{m['name']}`: {m['summary']}")
        lines += ["  " + line for line in _labels(m)]
    return "\n".join(lines)


def data_section(record: dict | None) -> str:
    if not record or not record.get("data"):
        return "## Training data\n\nNot recorded (this directory was not saved by `zhie train` / `zhie.fit`)."
    lines = ["## Training data", "", "| role | file | bytes | sha256 |", "|---|---|---:|---|"]
    lines += [f"| {f['role']} | `{f['path']}` | {f['bytes']} | `{f['sha256']}` |" for f in record["data"]]
    return "\n".join(lines)


def duration(seconds: float) -> str:
    """``seconds`` for a person: ``42.0 s``, ``3 min 05 s``, ``2 h 07 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min {int(seconds % 60):02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _time(record: dict) -> str:
    best = record.get("best")
    if not best:
        return "not recorded (the run had not finished; `metrics.jsonl` in the run directory has each evaluation)"
    run = record.get("run", {})
    return (f"{duration(best['elapsed_s'])} to this model (step {best['step']}, epoch {best['epoch']}) in a run of "
            f"{run.get('steps')} steps and {duration(run.get('elapsed_s', 0.0))}")


def training_section(meta: dict, record: dict | None) -> str:
    version = f"- zhie version: {meta.get('zhie_version')} (`zhie.json` format {meta.get('format')})"
    if not record:
        return f"## Training\n\n{version}"
    config = record.get("train_config", {})
    settings = ", ".join(f"{k} {config[k]}" for k in SETTINGS if config.get(k) is not None)
    machine = record.get("machine", {})
    hardware = ", ".join(machine.get("gpus") or []) or f"CPU only ({machine.get('cpus')} cores)"
    hub = f" ({record['base_model']})" if record.get("base_model") else ""
    versions = ", ".join(f"{k} {machine.get(k.lower())}" for k in ("Python", "torch", "transformers"))
    lines = ["## Training", "", f"- Command: `{record.get('command')}`", f"- Encoder: `{record.get('encoder')}`{hub}",
             f"- Settings: {settings}" if settings else "- Settings: not recorded",
             f"- Training time: {_time(record)}",
             f"- Machine: {hardware}; {machine.get('processes', 1)} process(es); {machine.get('platform')}; {versions}",
             f"- Saved: {record.get('saved')}", version]
    return "\n".join(lines)


def _number(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def metrics_table(metrics: dict) -> list[str]:
    """One evaluation's metrics as Markdown: the per-type table (when the task has types), then the other numbers."""
    lines = []
    if isinstance(metrics.get("per_type"), dict):
        total = metrics.get("micro") or {k: metrics.get(k) for k in PRF}
        lines += ["| type | precision | recall | f1 | support |", "|---|---:|---:|---:|---:|"]
        rows = [*metrics["per_type"].items(), ("**all**", {**total, "support": metrics.get("n_gold")})]
        lines += [f"| {label} | " + " | ".join(_number(m.get(k)) for k in (*PRF, "support")) + " |"
                  for label, m in rows]
        lines.append("")
    numbers = {k: v for k, v in metrics.items()
               if isinstance(v, (int, float)) and not (isinstance(metrics.get("per_type"), dict) and k in PRF)}
    if numbers:
        lines += ["| metric | value |", "|---|---:|", *(f"| {k} | {_number(v)} |" for k, v in numbers.items())]
    return lines


def metrics_section(meta: dict, record: dict | None) -> str:
    dev = (record or {}).get("dev")
    if not dev:
        return "## Dev metrics\n\nNot recorded (no evaluation on a dev set saved this model)."
    lines = ["## Dev metrics", "", f"On {_dev_files(record)}, the evaluation that saved this model (best "
             f"`{record.get('metric')}`):", ""]
    if meta.get("task") == "multitask":
        for name, metrics in dev.items():
            lines += [f"### {name}", "", *metrics_table(metrics), ""]
    else:
        lines += metrics_table(dev)
    return "\n".join(lines).rstrip()


def _dev_files(record: dict) -> str:
    dev = dict.fromkeys(f"`{f['path']}`" for f in record.get("data", []) if f["role"].endswith("dev"))
    return ", ".join(dev) or "the dev set"


def limits_section(about: dict) -> str:
    lines = ["## Limits", "", *(f"- {limit}" for limit in about.get("limits", []))]
    for m in about.get("members", []):  # what the model's own lines do not already say
        lines += [f"- `{m['name']}`: {limit}" for limit in m.get("limits", []) if limit not in about["limits"]]
    return "\n".join(lines if len(lines) > 2 else [*lines, "- none recorded"])


def usage_section(meta: dict) -> str:
    example = shlex.quote("上海市体育局召开体育宣传工作会议。")
    return "\n".join([
        "## How to use", "",
        "`MODEL_DIR` is the directory of this card. In Python, with zhie installed:", "",
        "```python", "import zhie", "", 'model = zhie.load("MODEL_DIR")',
        'print(model.predict(["上海市体育局召开体育宣传工作会议。"]))', "```", "",
        "On the command line:", "", "```bash",
        f"zhie predict MODEL_DIR {example}      # JSON lines; --input FILE for many texts",
        "zhie serve MODEL_DIR                  # HTTP API and a page at http://127.0.0.1:8000/ (the serve extra)",
        "zhie eval MODEL_DIR --data dev.json --errors errors.jsonl" +
        (" --task NAME" if meta.get("task") == "multitask" else ""),
        "```"])
