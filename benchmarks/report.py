"""The tables of RESULTS.md, made from benchmarks/results/*.jsonl (one JSON line per recorded run).

Over 400 lines: one table function per table of RESULTS.md (:data:`TABLES`), each short; splitting them would
only scatter the tables.

    python benchmarks/report.py                  # print every table, each under its name
    python benchmarks/report.py --write          # rewrite every marked table of RESULTS.md in place
    python benchmarks/report.py --check          # exit 1, naming them, if a marked table differs from its rows
    python benchmarks/report.py --plot           # redraw results/tradeoff.png and results/active_learning.png

A table of RESULTS.md stands between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``, each on a line of its
own; NAME is a key of :data:`TABLES`, whose function makes the table from the JSON lines. Edit the rows or this file,
never the text between the markers (``tests/test_results.py`` fails when the two differ). Rows that a later rerun
superseded stay in their JSON lines; the functions here leave them out where RESULTS.md says so.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable, Collection
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # marked.py beside it, also when a test loads this file by its path
import marked as marked_tables  # noqa: E402

RESULTS = HERE / "results"
DOC = HERE / "RESULTS.md"


def rows(name: str) -> list[dict]:
    path = RESULTS / name
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def campaign(prefix: str) -> list[dict]:
    """The campaign's lines (benchmarks/campaign.py) whose key starts with ``prefix``."""
    return [line for line in rows("campaign.jsonl") if line["key"].startswith(prefix)]


def table(header: list[str], body: list[list], right: Collection[int] = ()) -> str:
    """A markdown table: the header, its separator (``---:`` under the columns whose index is in ``right``), one row
    per list of cells."""
    sep = "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"
    return "\n".join(["| " + " | ".join(header) + " |", sep, *("| " + " | ".join(map(str, r)) + " |" for r in body)])


def pct(x) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def signed(x: float, digits: int = 2) -> str:
    """``+0.23`` / ``−0.23`` (a minus sign, as the prose writes it)."""
    return f"{x:+.{digits}f}".replace("-", "−")


def _mean_std(values: list[float], sign: bool = False) -> str:
    """Mean ± sample std of fractions, ×100; one value alone; ``sign``: ``+``/``−`` before the mean."""
    if not values:
        return "–"
    mean = sum(values) / len(values)
    shown = signed(100 * mean) if sign else f"{100 * mean:.2f}"
    if len(values) == 1:
        return shown
    std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return f"{shown} ± {100 * std:.2f}"


def per_epoch(values: list[float]) -> str:
    return ", ".join(pct(f) for f in values)


# --- NER, one seed per row (benchmarks/ner.py) ---------------------------------------------------------------------

def superseded_ner(r: dict) -> bool:
    """The first CPU rows (``--out runs/bench-lr2e-4``), trained before the heads' initialisation was seeded; their
    commands were rerun after it (``runs/bench-issue10``), so only the reruns reproduce."""
    return "runs/bench-lr2e-4" in r.get("command", "")


def ner_table() -> str:
    body = []
    for r in rows("ner.jsonl"):
        if r.get("compare") or r.get("speed") or superseded_ner(r):
            continue
        crf = f" / ×{r['crf_lr_multiplier']:g}" if r.get("crf_lr_multiplier") else ""
        body.append([r["dataset"], r["head"], r["epochs"], f"**{pct(r['dev_f1'])}** ({per_epoch(r['f1_per_epoch'])})",
                     f"{pct(r['dev_precision'])} / {pct(r['dev_recall'])}", f"{r['train_tokens_per_s']:.0f}",
                     f"{r['predict_sent_per_s']:.1f}", f"{100 * r['decode_share']:.2f}%", f"{r['peak_memory_mb']:.0f}",
                     f"{r['lr']:g} / {r['head_lr']:g}{crf}, {r['batch_size']}", f"{r['machine']}, {r['date']}"])
    return table(["dataset", "head", "epochs", "dev F1 (per epoch)", "P / R", "train tok/s", "predict sent/s",
                  "decode share", "peak MB", "lr / head lr / CRF ×, batch", "machine, date"], body)


def speed_table() -> str:
    speed = [r for r in rows("ner.jsonl") if r.get("speed")]
    roofline = any("achieved_tflops" in r for r in speed)
    body = [[r["dataset"], "/".join(r["model"].split("/")[-2:]), f"{r['predict_sent_per_s']:.0f}",
             f"{100 * r['decode_share']:.1f}%", f"{100 * r['model_share']:.1f}%",
             *([flops(r)] if roofline else []), f"{r['machine']}, {r['date']}"] for r in speed]
    return table(["dataset", "model", "predict sent/s", "decode share", "model share",
                  *(["encoder GFLOP/s (% of peak)"] if roofline else []), "machine, date"], body)


def hf_table() -> str:
    return table(["dataset", "texts", "zhie sent/s", "HF pipeline sent/s", "speed-up", "machine, date"],
                 [[r["dataset"], r["texts"], f"{r['zhie_sent_per_s']:.1f}", f"{r['hf_pipeline_sent_per_s']:.1f}",
                   f"{r['speedup']:.2f}×", f"{r['machine']}, {r['date']}"]
                  for r in rows("ner.jsonl") if r.get("compare") == "hf_pipeline"])


def flops(r: dict) -> str:
    """Achieved GFLOP/s and its share of the measured peak (benchmarks/roofline.py), or – for older rows."""
    if "achieved_tflops" not in r:
        return "–"
    return f"{1e3 * r['achieved_tflops']:,.1f} of {1e3 * r['peak_tflops']:,.0f} ({100 * r['share_of_peak']:.0f}%)"


# --- the campaign (benchmarks/campaign.py) -------------------------------------------------------------------------

def campaign_groups(section: str) -> dict[str, list[dict]]:
    """The campaign's finished rows whose key starts with ``section``, grouped by the key without its trailing
    ``/sN`` (the seeds of one configuration)."""
    groups: dict[str, list[dict]] = {}
    for line in campaign(section):
        groups.setdefault(re.sub(r"/s\d+$", "", line["key"]), []).append(line)
    return groups


def _ordered(groups: dict, labels: dict[str, str] | None) -> list[tuple[str, str, object]]:
    """(label, key, value) of the groups in ``labels``' order, then of any other group, labelled by its key."""
    labels = labels or {}
    known = [(labels[g], g, groups[g]) for g in labels if g in groups]
    return known + [(g, g, v) for g, v in groups.items() if g not in labels]


def campaign_ner_table(section: str, labels: dict[str, str] | None = None) -> str:
    """NER rows of the campaign: dev F1 mean ± sample std over the seeds, the mean dev F1 after each epoch, the
    seeds' values, and where the rows ran: the CPU hours they took on the 2-core CPU, or the minutes each took on a
    GPU beside the rows it ran with (neither is a performance figure)."""
    body = []
    for name, _, lines in _ordered(campaign_groups(section), labels):
        runs = [(line, line["results"][-1]) for line in lines]
        curves = [r["f1_per_epoch"] for _, r in runs]
        epochs = min(len(c) for c in curves)
        mean_curve = ", ".join(pct(sum(c[e] for c in curves) / len(curves)) for e in range(epochs))
        body.append([name, runs[0][1]["epochs"], len(runs), _mean_std([r["dev_f1"] for _, r in runs]), mean_curve,
                     ", ".join(f"{line['seed']}: {pct(r['dev_f1'])}" for line, r in runs), _ran_on(lines)])
    return table(["configuration", "epochs", "seeds", "dev F1 mean ± std", "mean F1 after each epoch", "per seed",
                  "ran on"], body)


def campaign_rows_table(section: str) -> str:
    """Every NER row of the campaign under ``section`` on its own: dev F1 with P / R, F1 by epoch, CPU minutes and
    the sessions they took (≥ where the earlier sessions' CPU time was not all counted)."""
    body = []
    for line in campaign(section):
        r = line["results"][-1]
        minutes = f"{'' if line['cpu_s_complete'] else '≥ '}{line['cpu_s'] / 60:.0f} ({line['sessions']})"
        body.append([line["key"], f"{pct(r['dev_f1'])} (P {pct(r['dev_precision'])} / R {pct(r['dev_recall'])})",
                     per_epoch(r["f1_per_epoch"]), minutes])
    return table(["row", "dev F1", "F1 by epoch", "CPU min (sessions)"], body)


def _ran_on(lines: list[dict]) -> str:
    """``CPU 2.9 h`` for rows of the campaign runner, ``H100 5-6 min each (16 rows at once)`` for rows of a GPU
    machine, or both."""
    parts = []
    cpu = [line["cpu_s"] for line in lines if not line.get("device")]
    if cpu:
        parts.append(f"CPU {sum(cpu) / 3600:.1f} h")
    gpu = [line for line in lines if line.get("device")]
    if gpu:
        minutes = sorted(round(line["wall_s"] / 60) for line in gpu)
        span = f"{minutes[0]}" if minutes[0] == minutes[-1] else f"{minutes[0]}-{minutes[-1]}"
        at_once = sorted({line["parallel"] for line in gpu})
        parts.append(f"{gpu[0]['device'].replace('NVIDIA ', '').split()[0]} {span} min each "
                     f"({'/'.join(map(str, at_once))} rows at once)")
    return " + ".join(parts)


GP_START = {
    "a/gp-start/cluener/prior": "CLUENER, prior start (zhie's default)",
    "a/gp-start/cluener/zero": "CLUENER, zero start (`--no-gp-prior-init`, bert4keras)",
    "a/gp-start/pd/prior": "People's Daily, prior start",
    "a/gp-start/pd/zero": "People's Daily, zero start",
}
HEADLINE = {
    "c/cluener/gp": "CLUENER GP",
    "c/cluener/egp": "CLUENER EGP",
    "c/cluener/egp-fgm": "CLUENER EGP + FGM (`--adversarial fgm`)",
    "c/cluener/gp-fgm": "CLUENER GP + FGM (`--head gp --adversarial fgm`)",
    "c/cluener/crf": "CLUENER CRF",
    "c/pd/gp": "People's Daily GP",
    "c/pd/egp": "People's Daily EGP",
    "c/pd/crf": "People's Daily CRF",
    "c/cmeee/egp": "CMeEE EGP",
    "c/cmeee/egp-12ep": "CMeEE EGP, 12 epochs",
    "c/cmeee/gp": "CMeEE GP",
}
OPTIONS = {
    "d/options/cluener-egp/none": "none (baseline)",
    "d/options/cluener-egp/fgm": "`--adversarial fgm`",
    "d/options/cluener-egp/pgd": "`--adversarial pgd` (3 ascent steps)",
    "d/options/cluener-egp/ema": "`--ema 0.999`",
    "d/options/cluener-egp/llrd": "`--llrd 0.9`",
    "d/options/cluener-egp/fgm-ema": "`--adversarial fgm --ema 0.999`",
    "d/options/cluener-crf/none": "CRF (R-Drop's baseline)",
    "d/options/cluener-crf/rdrop": "CRF with `--rdrop 4.0`",
}


# --- cross-lingual NER (benchmarks/mtmt.py) ------------------------------------------------------------------------

MTMT_SYSTEMS = {
    "direct": "direct transfer (the en recogniser on de)",
    "tsl": "TSL (single teacher: recogniser only, no weights, no similarity)",
    "mtmt": "MTMT full",
    "mtmt-no-alpha": "MTMT − α (no recogniser-confidence weight)",
    "mtmt-no-beta": "MTMT − β (no evaluator-confidence weight)",
    "mtmt-no-gamma": "MTMT − γ (no teacher-agreement weight)",
    "supervised": "supervised on de train (upper bound)",
}


def campaign_mtmt_table(section: str = "b/", labels: dict[str, str] | None = None, sign: bool = False) -> str:
    """MTMT rows of the campaign: WikiANN de dev F1 mean ± std per system over the seeds, and the paired difference
    to direct transfer and to TSL (each seed's F1 minus the same seed's, over the seeds where both came from one
    campaign row: only there did they distil the same teachers; another row of that seed trained its own). Systems
    under their ``labels`` and in their order; ``sign``: the differences with ``+`` / ``−``."""
    by_system: dict[str, dict[int, dict]] = {}
    row_of: dict[tuple[str, int], str] = {}
    for line in campaign(section):
        for r in line["results"]:
            by_system.setdefault(r["system"], {})[r["seed"]] = r
            row_of[r["system"], r["seed"]] = line["key"]

    def paired(system: str, base: str) -> str:
        seeds = [s for s in sorted(by_system[system]) if system != base and (base, s) in row_of
                 and row_of[base, s] == row_of[system, s]]
        return _mean_std([by_system[system][s]["f1"] - by_system[base][s]["f1"] for s in seeds], sign=sign)

    body = []
    for name, system, by_seed in _ordered(by_system, labels):
        rs = list(by_seed.values())
        p, r_ = (sum(r[k] for r in rs) / len(rs) for k in ("precision", "recall"))
        body.append([name, len(rs), _mean_std([r["f1"] for r in rs]), paired(system, "direct"), paired(system, "tsl"),
                     f"{pct(p)} / {pct(r_)}", ", ".join(f"{r['seed']}: {pct(r['f1'])}" for r in rs)])
    return table(["system", "seeds", "de dev F1 mean ± std", "− direct (paired)", "− TSL (paired)", "P / R (mean)",
                  "per seed"], body)


def mtmt_smoke_table() -> str:
    """``benchmarks/mtmt.py``'s own rows (the 1-layer CPU smoke run)."""
    order = list(MTMT_SYSTEMS)
    rs = sorted(rows("mtmt.jsonl"), key=lambda r: order.index(r["system"]))
    return table(["system", "de dev F1", "P / R", "train s (wall, niced)"],
                 [[MTMT_SYSTEMS[r["system"]], pct(r["f1"]), f"{pct(r['precision'])} / {pct(r['recall'])}",
                   f"{r['train_s']:.0f}" + (" (teacher)" if r["system"] == "direct" else "")] for r in rs])


# --- multi-task (benchmarks/multitask.py) --------------------------------------------------------------------------

def multitask_table(records: list[dict], cpu: bool = True, mean_weights: bool = False) -> str:
    """One row per multi-task or single-task run of ``benchmarks/multitask.py`` (its JSON lines): every member's dev
    metric (and, for a multi-task run, its difference to the same member trained alone in the same suite and
    setting), the weights at the last step (and their mean over the run), s/step, the process's CPU seconds."""
    def setting(r: dict) -> tuple:  # what a single-task run must share with a multi-task run to be its baseline
        return tuple(r.get(k) for k in ("suite", "encoder", "encoder_layers", "steps", "batch_size", "train_size",
                                        "dev_size", "max_length", "lr", "head_lr", "seed"))

    alone = {(setting(r), name): v for r in records if r["run"].startswith("single:") for name, v in r["dev"].items()}

    def member(r: dict, name: str, v: float) -> str:
        single = None if r["run"].startswith("single:") else alone.get((setting(r), name))
        return f"{name} {pct(v)}" + ("" if single is None else f" ({signed(100 * (v - single))})")

    def weights(r: dict) -> str:
        last = ", ".join(f"{name} {v:.3g}" for name, v in (r.get("final_weights") or {}).items()) or "–"
        mean = ", ".join(f"{name} {v:.3g}" for name, v in (r.get("mean_weights") or {}).items())
        return last + (f" (mean: {mean})" if mean_weights and mean else "")

    body = [[r["suite"], r["run"], ", ".join(member(r, name, v) for name, v in r["dev"].items()), weights(r),
             f"{r['train_s_per_step']:.2f}", *([f"{r['run_cpu_s']:.0f}"] if cpu else [])] for r in records]
    return table(["suite", "run", "dev metrics (×100; multi-task: ± against the member alone)",
                  "weights at the last step" + (" (mean over the run)" if mean_weights else ""), "s / step (wall)",
                  *(["CPU s"] if cpu else [])], body)


def campaign_multitask_table() -> str:
    """The campaign's multi-task rows (``e/``), suite ``three`` first, single-task runs before the others."""
    records = [r for line in campaign("e/") for r in line["results"]]
    records.sort(key=lambda r: (r["suite"] != "three", not r["run"].startswith("single:")))
    return multitask_table(records, cpu=False, mean_weights=True)


# --- students and the CPU trade-off --------------------------------------------------------------------------------

def students_table(section: str = "s/") -> str:
    """The campaign's student rows: dev F1 per epoch and training time per epoch, against their teacher's. A teacher
    that a student's row trains (``--train-teacher``) is shown once: later rows that find it trained record its line
    again."""
    body, teachers = [], set()
    for line in campaign(section):
        for r in line["results"]:
            if "f1_per_epoch" not in r:  # a row of another benchmark under s/ (s/stages/: predict_stages.py)
                continue
            if "student" in r:
                kind = (f"{r['layers']} layers ({r['keep_layers']})"
                        + (f", feed-forward {r['ffn_width']}" if r.get("ffn_width") else "")
                        + (f", {r['attention_heads']} heads" if r.get("attention_heads") else "")
                        + (f", {r['head']}" if r.get("head") else "")
                        if r["student"] == "cut" else
                        (f"{r['student']} {r['layers']} x {r['width']}" if r.get("width") else
                         f"{r['student']}, {r['layers']} layers") + (f", {r['head']}" if r.get("head") else ""))
                kind += (f", bigrams {r['bigrams']:,}" if r.get("bigrams") else "") + (
                    f", {r['adversarial'].upper()}" if r.get("adversarial") else "")
                steps = [b - a for a, b in zip([0.0, *r["epoch_s"]], r["epoch_s"])]
            else:  # the teacher's row (benchmarks/ner.py)
                if r.get("command") and (r["command"], r["dev_f1"]) in teachers:
                    continue
                teachers.add((r.get("command"), r["dev_f1"]))
                kind, steps = f"teacher, 12 layers, {r['head']}", None
                r = {**r, "unlabelled_texts": 0}
            body.append([line["key"], kind, f"{r['unlabelled_texts']:,}",
                         f"**{pct(r['dev_f1'])}** ({per_epoch(r['f1_per_epoch'])})",
                         ", ".join(f"{x:.0f}" for x in steps) if steps else "–", f"{r['train_tokens_per_s']:.0f}",
                         line.get("device") or "2-core CPU"])
    return table(["row", "student", "unlabelled texts", "dev F1 (per epoch)", "s per epoch", "train tok/s", "ran on"],
                 body, right=(2, 5))


# --- new entity types without forgetting (benchmarks/forgetting.py) -----------------------------------------------

FORGETTING_MODELS = {"old": "{old} old types only (their annotation pass)",
                     "extend": "extended with the {new} new (`--from`: the old model teaches its types)",
                     "extend-predictions": "extended, the old model's predicted spans as labels (`--old-types "
                                           "predictions`)",
                     "naive": "naive fine-tuning on the new labels (`--old-types gold`)",
                     "all-types": "all {all} at once"}


def forgetting_variant(name: str, line: dict) -> str:
    """The table's label of an ``eval`` line whose model is a ``--variant`` (not one of :data:`FORGETTING_MODELS`)."""
    t = line["trained"]
    return f"`{name}`: extended at lr {t['lr']:g} (head {t['head_lr']:g}), {t['epochs']} epochs"


def forgetting_table(lines: list[dict] | None = None) -> str:
    """``benchmarks/forgetting.py``'s ``eval`` lines (default: ``results/forgetting.jsonl``'s and the campaign's
    ``f/`` rows'), one table row per model and seed (the evaluations of a seed together; a later line of a model
    replaces the earlier one): the micro-F1 over the old types, the new ones and all, and the old types' change
    against the model of all the types at once of the same seed. No evaluation, no table (a line saying so)."""
    if lines is None:
        lines = rows("forgetting.jsonl") + [r for line in campaign("f/") for r in line["results"]]
    evals = [r for r in lines if r.get("step") == "eval"]
    if not evals:
        return "_No rows yet: the campaign's `f/` rows (`benchmarks/forgetting.py`) have not run._"
    runs: dict[int, dict[str, dict]] = {}
    for r in evals:
        runs.setdefault(r["trained"]["seed"], {})[r["model"]] = r
    n_old, n_new = len(evals[0]["old_types"]), len(evals[0]["new_types"])
    body = []
    for models in runs.values():
        reference = models.get("all-types")
        variants = [name for name in models if name not in FORGETTING_MODELS]  # --variant: after the extensions
        known = [name for name in FORGETTING_MODELS if name in models]
        split = len([name for name in known if name not in ("naive", "all-types")])
        for name in [*known[:split], *variants, *known[split:]]:
            r = models[name]
            label = (FORGETTING_MODELS[name].format(old=n_old, new=n_new, all=n_old + n_new) if name not in variants
                     else forgetting_variant(name, r))
            change = (signed(100 * (r["old_micro"]["f1"] - reference["old_micro"]["f1"]))
                      if reference is not None and name != "all-types" else "–")
            new = pct(r["new_micro"]["f1"]) if set(r["new_types"]) & set(r["types"]) else "–"
            body.append([label, r["trained"]["seed"],
                         pct(r["old_micro"]["f1"]), new, pct(r["all_micro"]["f1"]), change])
    return table(["model", "seed", f"old types ({n_old}) micro-F1", f"new types ({n_new}) micro-F1",
                  f"all {n_old + n_new} micro-F1", "old types against all at once"], body, right=range(1, 6))


def rss(r: dict) -> str:
    """A process's peak resident MB; before ``common.run_measured`` (rows without ``rss_measured``) the process was
    forked by the benchmark, whose own size the kernel reports when it is the larger: an upper bound only."""
    return str(r["peak_rss_mb"]) if r.get("rss_measured") == "own" else f"≤ {r['peak_rss_mb']}"


def tradeoff_table() -> str:
    """``benchmarks/tradeoff.py``'s rows: F1 against speed through ``zhie predict``, per dataset, model and variant
    (``peer``: an offline peer run the same way; its F1 on the labels it shares with the dataset, "–" for none)."""
    body = []
    for r in rows("tradeoff.jsonl"):
        share = r.get("encoder_share_of_peak")
        body.append([DATASETS[r["dataset"]], r["model"], r["variant"], r["layers"] or "–", pct(r["dev_f1"]),
                     f"{r['texts']:,}", f"**{r['sentences_per_s']:,.0f}**", f"{r['characters_per_s']:,.0f}",
                     f"{r['cold_start_s']:.2f}", rss(r), f"{r['size_mb']:g}",
                     "–" if share is None else f"{100 * share:.0f}",
                     f"{r['load_before'][0]:.2f} / {r['load_after'][0]:.2f}", r["date"]])
    return table(["dataset", "model", "variant", "layers", "dev F1", "texts timed", "sentences/s", "characters/s",
                  "cold start s", "peak RSS MB", "size MB", "encoder % of peak", "load before / after", "date"], body,
                 right=range(3, 11))


README_STUDENTS = {"teacher-12-s2": "teacher, 12 layers", "readme-pruned-4": "pruned 4-layer student",
                   "readme-conv-128": "128-wide bigram convolutional student",
                   "jiagu": "*Jiagu 0.2.3's NER (one thread; no CLUENER F1)*"}


def readme_students_table(out: str = "--out runs/tradeoff-readme") -> str:
    """The distillation page's commands as run from a fresh clone: the int8 exports of their teacher and two students
    beside Jiagu's NER, in one run of ``benchmarks/tradeoff.py`` (``out``), with their speeds relative to the teacher's
    and to Jiagu's."""
    run = {r["model"]: r for r in rows("tradeoff.jsonl") if r["command"].endswith(out)}
    teacher, jiagu = run["teacher-12-s2"]["sentences_per_s"], run["jiagu"]["sentences_per_s"]
    body = []
    for model, label in README_STUDENTS.items():
        r = run[model]
        speed = f"{r['sentences_per_s']:,.0f}"
        student = model.startswith("readme-")
        body.append([label, pct(r["dev_f1"]), f"**{speed}**" if student else speed,
                     f"{r['sentences_per_s'] / teacher:.2f}", f"{r['sentences_per_s'] / jiagu:.2f}",
                     f"{r['cold_start_s']:.2f} s"])
    return table(["model (int8 export)", "dev F1", "sentences/s", "× teacher", "× Jiagu", "cold start"], body,
                 right=range(1, 6))


def tradeoff_run_table(out: str, teacher: str = "teacher-12", peer: str = "jiagu") -> str:
    """One run of ``benchmarks/tradeoff.py`` (``--out OUT``): each model and variant's dev F1 against the ``teacher``
    model's (its fp32 export's F1, the model's own; its first row's when the run has no fp32 export), and its
    sentences/s against the teacher's export of the same variant and the ``peer``'s ("–" where the run has none),
    all measured in that run. A peer's F1 counts only the labels it shares with the dataset."""
    run = [r for r in rows("tradeoff.jsonl") if r["command"].endswith(f"--out {out}")]
    speed = {(r["model"], r["variant"]): r["sentences_per_s"] for r in run}
    theirs = [r for r in run if r["model"] == teacher]
    reference = next((r for r in theirs if r["variant"] == "fp32"), theirs[0])["dev_f1"]
    body = []
    for r in run:
        same = speed.get((teacher, r["variant"]))
        body.append([r["model"], r["variant"], pct(r["dev_f1"]) if r["dev_f1"] is not None else "–",
                     signed(100 * (r["dev_f1"] - reference)) if r["dev_f1"] is not None else "–",
                     f"**{r['sentences_per_s']:,.0f}**", f"{r['sentences_per_s'] / same:.1f}" if same else "–",
                     f"{r['sentences_per_s'] / speed[peer, 'peer']:.2f}" if (peer, "peer") in speed else "–",
                     f"{r['cold_start_s']:.2f}", f"{r['load_before'][0]:.2f} / {r['load_after'][0]:.2f}"])
    return table(["model", "variant", "dev F1", "against the teacher", "sentences/s", "× teacher (same variant)",
                  f"× {peer}", "cold start s", "load before / after"], body, right=range(2, 8))


def tradeoff_plot(path: Path) -> None:
    """Dev F1 against sentences/s (log scale) of the CLUENER tradeoff rows, one marker per variant: each model's latest
    row of each variant timed on the 2,688 texts, the untrained cuts (``--cut NAME=...``: speed only) left out; each
    NER peer's latest speed as a dashed line (it has no CLUENER F1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latest = {}
    for r in rows("tradeoff.jsonl"):
        command = r["command"]
        if r["dataset"] == "cluener" and f"--cut {r['model']}=" not in command and "--all-texts" not in command:
            latest[r["model"], r["variant"]] = r
    fig, ax = plt.subplots(figsize=(8, 5))
    for variant, marker in (("torch", "s"), ("fp32", "o"), ("int8", "^")):
        rs = [r for (_, v), r in latest.items() if v == variant and r["dev_f1"] is not None]
        if not rs:
            continue
        ax.scatter([r["sentences_per_s"] for r in rs], [100 * r["dev_f1"] for r in rs], marker=marker, label=variant)
        for k, r in enumerate(sorted(rs, key=lambda r: r["sentences_per_s"])):
            ax.annotate(r["model"], (r["sentences_per_s"], 100 * r["dev_f1"]), fontsize=6,
                        xytext=(3, 3 if k % 2 else -8), textcoords="offset points")
    for (model, variant), r in latest.items():
        if variant == "peer":
            ax.axvline(r["sentences_per_s"], linestyle="--", color="grey", linewidth=1)
            ax.annotate(f"{model} (peer, no CLUENER F1)", (r["sentences_per_s"], ax.get_ylim()[0]), fontsize=6,
                        rotation=90, xytext=(-9, 4), textcoords="offset points", color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("CLUENER sentences/s through zhie predict, 2 CPU cores (log scale)")
    ax.set_ylabel("dev F1")
    ax.legend(title="variant")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# --- export, cold start, serving -----------------------------------------------------------------------------------

EXPORT_VARIANTS = {
    "torch": "torch fp32",
    "fp32": "onnxruntime fp32",
    "int8": "int8, dynamic, per tensor (`--quantize int8`)",
    "int8-per-channel": "int8 per channel (`--per-channel`)",
    "int8-keep-embeddings": "int8, embeddings kept fp32 (`--keep-fp32 embeddings`)",
    "int8-keep-last-layer": "int8, last layer kept fp32 (`--keep-fp32 layer.11.`)",
    "int8-static": "int8, static (`--calibrate`, 200 training texts)",
    "int8-reduce-range": "int8, 7-bit weights (`--reduce-range`)",
    "int8-per-channel-reduce-range": "int8 per channel, 7-bit (`--per-channel --reduce-range`)",
}
DATASETS = {"cluener": "CLUENER", "peoples_daily": "People's Daily", "cmeee": "CMeEE", "pd": "People's Daily",
            "sxu": "SXU (CWS)"}


def export_table(*keys: str) -> str:
    """``benchmarks/export.py``'s campaign rows, one column group per row (dataset): dev F1 and its difference to
    torch's, sentences/s and its ratio to torch's, the size on disk; one table row per variant."""
    lines = [{r["variant"]: r for r in line["results"]} for key in keys for line in campaign(key)]
    header, body = ["variant"], []
    for by_variant in lines:
        name = DATASETS[next(iter(by_variant.values()))["dataset"]]
        header += [f"{name} dev F1 (Δ)", "sent/s (× torch)", "MB"]
    for variant, label in EXPORT_VARIANTS.items():
        cells = [label]
        for by_variant in lines:
            r, torch = by_variant[variant], by_variant["torch"]
            if variant == "torch":
                cells += [pct(r["dev_f1"]), f"{r['sentences_per_s']:.1f}", f"{r['size_mb']:.1f}"]
            else:
                cells += [f"{pct(r['dev_f1'])} ({signed(100 * r['f1_minus_torch']).replace('+0.00', '0.00')})",
                          f"{r['sentences_per_s']:.1f} ({r['sentences_per_s'] / torch['sentences_per_s']:.2f})",
                          f"{r['size_mb']:.1f}"]
        body.append(cells)
    return table(header, body, right=[i for i in range(1, len(header)) if i % 3 != 1])


ORT_GRAPHS = {"23": "zhie's export, opset 23 (the default)", "23-ort-optimizer": "the same, ORT optimizer",
              "18": "zhie's export, opset 18", "18-ort-optimizer": "the same, ORT optimizer"}


def ort_graphs_table(key: str = "g/ort-graphs/") -> str:
    """``benchmarks/ort_graphs.py``: fp32 and int8 (per channel, 7-bit) sentences/s of every graph, the ratio to
    zhie's opset-23 fp32 export, how many texts the int8 graph gives fp32's entities; the weight-only graphs last."""
    (line,) = campaign(key)
    r = {x["variant"]: x for x in line["results"]}
    n = r["fp32-23"]["texts"]
    body = [[label, f"{r['fp32-' + g]['sentences_per_s']:.1f} ({r['fp32-' + g]['x_fp32_23']:.2f})",
             f"{r['int8-' + g]['sentences_per_s']:.1f} ({r['int8-' + g]['x_fp32_23']:.2f})",
             f"{r['int8-' + g]['same_entities_as_fp32_23']} / {n}"] for g, label in ORT_GRAPHS.items()]
    b8, b4 = r["nbits8-23"], r["nbits4-23"]
    body.append(["`MatMulNBits` 8-bit / 4-bit weights, opset 23",
                 f"{b8['sentences_per_s']:.1f} ({b8['x_fp32_23']:.2f}) / {b4['sentences_per_s']:.1f} "
                 f"({b4['x_fp32_23']:.2f})", "–",
                 f"{b8['same_entities_as_fp32_23']} / {b4['same_entities_as_fp32_23']} of {n}"])
    return table(["graph", "fp32 sent/s (× zhie's fp32)", "int8 per channel, 7-bit (×)",
                  "texts with fp32's entities (int8)"], body, right=range(1, 4))


STARTUP = {"help": "`zhie --help`", "predict torch": "`zhie predict MODEL TEXT` (torch)",
           "predict export": "`zhie predict EXPORT TEXT` (onnxruntime fp32)"}


def startup_table(key: str = "g/startup-layers/") -> str:
    """``benchmarks/startup.py``: a fresh process per run, the median and range of the runs' wall seconds."""
    (line,) = campaign(key)
    return table(["command", "median s", "runs s", "imports torch"],
                 [[STARTUP[r["command"]], f"{r['median_s']:.3f}", f"{min(r['runs_s']):.3f}–{max(r['runs_s']):.3f}",
                   "yes" if r["imports_torch"] else "no"] for r in line["results"]], right=(1,))


def serve_table(key: str = "g/serve/") -> str:
    """``benchmarks/serve.py``: sentences/s per number of clients against the offline rate; with a column of texts per
    request when the rows record it (``--texts-per-request``; the first rows sent one text each)."""
    (line,) = campaign(key)
    offline = line["results"][0]["offline_sentences_per_s"]
    shapes = any("texts_per_request" in r for r in line["results"])
    return table(["clients", *(["texts/request"] if shapes else []), "sentences/s", f"of offline ({offline:.2f}/s)",
                  "p50 / p99 ms", "errors"],
                 [[r["clients"], *([r.get("texts_per_request", 1)] if shapes else []), f"{r['sentences_per_s']:.2f}",
                   f"{100 * r['ratio']:.0f} %", f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f}", r["errors"]]
                  for r in line["results"]], right=(0, 1, 2, 3, 5) if shapes else (0, 1, 2, 4))


def student_serve_table(key: str = "g/serve-students/") -> str:
    """``benchmarks/serve.py`` on the students' (and teacher's) int8 exports, one row per level and request shape,
    each run's share of the offline rate it measured itself."""
    body = []
    for line in campaign(key):
        name = line["key"][len(key):]
        for r in line["results"]:
            body.append([name, r["max_wait_ms"], r["clients"], r.get("texts_per_request", 1),
                         f"{r['sentences_per_s']:.0f}", f"{r['offline_sentences_per_s']:.0f}",
                         f"{100 * r['ratio']:.0f} %", f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}", r["errors"]])
    return table(["row", "--max-wait-ms", "clients", "texts/request", "sentences/s", "offline/s", "share",
                  "p50 / p99 ms", "errors"], body, right=range(1, 9))


def serve_stack_table() -> str:
    """``benchmarks/serve.py --label``'s rows (``results/serve.jsonl``): one export served by two versions of ``zhie
    serve`` in one session, each row with the offline rate its own run measured (the median of its passes)."""
    body = [[r["label"], r["clients"], r["texts_per_request"], f"{r['sentences_per_s']:.0f}",
             f"{r['offline_sentences_per_s']:.0f}", f"{100 * r['ratio']:.0f} %",
             f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}", r["errors"]] for r in rows("serve.jsonl") if "label" in r]
    return table(["server", "clients", "texts/request", "sentences/s", "offline/s", "share", "p50 / p99 ms", "errors"],
                 body, right=range(1, 8))


STAGES = (("start, import, load", ("process", "import", "load")), ("read", ("read",)), ("tokenise", ("tokenise",)),
          ("batch", ("batch",)), ("graph", ("graph",)), ("decode", ("decode",)), ("JSON, write", ("json", "write")),
          ("other", ("other",)))


def stages_table(key: str = "s/stages/") -> str:
    """``benchmarks/predict_stages.py``: the whole ``zhie predict`` process, its seconds by stage (medians of the
    runs) and the CLI's own whole-process rate."""
    body = []
    for line in campaign(key):
        for r in line["results"]:
            st = r["stages"]
            body.append([line["key"][len(key):], f"{r['sentences']:,}", f"{r['cli_s']:.2f}",
                         f"{r['cli_sentences_per_s']:,.0f}",
                         *(f"{sum(st[k]['s'] for k in keys):.3f} ({100 * sum(st[k]['share'] for k in keys):.0f} %)"
                           for _, keys in STAGES)])
    return table(["row", "sentences", "process s", "sentences/s", *(name + " s" for name, _ in STAGES)], body,
                 right=range(1, 12))


def tiny_export_table() -> str:
    """``benchmarks/export.py`` on the tiny trained model (``results/export.jsonl``'s rows of its first version, which
    name a ``runtime``; the later rows, one per ``variant``, are quoted in the text)."""
    rs = [r for r in rows("export.jsonl") if "runtime" in r]
    return table(["runtime", "texts/s", "dev F1"],
                 [[r["runtime"] + (" (dynamic)" if r["runtime"].endswith("int8") else ""), f"{r['texts_per_s']:.1f}",
                   pct(r["dev_f1"]) + (f" ({signed(-100 * r['int8_f1_loss'])})" if r["int8_f1_loss"] else "")]
                  for r in rs])


def tiny_serve_table() -> str:
    """``benchmarks/serve.py`` on the tiny model (``results/serve.jsonl``): with and without batching."""
    by = {(r["clients"], r["batching"]): r for r in rows("serve.jsonl") if "batching" in r}  # the first rows
    body = []
    for clients in sorted({c for c, _ in by}):
        on, off = by[clients, True], by[clients, False]
        body.append([clients, f"{on['requests_per_s']:.1f}", f"{on['p50_ms']:.0f} / {on['p99_ms']:.0f}",
                     f"{off['requests_per_s']:.1f}", f"{off['p50_ms']:.0f} / {off['p99_ms']:.0f}"])
    return table(["clients", "batching: req/s", "p50 / p99 ms", "no batching (`--max-batch 1`): req/s",
                  "p50 / p99 ms"], body)


# --- decoding, compile, streaming, Ray -----------------------------------------------------------------------------

def _model_name(path: str) -> str:
    """``../runs/bench-issue10/peoples_daily-crf`` -> ``People's Daily CRF``."""
    dataset, head = path.rstrip("/").split("/")[-1].rsplit("-", 1)
    return f"{DATASETS.get(dataset, dataset)} {head.upper() if head != 'softmax' else head}"


def decode_table() -> str:
    """``benchmarks/decode.py``: the latest row per model, leaving out the rows labelled ``before: ...`` and those
    a later row of the same model supersedes (the decoders' earlier versions)."""
    latest: dict[str, dict] = {}
    for r in rows("decode.jsonl"):
        if not r["label"].startswith("before"):
            latest[r["model"]] = r
    return table(["model", "texts", "hits", "decode µs per sentence"],
                 [[_model_name(m), f"{r['texts']} {DATASETS[m.split('/')[-1].rsplit('-', 1)[0]]} "
                   f"{'dev' if 'cluener' in r['data'] else 'dev (the 20 % split)'}", f"{r['hits']:,}",
                   f"{r['decode_us_per_sentence']:.1f}"] for m, r in latest.items()], right=(2, 3))


def compile_table() -> str:
    (r,) = rows("compile.jsonl")
    return table(["mode", "CPU s", "wall s"],
                 [["eager", f"{r['eager_cpu_s']:.2f}", f"{r['eager_wall_s']:.1f}"],
                  ["compiled, first call (compilation included)", f"{r['first_compiled_cpu_s']:.2f}",
                   f"{r['first_compiled_wall_s']:.1f}"],
                  ["compiled, second call", f"{r['compiled_cpu_s']:.2f}", f"{r['compiled_wall_s']:.1f}"]], right=(1, 2))


def stream_table() -> str:
    """``benchmarks/stream.py``: the CLI's streaming (``zhie predict --input --output``) and, with ``--api``, the
    Python API's (``Pipeline.stream``)."""
    return table(["through", "lines", "peak RSS", "seconds", "lines/s"],
                 [["`Pipeline.stream`" if r.get("run", "").startswith("Pipeline") else "`zhie predict`",
                   f"{r['lines']:,}", f"{rss(r)} MB", f"{r['seconds']:.1f}", f"{r['lines_per_s']:.0f}"]
                  for r in rows("stream.jsonl")], right=range(1, 5))


def ray_table() -> str:
    """``benchmarks/ray_predict.py``: the latest run of each setting (an earlier run at load ~15 stays in the
    file)."""
    latest: dict[str, dict] = {}
    for r in rows("ray_predict.jsonl"):
        latest[r["mode"]] = r
    return table(["setting", "texts/s", "seconds", "of which Ray start"],
                 [["one process (`zhie predict`)" if r["mode"].startswith("zhie") else
                   f"Ray, {r['workers']} worker{'s' if r['workers'] > 1 else ''}", f"{r['texts_per_s']:.0f}",
                   f"{r['seconds']:.1f}", f"{r['ray_start_s']:.1f}" if "ray_start_s" in r else "–"]
                  for r in latest.values()], right=range(1, 4))


# --- NER protocol studies ------------------------------------------------------------------------------------------

def windows_table() -> str:
    """``benchmarks/windows.py``'s gold-scored rows: what the old and the new window rule lose."""
    body = []
    for r in rows("windows.jsonl"):
        if "gold" not in r:
            continue
        name = r["dataset"].replace("cmeee/dev", "CMeEE dev").replace("cmeie/dev (triple extents)",
                                                                       "CMeIE dev, triple extents")
        body.append([name, f"{r['max_length']} / {r['overlap']}", f"{r['texts_over_one_window']} of {r['texts']:,}",
                     f"{r['gold']:,}", r["old_not_whole_in_owner"], r["new_span_lost"]])
    return table(["dataset", "max length / overlap", "texts longer than a window", "gold",
                  "old rule: not whole in its owner (span heads lose, taggers cut)", "new rule: in no window whole"],
                 body)


def boundaries_table() -> str:
    return table(["dataset", "file", "entities", "boundary inside a piece", "start / end inside",
                  "characters per piece"],
                 [[DATASETS[r["dataset"]], r["file"].split("/")[-1], f"{r['entities']:,}",
                   f"{r['inside_piece']:,} ({100 * r['inside_share']:.1f} %)",
                   f"{r['start_inside']} / {r['end_inside']}", f"{r['chars_per_piece']:.2f}"]
                  for r in rows("boundaries.jsonl")])


GP_VARIANTS = {
    "base": "– (zero q/k bias as bert4keras, lr 3e-3, warm-up 10 %)",
    "no_rope": "no RoPE",
    "enc_lr3e-3_head_lr1e-3": "head lr 1e-3",
    "lr1e-3": "lr 1e-3",
    "warmup30": "warm-up 30 %",
    "enc_lr1e-3_head_lr3e-3": "encoder lr 1e-3",
    "egp": "EGP head (zero start)",
    "fixed": "prior start",
    "fixed_lr1e-3": "prior start, lr 1e-3",
}


def gp_collapse_table() -> str:
    """``benchmarks/gp_collapse.py``: train F1 at epochs 5 / 10 / 30, the token cosine (its maximum over steps 0–59
    and at the last logged step), dev F1 mean (per seed) from ``gp_collapse_dev.jsonl``."""
    dev: dict[str, list[float]] = {}
    for r in rows("gp_collapse_dev.jsonl"):
        dev.setdefault(r["variant"], []).append(r["dev_f1"])
    body = []
    for r in sorted(rows("gp_collapse.jsonl"), key=lambda r: list(GP_VARIANTS).index(r["variant"])):
        f1 = {e["epoch"]: e["f1"] for e in r["evals"]}
        early = [s for s in r["steps"] if s["step"] < 60]
        peak = max(early, key=lambda s: s["hidden_cos"])
        d = dev.get(r["variant"])
        body.append([f"`{r['variant']}`", GP_VARIANTS[r["variant"]], " / ".join(pct(f1[e]) for e in (5, 10, 30)),
                     f"{peak['hidden_cos']:.3f} ({peak['step']}) / {r['steps'][-1]['hidden_cos']:.3f}",
                     f"{pct(sum(d) / len(d))} ({', '.join(pct(x) for x in d)})" if d else "–"])
    return table(["variant", "differs from `base`", "train F1", "token cosine: max over steps 0–59 (step) / last",
                  "dev F1"], body)


def gp_steps_table(steps: tuple[int, ...] = (0, 10, 15, 20, 59, 389)) -> str:
    """``base`` against ``fixed``, step by step: the share of valid logits above 0, the mean logit and mean gold
    logit, the token cosine, the encoder's gradient norm before clipping."""
    by = {r["variant"]: {s["step"]: s for s in r["steps"]} for r in rows("gp_collapse.jsonl")}

    def num(x: float) -> str:
        return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"

    def share(x: float) -> str:
        return f"{x:.4f}".rstrip("0").rstrip(".")

    body = []
    for step in steps:
        b, f = by["base"][step], by["fixed"][step]
        body.append([step, f"{share(b['frac_valid_gt0'])} / {share(f['frac_valid_gt0'])}",
                     f"{num(b['logit_mean'])} / {num(f['logit_mean'])}",
                     f"{num(b['gold_mean'])} / {num(f['gold_mean'])}",
                     f"{b['hidden_cos']:.3f} / {f['hidden_cos']:.3f}",
                     f"{b['grad_norm_encoder']:.2f} / {f['grad_norm_encoder']:.2f}"])
    return table(["step", "share of valid logits > 0", "mean logit", "mean gold logit", "token cosine",
                  "encoder grad norm"], body)


# --- relation, segmentation, sentence embeddings -------------------------------------------------------------------

def relation_table() -> str:
    return table(["variant", "epochs", "lr / head lr, batch", "dev triple F1 (per epoch)", "P / R", "entity F1",
                  "train tok/s", "peak MB", "machine, date"],
                 [[r["variant"], r["epochs"], f"{r['lr']:g} / {r['head_lr']:g}, {r['batch_size']}",
                   f"**{pct(r['dev_f1'])}** ({per_epoch(r['f1_per_epoch'])})",
                   f"{pct(r['dev_precision'])} / {pct(r['dev_recall'])}", pct(r["dev_entity_f1"]),
                   f"{r['train_tokens_per_s']:.0f}", f"{r['peak_memory_mb']:.0f}", f"{r['machine']}, {r['date']}"]
                  for r in rows("relation.jsonl") if r["run"] == "train"])


def relation_notes() -> str:
    """GPLinker's label-memory and decoding rows, one bullet each."""
    other = []
    for r in rows("relation.jsonl"):
        if r["run"] == "memory":
            other.append(f"* Memory, one training step on the {r['batch_size']} longest CMeIE windows ({r['tokens']} "
                         f"tokens, {r['heads']} GP heads): labels {r['sparse_label_mb']:.2f} MB sparse against "
                         f"{r['dense_label_mb']:.0f} MB dense; peak GPU memory {r.get('sparse_peak_mb', 0):.0f} MB "
                         f"sparse against {r.get('dense_peak_mb', 0):.0f} MB dense; losses {r['sparse_loss']:.4f} and "
                         f"{r['dense_loss']:.4f} ({r['machine']}, {r['date']}; `{r['command']}`).")
        elif r["run"] == "decode":
            other.append(f"* Decoding an untrained model's {r['windows']} dev windows ({r['triples_decoded']:,} "
                         f"triples after the caps): vectorised {r['vectorised_decode_s']:.2f} s; per-cell Python "
                         f"decoder {r['per_cell_decode_s']:.1f} s for {r['per_cell_windows']} windows, about "
                         f"{r['per_cell_extrapolated_s']:.0f} s for all ({r['speedup']:.0f}× slower); outputs equal: "
                         f"{'yes' if r['outputs_equal'] else 'no'}; model forward {r['model_s']:.2f} s "
                         f"({r['machine']}, {r['date']}; `{r['command']}`).")
    return "\n".join(other)


def sts_table() -> str:
    """``benchmarks/sts.py``: an untrained baseline repeated with the same result (the CPU one, rerun after the
    seeding change) is shown once, at its latest place."""
    rs = rows("sts.jsonl")
    rs = [r for i, r in enumerate(rs) if "epochs" in r or not any(
        "epochs" not in s and (s["dataset"], s["machine"]) == (r["dataset"], r["machine"]) for s in rs[i + 1:])]
    body = []
    for r in rs:
        if "epochs" not in r:
            body.append([r["dataset"], r["loss"], 0, "–", f"**{pct(r['spearman'])}**", "–",
                         f"–, –, {r['max_length']}, {r['pooling']}", f"{r['machine']}, {r['date']}"])
        else:
            body.append([r["dataset"], r["loss"], r["epochs"], pct(r["spearman_epoch1"]),
                         f"**{pct(r['spearman'])}** ({per_epoch(r['spearman_per_epoch'])})",
                         f"{r['train_tokens_per_s']:.0f}",
                         f"{r['lr']:g}, {r['batch_size']}, {r['max_length']}, {r['pooling']}",
                         f"{r['machine']}, {r['date']}"])
    return table(["dataset", "loss", "epochs", "valid Spearman after epoch 1", "best (per epoch)", "train tok/s",
                  "lr, batch, max len, pooling", "machine, date"], body)


def cws_table() -> str:
    body = []
    for r in rows("cws_crf_lr.jsonl"):
        mult = "–" if r["multiplier"] is None else f"{r['multiplier']:g}"
        sensible = "–" if "sensible" not in r else ("yes" if r["sensible"] else f"no ({', '.join(r['violations'])})")
        body.append([r["run"], r["encoder_layers"], f"{r['lr']:g}", mult, pct(r["f1_epoch1"]), pct(r["best_f1"]),
                     pct(r["oov_recall_best"]), sensible, f"{r.get('machine', '')}, {r['date']}"])
    return table(["run", "encoder layers", "lr", "CRF lr ×", "epoch-1 F1", "best F1", "OOV recall", "sensible matrix",
                  "machine, date"], body)


# --- encoders, depth, pre-training ---------------------------------------------------------------------------------

def encoders_table() -> str:
    body = []
    for r in rows("encoders.jsonl"):
        if "error" in r:
            body.append([r["family"], "–", r["length"], r["batch"], f"failed: {r['error'][:60]}", "", "", ""])
        else:
            body.append([r["family"], r["params_m"], r["length"], r["batch"], f"{r['ms_per_step']:.0f}",
                         f"{r['tokens_per_s']:,}", f"{r['saved_mb']:,.0f}", _where(r)])
    return table(["family", "params (M)", "length", "batch", "ms / step (fwd+bwd)", "tokens/s",
                  "saved for backward (MB)", "clock, machine, date"], body)


def depth_table() -> str:
    return table(["variant", "blocks (layers)", "params (M)", "branch ratio at init", "status", "final loss (prior)",
                  "dev word F1"],
                 [[r["variant"], f"{r['blocks']} ({r['layers']})", r["params_m"], f"{r['branch_ratio']:.4f}",
                   r["status"], f"{r['final_loss']:.3f} ({r['prior_loss']:.3f})", pct(r["dev_word_f1"])]
                  for r in rows("depth.jsonl")])


def pretrain_table() -> str:
    """Pre-training runs: tokens, speed, held-out MLM."""
    body = []
    for r in (r for r in rows("pretrain.jsonl") if r["study"] == "pretrain"):
        h = r["heldout"] or {}
        body.append([r["family"], r.get("corpus", "general"),
                     f"{r['parameters'] / 1e6:.2f} M ({r['parameters_without_embeddings'] / 1e6:.2f} M)",
                     f"{r['steps']} × {r['batch_size']} × {r['max_length']}", f"{r['tokens'] / 1e6:.2f} M",
                     f"{r['tokens_per_cpu_s']:.0f}",
                     f"{h.get('loss', float('nan')):.3f} / {100 * h.get('accuracy', float('nan')):.1f} %",
                     f"{r['peak_memory_mb']:.0f}"])
    return table(["family", "corpus", "parameters (w/o embeddings)", "steps × batch × length", "tokens",
                  "tokens / CPU s", "held-out MLM loss / accuracy", "peak MB"], body)


def finetune_table() -> str:
    """Fine-tuning grouped by encoder, sharing and task: mean ± sample std over the seeds of the epoch-1 and best
    dev F1, CPU seconds per epoch (evaluation included)."""
    groups: dict[tuple, list[dict]] = {}
    for r in (r for r in rows("pretrain.jsonl") if r["study"] == "finetune"):
        groups.setdefault((r["encoder"], r["unshared"], r["task"], r["head"], r["train_size"]), []).append(r)
    body = []
    for (encoder, unshared, task, head, size), rs in groups.items():
        seconds = sum(r["cpu_s_per_epoch"] for r in rs) / len(rs)  # process CPU time: other jobs do not count
        body.append([encoder.replace("../runs/", "runs/"), "dropped" if unshared else "kept",
                     f"{task} ({head}), {size} train", len(rs), _mean_std([r["f1_per_epoch"][0] for r in rs]),
                     _mean_std([r["best_f1"] for r in rs]),
                     per_epoch(rs[0]["f1_per_epoch"]), f"{seconds:.0f}"])
    return table(["encoder", "sharing", "task (head)", "seeds", "dev F1 after epoch 1", "best dev F1",
                  "F1 per epoch (first seed)", "CPU s / epoch"], body)


# --- peers (benchmarks/peers.py) -----------------------------------------------------------------------------------

FRAMEWORKS = {"zhie": "zhie", "hf_pipeline": "HF pipeline", "hf_trainer": "HF Trainer", "bert4torch": "bert4torch"}


def _where(r: dict) -> str:
    return f"{r['clock']}, {r['machine']}, {r['date']}"


def peers_crf_table() -> str:
    """zhie's CRF against pytorch-crf."""
    return table(["what", "batch × steps × tags", "zhie ms", "pytorch-crf ms", "speed-up", "same results",
                  "clock, machine, date"],
                 [[r["what"].replace("_", " + "), f"{r['batch']} × {r['steps']} × {r['tags']}", f"{r['zhie_ms']:.2f}",
                   f"{r['pytorch_crf_ms']:.2f}", f"{r['speedup']:.1f}×",
                   "yes" if r["same_log_likelihood"] and r["same_paths"] else "NO", _where(r)]
                  for r in rows("peers.jsonl") if r["part"] == "crf"])


def peers_predict_table() -> str:
    """Prediction against the HF pipeline, with roofline figures."""
    return table(["framework", "texts (tokens)", "sent/s", "tokens/s", "encoder FLOPs/token",
                  "GFLOP/s of the measured peak (%)", "clock, machine, date"],
                 [[FRAMEWORKS[r["framework"]], f"{r['texts']} ({r['tokens']:,})", f"{r['sent_per_s']:.1f}",
                   f"{r['tokens_per_s']:,.0f}", f"{r['flops_per_token'] / 1e6:.1f} M", flops(r), _where(r)]
                  for r in rows("peers.jsonl") if r["part"] == "predict"])


def peers_train_table() -> str:
    """GP NER training tokens/s against bert4torch and the HF Trainer."""
    body = []
    for r in (r for r in rows("peers.jsonl") if r["part"] == "train"):
        if "error" in r:
            body.append([FRAMEWORKS[r["framework"]], f"failed: {r['error'][-80:]!r}", "", "", "", _where(r)])
        else:
            body.append([FRAMEWORKS[r["framework"]], f"{r['steps_timed']} ({r['tokens_timed']:,})",
                         f"{r['tokens_per_s']:.0f}", f"{r.get('zhie_speedup', 0):.2f}×", flops(r), _where(r)])
    return table(["framework", "steps timed (tokens)", "tokens/s", "zhie's speed-up",
                  "GFLOP/s of the measured peak (%)", "clock, machine, date"], body)


# --- active learning (benchmarks/active_learning.py) ---------------------------------------------------------------

AL_STRATEGIES = ("random", "uncertainty", "diversity", "uncertainty-diversity")
AL_MIN_STEPS = 600  # active_learning.py's default --min-steps: rounds trained longer are curves of their own


def al_curve_name(r: dict) -> str:
    """A round's curve: its strategy, with the steps it was trained for at least when not the default's."""
    return r["strategy"] + ("" if r["min_steps"] == AL_MIN_STEPS else f", ≥ {r['min_steps']:,} steps")


def al_curve_names(names) -> list[str]:
    """The curves among ``names`` in :data:`AL_STRATEGIES`' order, each strategy's longer-trained curves after it."""
    return sorted(set(names), key=lambda n: (AL_STRATEGIES.index(n.split(",")[0]), n))


def al_rounds(distilled: bool = False) -> list[dict]:
    """The rounds of ``benchmarks/active_learning.py``: the campaign's (keys ``al/``) and ``active_learning.jsonl``'s,
    smoke runs on the tiny encoder left out, each round once (a resumed or continued run prints its done rounds
    again; the last line counts). ``distilled``: the rounds with ``--teacher-labelled``, one per N; else the gold
    models', which a ``--teacher-labelled`` run in the same run directory shares."""
    unique = {}
    for r in [r for line in campaign("al/") for r in line["results"]] + rows("active_learning.jsonl"):
        if r.get("encoder") != "tiny" and (r["teacher_labelled"] > 0 or not distilled):
            key = (r["dataset"], r["strategy"], r["seed"], r["size"], r["head"], r["encoder"], r["min_steps"])
            unique[(*key, r["teacher_labelled"]) if distilled else key] = r
    return list(unique.values())


def al_reference(dataset: str, rounds: list[dict]) -> tuple[list[float], str]:
    """The full-data dev F1s of ``dataset`` and where they come from: the benchmark's own rounds on the whole pool
    (one per seed), else the campaign's 3-epoch GP teacher rows (``s/DATASET/teacher-gp/``)."""
    full = {r["seed"]: r["dev_f1"] for r in rounds if r["dataset"] == dataset and r["share"] == 1}
    if full:
        return list(full.values()), "all labelled"
    teachers = [line["results"][-1] for line in campaign(f"s/{dataset}/teacher-gp/")]
    return [r["dev_f1"] for r in teachers if r.get("head") == "gp" and r.get("epochs") == 3], "3-epoch GP teachers"


def _al_curves(rounds: list[dict], field: str) -> dict[tuple, dict[str, list[float]]]:
    """``{(dataset, size, pool, teacher_labelled): {strategy: [field of each seed]}}`` of the rounds short of the
    whole pool (teacher_labelled 0 for the gold models' ``dev_f1``)."""
    curves: dict[tuple, dict[str, list[float]]] = {}
    for r in rounds:
        if r["share"] < 1 and r.get(field) is not None:
            key = (r["dataset"], r["size"], r["pool"], r["teacher_labelled"] if field == "distilled_f1" else 0)
            curves.setdefault(key, {}).setdefault(al_curve_name(r), []).append(r[field])
    return curves


def active_learning_table() -> str:
    """Dev F1 against labelled sentences, mean ± sample std over the seeds (their number), one column per strategy;
    per dataset the full-data F1 and, per strategy, the smallest size whose mean reaches it minus 1.0 (issue 52's
    "done when"); then the models distilled with teacher-labelled pool texts."""
    gold, distilled = al_rounds(), al_rounds(distilled=True)
    curves = {**_al_curves(gold, "dev_f1"), **_al_curves(distilled, "distilled_f1")}
    if not curves:
        return "_No rows yet: the campaign's `al/` rows (`benchmarks/active_learning.py`) have not run._"
    strategies = al_curve_names(name for by in curves.values() for name in by)
    body = []
    for dataset in dict.fromkeys(key[0] for key in sorted(curves)):
        sizes = sorted(key for key in curves if key[0] == dataset)
        for _, size, pool, n in sizes:
            label = f"{size:,} ({100 * size / pool:.1f}%)" + (f" + {n:,} teacher-labelled" if n else "")
            by = curves[dataset, size, pool, n]
            body.append([DATASETS[dataset], label, *(f"{_mean_std(by[s])} ({len(by[s])})" if s in by else "–"
                                                      for s in strategies)])
        full, source = al_reference(dataset, gold)
        if not full:
            continue
        target = sum(full) / len(full) - 0.01
        body.append([DATASETS[dataset], f"all {sizes[0][2]:,} ({source}): {_mean_std(full)} ({len(full)})",
                     *([""] * len(strategies))])
        reached = []
        for s in strategies:
            hits = [(size, pool) for _, size, pool, n in sizes if not n and s in curves[dataset, size, pool, n]
                    and sum(curves[dataset, size, pool, n][s]) / len(curves[dataset, size, pool, n][s]) >= target]
            reached.append(f"**{hits[0][0]:,}** ({100 * hits[0][0] / hits[0][1]:.1f}%)" if hits else "not reached")
        body.append([DATASETS[dataset], f"reaches full − 1.0 ({100 * target:.2f})", *reached])
    return table(["dataset", "labelled sentences (share of the pool)", *strategies], body)


def active_learning_plot(path: Path) -> None:
    """Dev F1 against labelled sentences (log scale), one panel per dataset, one line per strategy (mean, the seeds'
    sample std as error bars), with the full-data F1 and it minus 1.0 as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gold = al_rounds()
    curves = _al_curves(gold, "dev_f1")
    datasets = list(dict.fromkeys(key[0] for key in sorted(curves) if not key[3]))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.5), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        sizes = sorted(key for key in curves if key[0] == dataset and not key[3])
        for strategy in al_curve_names(name for key in sizes for name in curves[key]):
            points = [(key[1], curves[key][strategy]) for key in sizes if strategy in curves[key]]
            if points:
                ax.errorbar([s for s, _ in points], [100 * statistics.mean(v) for _, v in points],
                            yerr=[100 * statistics.stdev(v) if len(v) > 1 else 0 for _, v in points], marker="o",
                            capsize=3, label=strategy)
        full, source = al_reference(dataset, gold)
        if full:
            mean = 100 * sum(full) / len(full)
            ax.axhline(mean, color="grey", linewidth=1, label=f"full data ({source})")
            ax.axhline(mean - 1, color="grey", linewidth=1, linestyle="--", label="full data − 1.0")
        ax.set_xscale("log")
        ax.set_xticks([key[1] for key in sizes], [f"{key[1]:,}" for key in sizes])
        ax.minorticks_off()
        ax.set_title(DATASETS[dataset])
        ax.set_xlabel("labelled sentences (log scale)")
        ax.set_ylabel("dev F1")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# --- the marked tables of RESULTS.md -------------------------------------------------------------------------------

TABLES: dict[str, Callable[[], str]] = {
    "headline": lambda: campaign_ner_table("c/", HEADLINE),
    "gp-start-rows": lambda: campaign_rows_table("a/"),
    "gp-start": lambda: campaign_ner_table("a/", GP_START),
    "gp-collapse": gp_collapse_table,
    "gp-collapse-steps": gp_steps_table,
    "ner": ner_table,
    "windows": windows_table,
    "boundaries": boundaries_table,
    "options": lambda: campaign_ner_table("d/", OPTIONS),
    "relation": relation_table,
    "relation-notes": relation_notes,
    "cws": cws_table,
    "sts": sts_table,
    "multitask": campaign_multitask_table,
    "multitask-smoke": lambda: multitask_table(rows("multitask.jsonl")),
    "mtmt": lambda: campaign_mtmt_table("b/", MTMT_SYSTEMS, sign=True),
    "mtmt-smoke": mtmt_smoke_table,
    "tradeoff": tradeoff_table,
    "readme-students": readme_students_table,
    "tradeoff-t20": lambda: tradeoff_run_table("runs/tradeoff-t20"),
    "tradeoff-t23": lambda: tradeoff_run_table("runs/tradeoff-t23"),
    "tradeoff-t24": lambda: tradeoff_run_table("runs/tradeoff-t24"),
    "tradeoff-t27": lambda: tradeoff_run_table("runs/tradeoff-t27"),
    "students": students_table,
    "forgetting": forgetting_table,
    "startup": startup_table,
    "serve": serve_table,
    "student-serve": student_serve_table,
    "serve-stack": serve_stack_table,
    "predict-stages": stages_table,
    "export": lambda: export_table("g/export-opset23/cluener-gp", "g/export-opset23/pd-gp"),
    "ort-graphs": ort_graphs_table,
    "export-cmeee": lambda: export_table("g/export/cmeee-egp"),
    "export-tiny": tiny_export_table,
    "serve-tiny": tiny_serve_table,
    "ner-speed": speed_table,
    "ner-hf": hf_table,
    "decode": decode_table,
    "peers-crf": peers_crf_table,
    "peers-predict": peers_predict_table,
    "peers-train": peers_train_table,
    "compile": compile_table,
    "stream": stream_table,
    "ray": ray_table,
    "depth": depth_table,
    "encoders": encoders_table,
    "pretrain": pretrain_table,
    "finetune": finetune_table,
    "active-learning": active_learning_table,
}


def marked(doc: str) -> list[tuple[str, str]]:
    """(name, text between the markers) of every marked table of ``doc`` (:func:`marked.marked`)."""
    return marked_tables.marked(doc, "report", TABLES)


def render(doc: str) -> str:
    """``doc`` with every marked table made afresh from the rows."""
    return marked_tables.render(doc, "report", TABLES)


def stale(doc: str) -> list[str]:
    """The names of the marked tables of ``doc`` that differ from what their rows give."""
    return marked_tables.stale(doc, "report", TABLES)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = p.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="rewrite the marked tables of RESULTS.md in place")
    what.add_argument("--check", action="store_true", help="exit 1 if a marked table differs from its rows")
    what.add_argument("--plot", action="store_true",
                      help="redraw results/tradeoff.png (and results/active_learning.png once it has rows)")
    p.add_argument("--doc", type=Path, default=DOC, help="the document (default: %(default)s)")
    args = p.parse_args(argv)
    if args.plot:
        tradeoff_plot(RESULTS / "tradeoff.png")
        if al_rounds():
            active_learning_plot(RESULTS / "active_learning.png")
        return 0
    if not (args.write or args.check):
        for name, make in TABLES.items():
            print(f"<!-- report:{name} -->\n{make()}\n")
        return 0
    return marked_tables.update(args.doc, "report", TABLES, args.check, "python benchmarks/report.py --write")


if __name__ == "__main__":
    sys.exit(main())
