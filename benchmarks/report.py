"""Print the markdown tables of RESULTS.md from benchmarks/results/*.jsonl (one row per recorded run).

    python benchmarks/report.py
"""

from __future__ import annotations

import json
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
        if r.get("compare"):
            continue
        per_epoch = ", ".join(pct(f) for f in r["f1_per_epoch"])
        crf = f" / ×{r['crf_lr_multiplier']:g}" if r.get("crf_lr_multiplier") else ""
        lines.append(
            f"| {r['dataset']} | {r['head']} | {r['epochs']} | **{pct(r['dev_f1'])}** ({per_epoch}) | "
            f"{pct(r['dev_precision'])} / {pct(r['dev_recall'])} | {r['train_tokens_per_s']:.0f} | "
            f"{r['predict_sent_per_s']:.1f} | {100 * r['decode_share']:.2f}% | {r['peak_memory_mb']:.0f} | "
            f"{r['lr']:g} / {r['head_lr']:g}{crf}, {r['batch_size']} | {r['machine']}, {r['date']} |")
    return "\n".join(lines)


def hf_table() -> str:
    lines = ["| dataset | texts | zhie sent/s | HF pipeline sent/s | speed-up | machine, date |",
             "|---|---|---|---|---|---|"]
    for r in rows("ner.jsonl"):
        if r.get("compare") == "hf_pipeline":
            lines.append(f"| {r['dataset']} | {r['texts']} | {r['zhie_sent_per_s']:.1f} | "
                         f"{r['hf_pipeline_sent_per_s']:.1f} | {r['speedup']:.2f}× | {r['machine']}, {r['date']} |")
    return "\n".join(lines)


def cws_table() -> str:
    lines = ["| run | encoder layers | CRF lr × | epoch-1 F1 | best F1 | OOV recall | sensible matrix | date |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows("cws_crf_lr.jsonl"):
        mult = "–" if r["multiplier"] is None else f"{r['multiplier']:g}"
        sensible = "–" if "sensible" not in r else ("yes" if r["sensible"] else f"no ({', '.join(r['violations'])})")
        lines.append(f"| {r['run']} | {r['encoder_layers']} | {mult} | {pct(r['f1_epoch1'])} | {pct(r['best_f1'])} | "
                     f"{pct(r['oov_recall_best'])} | {sensible} | {r['date']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("## NER\n\n" + ner_table() + "\n\n" + hf_table() + "\n\n## CWS CRF learning-rate study\n\n" + cws_table())
