"""Cold start of the ``zhie`` command (issue 25): a fresh process per run, one text, the median wall time of ``--runs``.

    python benchmarks/startup.py --model runs/cluener-gp/best [--export cluener.onnx] [--runs 5]

Rows (``results/startup.jsonl``), one per command: ``zhie --help``, ``zhie predict MODEL TEXT`` with the torch model,
and the same with its export (written to a temporary directory by ``zhie export`` unless ``--export`` names one; the
export step is not timed). Each run is a new Python process (``python -c "from zhie.cli import main; ..."``, as the
``zhie`` script), so imports, loading and the one prediction all count; whether torch was imported is recorded from
``-X importtime`` of one extra run. zhie's modules are compiled to bytecode first (:func:`common.compile_zhie`).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from common import append_result, compile_zhie, machine, machine_lock

TEXT = "王伟在青山市的远华大学工作了很多年。"
ZHIE = [sys.executable, "-c", "from zhie.cli import main; raise SystemExit(main())"]


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(ZHIE + args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def imports_torch(args: list[str]) -> bool:
    done = subprocess.run([sys.executable, "-X", "importtime", *ZHIE[1:], *args], check=True, capture_output=True,
                          text=True)
    # -X importtime lines: "import time: self | cumulative | <indent by nesting>package"
    return any(line.split("|")[-1].strip() == "torch" for line in done.stderr.splitlines())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a torch model directory")
    p.add_argument("--export", default=None, help="its export directory (default: exported here, not timed)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--label", default="")
    args = p.parse_args()
    export = args.export
    if export is None:
        export = str(Path(tempfile.mkdtemp(prefix="zhie-startup-")) / "export")
        subprocess.run(ZHIE + ["export", args.model, "--out", export], check=True, stdout=subprocess.DEVNULL)
    compile_zhie()
    commands = {"help": ["--help"], "predict torch": ["predict", args.model, TEXT],
                "predict export": ["predict", export, TEXT]}
    for name, command in commands.items():
        seconds = [timed(command) for _ in range(args.runs)]
        append_result("startup", {"command": name, "median_s": round(statistics.median(seconds), 3),
                                  "runs_s": [round(s, 3) for s in seconds], "imports_torch": imports_torch(command),
                                  "model": args.model, "text_chars": len(TEXT), "label": args.label,
                                  "machine": machine(), "date": str(date.today())})


if __name__ == "__main__":
    with machine_lock():
        main()
