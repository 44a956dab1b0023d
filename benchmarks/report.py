"""Print the markdown tables of RESULTS.md from benchmarks/results/*.jsonl (one row per recorded run).

    python benchmarks/report.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def rows(name: str) -> list[dict]:
    path = RESULTS / name
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def pct(x) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def ner_table() -> str:
    lines = ["| dataset | head | epochs | dev F1 (per epoch) | P / R | train tok/s | predict sent/s | decode share "
             "| peak MB | lr / head lr / CRF ×, batch | machine, date |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows("ner.jsonl"):
        if r.get("compare") or r.get("speed"):
            continue
        per_epoch = ", ".join(pct(f) for f in r["f1_per_epoch"])
        crf = f" / ×{r['crf_lr_multiplier']:g}" if r.get("crf_lr_multiplier") else ""
        lines.append(
            f"| {r['dataset']} | {r['head']} | {r['epochs']} | **{pct(r['dev_f1'])}** ({per_epoch}) | "
            f"{pct(r['dev_precision'])} / {pct(r['dev_recall'])} | {r['train_tokens_per_s']:.0f} | "
            f"{r['predict_sent_per_s']:.1f} | {100 * r['decode_share']:.2f}% | {r['peak_memory_mb']:.0f} | "
            f"{r['lr']:g} / {r['head_lr']:g}{crf}, {r['batch_size']} | {r['machine']}, {r['date']} |")
    return "\n".join(lines)


def ner_seeds_table() -> str:
    """NER runs that differ only in their seed, as one row: dev F1 mean ± sample std (the headline rows of issue 17,
    and its options table: the options are part of the grouping key)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows("ner.jsonl"):
        if "seed" in r and not (r.get("compare") or r.get("speed")):
            key = (r["dataset"], r["head"], r["encoder"], r["epochs"], r["lr"], r["head_lr"], r["batch_size"],
                   json.dumps(r.get("options", {}), sort_keys=True), r["machine"])
            groups.setdefault(key, []).append(r)
    lines = ["| dataset | head | epochs | options | seeds | dev F1 mean ± std | per seed | machine |",
             "|---|---|---|---|---|---|---|---|"]
    for (dataset, head, _, epochs, _, _, _, opts, device), rs in groups.items():
        per_seed = ", ".join(f"{r['seed']}: {pct(r['dev_f1'])}" for r in rs)
        lines.append(f"| {dataset} | {head} | {epochs} | {opts if opts != '{}' else '–'} | {len(rs)} | "
                     f"{_mean_std([r['dev_f1'] for r in rs])} | {per_seed} | {device} |")
    return "\n".join(lines)


def hf_table() -> str:
    lines = ["| dataset | texts | zhie sent/s | HF pipeline sent/s | speed-up | machine, date |",
             "|---|---|---|---|---|---|"]
    for r in rows("ner.jsonl"):
        if r.get("compare") == "hf_pipeline":
            lines.append(f"| {r['dataset']} | {r['texts']} | {r['zhie_sent_per_s']:.1f} | "
                         f"{r['hf_pipeline_sent_per_s']:.1f} | {r['speedup']:.2f}× | {r['machine']}, {r['date']} |")
    return "\n".join(lines)


def speed_table() -> str:
    lines = ["| dataset | model | predict sent/s | decode share | model share | encoder GFLOP/s (% of peak) "
             "| machine, date |", "|---|---|---|---|---|---|---|"]
    for r in rows("ner.jsonl"):
        if r.get("speed"):
            lines.append(f"| {r['dataset']} | {'/'.join(r['model'].split('/')[-2:])} | {r['predict_sent_per_s']:.0f} | "
                         f"{100 * r['decode_share']:.1f}% | {100 * r['model_share']:.1f}% | {flops(r)} | "
                         f"{r['machine']}, {r['date']} |")
    return "\n".join(lines)


def flops(r: dict) -> str:
    """Achieved GFLOP/s and its share of the measured peak (benchmarks/roofline.py), or – for older rows."""
    if "achieved_tflops" not in r:
        return "–"
    return f"{1e3 * r['achieved_tflops']:,.1f} of {1e3 * r['peak_tflops']:,.0f} ({100 * r['share_of_peak']:.0f}%)"


def peers_tables() -> str:
    """benchmarks/peers.py: CRF against pytorch-crf, prediction against the HF pipeline, training tokens/s."""
    crf = ["| what | batch × steps × tags | zhie ms | pytorch-crf ms | speed-up | same results "
           "| clock, machine, date |", "|---|---|---|---|---|---|---|"]
    predict = ["| framework | texts (tokens) | sent/s | tokens/s | encoder FLOPs/token | GFLOP/s of peak (%) "
               "| clock, machine, date |", "|---|---|---|---|---|---|---|"]
    train = ["| framework | steps timed (tokens) | tokens/s | zhie's speed-up | GFLOP/s of peak (%) "
             "| clock, machine, date |", "|---|---|---|---|---|---|"]
    for r in rows("peers.jsonl"):
        where = f"{r['clock']}, {r['machine']}, {r['date']}"
        if r["part"] == "crf":
            same = "yes" if r["same_log_likelihood"] and r["same_paths"] else "NO"
            crf.append(f"| {r['what']} | {r['batch']} × {r['steps']} × {r['tags']} | {r['zhie_ms']:.2f} | "
                       f"{r['pytorch_crf_ms']:.2f} | {r['speedup']:.1f}× | {same} | {where} |")
        elif r["part"] == "predict":
            predict.append(f"| {r['framework']} | {r['texts']} ({r['tokens']:,}) | {r['sent_per_s']:.1f} | "
                           f"{r['tokens_per_s']:,.0f} | {r['flops_per_token'] / 1e6:.1f} M | {flops(r)} | {where} |")
        elif "error" in r:
            train.append(f"| {r['framework']} | failed: {r['error'][-80:]!r} | | | | {where} |")
        else:
            train.append(f"| {r['framework']} | {r['steps_timed']} ({r['tokens_timed']:,}) | {r['tokens_per_s']:.0f} | "
                         f"{r.get('zhie_speedup', 0):.2f}× | {flops(r)} | {where} |")
    return "\n".join(crf) + "\n\n" + "\n".join(predict) + "\n\n" + "\n".join(train)


def relation_tables() -> str:
    train = ["| variant | epochs | lr / head lr, batch | dev triple F1 (per epoch) | P / R | entity F1 | train tok/s "
             "| peak MB | machine, date |", "|---|---|---|---|---|---|---|---|---|"]
    other = []
    for r in rows("relation.jsonl"):
        if r["run"] == "train":
            per_epoch = ", ".join(pct(f) for f in r["f1_per_epoch"])
            train.append(f"| {r['variant']} | {r['epochs']} | {r['lr']:g} / {r['head_lr']:g}, {r['batch_size']} | "
                         f"**{pct(r['dev_f1'])}** ({per_epoch}) | {pct(r['dev_precision'])} / {pct(r['dev_recall'])} | "
                         f"{pct(r['dev_entity_f1'])} | {r['train_tokens_per_s']:.0f} | {r['peak_memory_mb']:.0f} | "
                         f"{r['machine']}, {r['date']} |")
        elif r["run"] == "memory":
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
    return "\n".join(train) + "\n\n" + "\n".join(other)


def sts_table() -> str:
    lines = ["| dataset | loss | epochs | valid Spearman after epoch 1 | best (per epoch) | train tok/s "
             "| lr, batch, max len, pooling | machine, date |", "|---|---|---|---|---|---|---|---|"]
    for r in rows("sts.jsonl"):
        if "epochs" not in r:
            lines.append(f"| {r['dataset']} | {r['loss']} | 0 | – | **{pct(r['spearman'])}** | – | –, –, "
                         f"{r['max_length']}, {r['pooling']} | {r['machine']}, {r['date']} |")
            continue
        per_epoch = ", ".join(pct(f) for f in r["spearman_per_epoch"])
        lines.append(f"| {r['dataset']} | {r['loss']} | {r['epochs']} | {pct(r['spearman_epoch1'])} | "
                     f"**{pct(r['spearman'])}** ({per_epoch}) | {r['train_tokens_per_s']:.0f} | {r['lr']:g}, "
                     f"{r['batch_size']}, {r['max_length']}, {r['pooling']} | {r['machine']}, {r['date']} |")
    return "\n".join(lines)


def cws_table() -> str:
    lines = ["| run | encoder layers | lr | CRF lr × | epoch-1 F1 | best F1 | OOV recall | sensible matrix "
             "| machine, date |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows("cws_crf_lr.jsonl"):
        mult = "–" if r["multiplier"] is None else f"{r['multiplier']:g}"
        sensible = "–" if "sensible" not in r else ("yes" if r["sensible"] else f"no ({', '.join(r['violations'])})")
        lines.append(f"| {r['run']} | {r['encoder_layers']} | {r['lr']:g} | {mult} | {pct(r['f1_epoch1'])} | "
                     f"{pct(r['best_f1'])} | {pct(r['oov_recall_best'])} | {sensible} | {r.get('machine', '')}, "
                     f"{r['date']} |")
    return "\n".join(lines)


def encoders_table() -> str:
    lines = ["| family | params (M) | length | batch | ms / step (fwd+bwd) | tokens/s | saved for backward (MB) "
             "| clock, machine, date |", "|---|---|---|---|---|---|---|---|"]
    for r in rows("encoders.jsonl"):
        if "error" in r:
            lines.append(f"| {r['family']} | – | {r['length']} | {r['batch']} | failed: {r['error'][:60]} | | | |")
            continue
        lines.append(f"| {r['family']} | {r['params_m']} | {r['length']} | {r['batch']} | {r['ms_per_step']:.0f} | "
                     f"{r['tokens_per_s']:,} | {r['saved_mb']:,.0f} | {r['clock']}, {r['machine']}, {r['date']} |")
    return "\n".join(lines)


def depth_table() -> str:
    lines = ["| variant | blocks (layers) | params (M) | branch ratio at init | status | final loss (prior) "
             "| dev word F1 |", "|---|---|---|---|---|---|---|"]
    for r in rows("depth.jsonl"):
        f1 = "–" if r["dev_word_f1"] is None else pct(r["dev_word_f1"])
        lines.append(f"| {r['variant']} | {r['blocks']} ({r['layers']}) | {r['params_m']} | {r['branch_ratio']:.4f} | "
                     f"{r['status']} | {r['final_loss']:.3f} ({r['prior_loss']:.3f}) | {f1} |")
    return "\n".join(lines)


def multitask_table(records: list[dict]) -> str:
    """One row per multi-task or single-task run of ``benchmarks/multitask.py`` (its JSON lines): every member's dev
    metric (and, for a multi-task run, its difference to the same member trained alone in the same suite and
    setting), the weights at the last step, s/step."""
    def setting(r: dict) -> tuple:  # what a single-task run must share with a multi-task run to be its baseline
        return tuple(r.get(k) for k in ("suite", "encoder", "encoder_layers", "steps", "batch_size", "train_size",
                                        "dev_size", "max_length", "lr", "head_lr", "seed"))

    alone = {(setting(r), name): v for r in records if r["run"].startswith("single:") for name, v in r["dev"].items()}

    def member(r: dict, name: str, v: float) -> str:
        single = None if r["run"].startswith("single:") else alone.get((setting(r), name))
        return f"{name} {pct(v)}" + ("" if single is None else f" ({100 * (v - single):+.2f})")

    lines = ["| suite | run | dev metrics (×100; multi-task: ± against the member alone) | weights at the last step | "
             "s / step (wall) | CPU s |", "|---|---|---|---|---|---|"]
    for r in records:
        dev = ", ".join(member(r, name, v) for name, v in r["dev"].items())
        weights = ", ".join(f"{name} {v:.3g}" for name, v in (r.get("final_weights") or {}).items()) or "–"
        lines.append(f"| {r['suite']} | {r['run']} | {dev} | {weights} | {r['train_s_per_step']:.2f} | "
                     f"{r['run_cpu_s']:.0f} |")
    return "\n".join(lines)


def _mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{100 * mean:.2f}"
    std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5  # sample std
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def pretrain_tables() -> str:
    """Pre-training runs (tokens, speed, held-out MLM), then fine-tuning grouped by encoder, sharing and task:
    mean ± sample std over the seeds of the epoch-1 and best dev F1, CPU seconds per epoch (evaluation included)."""
    lines = ["| family | corpus | parameters (w/o embeddings) | steps × batch × length | tokens | tokens / CPU s | "
             "held-out MLM loss / accuracy | peak MB |", "|---|---|---|---|---|---|---|---|"]
    runs = rows("pretrain.jsonl")
    for r in (r for r in runs if r["study"] == "pretrain"):
        h = r["heldout"] or {}
        lines.append(f"| {r['family']} | {r.get('corpus', 'general')} | {r['parameters'] / 1e6:.2f} M "
                     f"({r['parameters_without_embeddings'] / 1e6:.2f} M) | {r['steps']} × {r['batch_size']} × "
                     f"{r['max_length']} | {r['tokens'] / 1e6:.2f} M | {r['tokens_per_cpu_s']:.0f} | "
                     f"{h.get('loss', float('nan')):.3f} / {100 * h.get('accuracy', float('nan')):.1f} % | "
                     f"{r['peak_memory_mb']:.0f} |")
    groups: dict[tuple, list[dict]] = {}
    for r in (r for r in runs if r["study"] == "finetune"):
        groups.setdefault((r["encoder"], r["unshared"], r["task"], r["head"], r["train_size"]), []).append(r)
    lines += ["", "| encoder | sharing | task (head) | seeds | dev F1 after epoch 1 | best dev F1 | "
              "F1 per epoch (first seed) | CPU s / epoch |", "|---|---|---|---|---|---|---|---|"]
    for (encoder, unshared, task, head, size), rs in groups.items():
        per_epoch = ", ".join(pct(f) for f in rs[0]["f1_per_epoch"])
        seconds = sum(r["cpu_s_per_epoch"] for r in rs) / len(rs)  # process CPU time: other jobs do not count
        name = encoder.replace("../runs/", "runs/")
        lines.append(f"| {name} | {'dropped' if unshared else 'kept'} | {task} ({head}), {size} train | "
                     f"{len(rs)} | {_mean_std([r['f1_per_epoch'][0] for r in rs])} | "
                     f"{_mean_std([r['best_f1'] for r in rs])} | {per_epoch} | {seconds:.0f} |")
    return "\n".join(lines)


def campaign_groups(section: str) -> dict[str, list[dict]]:
    """The campaign's finished rows (benchmarks/campaign.py) whose key starts with ``section``, grouped by the key
    without its trailing ``/sN`` (the seeds of one configuration)."""
    groups: dict[str, list[dict]] = {}
    for line in rows("campaign.jsonl"):
        if line["key"].startswith(section):
            groups.setdefault(re.sub(r"/s\d+$", "", line["key"]), []).append(line)
    return groups


def campaign_ner_table(section: str) -> str:
    """NER rows of the campaign: dev F1 mean ± sample std over the seeds, the mean dev F1 after each epoch, the
    seeds' values, and where the rows ran: the CPU hours they took on this project's 2-core machine, or the minutes
    each took on a GPU beside the rows it ran with (neither is a performance figure)."""
    lines = ["| configuration | epochs | seeds | dev F1 mean ± std | mean F1 after each epoch | per seed | ran on |",
             "|---|---|---|---|---|---|---|"]
    for group, lines_ in campaign_groups(section).items():
        runs = [(line, line["results"][-1]) for line in lines_]
        curves = [r["f1_per_epoch"] for _, r in runs]
        epochs = min(len(c) for c in curves)
        mean_curve = ", ".join(pct(sum(c[e] for c in curves) / len(curves)) for e in range(epochs))
        per_seed = ", ".join(f"{line['seed']}: {pct(r['dev_f1'])}" for line, r in runs)
        lines.append(f"| {group} | {runs[0][1]['epochs']} | {len(runs)} | {_mean_std([r['dev_f1'] for _, r in runs])} "
                     f"| {mean_curve} | {per_seed} | {_ran_on(lines_)} |")
    return "\n".join(lines)


def _ran_on(lines: list[dict]) -> str:
    """``CPU 2.9 h`` for rows of the campaign runner, ``H100 5-6 min (16 at once)`` for rows of a GPU machine, or
    both."""
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


def campaign_mtmt_table(section: str = "b/") -> str:
    """MTMT rows of the campaign: WikiANN de dev F1 mean ± std per system over the seeds, and the paired difference
    to direct transfer and to TSL (each seed's F1 minus the same seed's, over the seeds where both came from one
    campaign row: only there did they distil the same teachers; another row of that seed trained its own)."""
    by_system: dict[str, dict[int, dict]] = {}
    row_of: dict[tuple[str, int], str] = {}
    for line in rows("campaign.jsonl"):
        if line["key"].startswith(section):
            for r in line["results"]:
                by_system.setdefault(r["system"], {})[r["seed"]] = r
                row_of[r["system"], r["seed"]] = line["key"]

    def paired(system: str, base: str) -> str:
        seeds = [s for s in sorted(by_system[system]) if system != base and (base, s) in row_of
                 and row_of[base, s] == row_of[system, s]]
        return _mean_std([by_system[system][s]["f1"] - by_system[base][s]["f1"] for s in seeds])

    lines = ["| system | seeds | de dev F1 mean ± std | − direct (paired) | − TSL (paired) | P / R (mean) | per seed |",
             "|---|---|---|---|---|---|---|"]
    for system, by_seed in by_system.items():
        rs = list(by_seed.values())
        p, r_ = (sum(r[k] for r in rs) / len(rs) for k in ("precision", "recall"))
        lines.append(f"| {system} | {len(rs)} | {_mean_std([r['f1'] for r in rs])} | {paired(system, 'direct')} | "
                     f"{paired(system, 'tsl')} | {pct(p)} / {pct(r_)} | "
                     + ", ".join(f"{r['seed']}: {pct(r['f1'])}" for r in rs) + " |")
    return "\n".join(lines)


def students_table(section: str = "s/") -> str:
    """The campaign's student rows: dev F1 per epoch and training time per epoch, against their teacher's."""
    lines = ["| row | student | unlabelled texts | dev F1 (per epoch) | s per epoch | train tok/s |",
             "|---|---|---:|---|---|---:|"]
    for line in rows("campaign.jsonl"):
        if not line["key"].startswith(section):
            continue
        for r in line["results"]:
            if "student" in r:
                kind = (f"{r['layers']} layers ({r['keep_layers']})" if r["student"] == "cut" else
                        f"conv {r['layers']} x {r['width']}" + (f", {r['head']}" if r.get("head") else ""))
                steps = [b - a for a, b in zip([0.0, *r["epoch_s"]], r["epoch_s"])]
            else:  # the teacher's row (benchmarks/ner.py)
                kind, steps = f"teacher, 12 layers, {r['head']}", None
                r = {**r, "unlabelled_texts": 0}
            lines.append(f"| {line['key']} | {kind} | {r['unlabelled_texts']:,} | **{pct(r['dev_f1'])}** ("
                         + ", ".join(pct(f) for f in r["f1_per_epoch"]) + ") | "
                         + (", ".join(f"{x:.0f}" for x in steps) if steps else "–")
                         + f" | {r['train_tokens_per_s']:.0f} |")
    return "\n".join(lines)


def tradeoff_table() -> str:
    """``benchmarks/tradeoff.py``'s rows: F1 against speed through ``zhie predict``, per model and variant."""
    lines = ["| model | variant | layers | dev F1 | sentences/s | characters/s | cold start s | peak RSS MB | size MB "
             "| encoder % of peak | load before / after | date |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows("tradeoff.jsonl"):
        share = r.get("encoder_share_of_peak")
        lines.append(f"| {r['model']} | {r['variant']} | {r['layers'] or '–'} | {pct(r['dev_f1'])} | "
                     f"**{r['sentences_per_s']:,.0f}** | {r['characters_per_s']:,.0f} | {r['cold_start_s']:.2f} | "
                     f"{r['peak_rss_mb']} | {r['size_mb']:g} | {'–' if share is None else f'{100 * share:.0f}'} | "
                     f"{r['load_before'][0]:.2f} / {r['load_after'][0]:.2f} | {r['date']} |")
    return "\n".join(lines)


def tradeoff_plot(path: Path) -> None:
    """Dev F1 against sentences/s (log scale) of every tradeoff row, one marker per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant, marker in (("torch", "s"), ("fp32", "o"), ("int8", "^")):
        rs = [r for r in rows("tradeoff.jsonl") if r["variant"] == variant]
        ax.scatter([r["sentences_per_s"] for r in rs], [100 * r["dev_f1"] for r in rs], marker=marker, label=variant)
        for r in rs:
            ax.annotate(r["model"], (r["sentences_per_s"], 100 * r["dev_f1"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("CLUENER sentences/s through zhie predict, 2 CPU cores (log scale)")
    ax.set_ylabel("dev F1")
    ax.legend(title="variant")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    campaign_multitask = [r for line in rows("campaign.jsonl") if line["key"].startswith("e/") for r in line["results"]]
    print("## NER\n\n" + ner_table() + "\n\n" + ner_seeds_table() + "\n\n" + speed_table() + "\n\n" + hf_table() +
          "\n\n## CWS CRF learning-rate study\n\n" + cws_table() + "\n\n## GPLinker\n\n" + relation_tables() +
          "\n\n## Sentence embeddings\n\n" + sts_table() + "\n\n## Encoders\n\n" + encoders_table() +
          "\n\n## Depth\n\n" + depth_table() + "\n\n## Peers and roofline\n\n" + peers_tables() +
          "\n\n## Multi-task\n\n" + multitask_table(rows("multitask.jsonl")) +
          "\n\n## Pre-training\n\n" + pretrain_tables() +
          "\n\n## Campaign (issue 23)\n\n" + "\n\n".join(campaign_ner_table(s) for s in ("a/", "c/", "d/")) +
          "\n\n" + campaign_mtmt_table() + "\n\n" + multitask_table(campaign_multitask) +
          "\n\n## Students and the trade-off (issue 35)\n\n" + students_table() + "\n\n" + tradeoff_table())
    tradeoff_plot(RESULTS / "tradeoff.png")
