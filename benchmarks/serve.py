"""Load test of ``zhie serve``: 1, 4, 16 and 64 concurrent clients send CLUENER dev sentences (one per request) to one
server on loopback for a fixed time, with request batching and without it (``--max-batch 1``).

    python benchmarks/serve.py --model runs/cluener-gp/best --seconds 10

The server is a separate process (``zhie serve``), started once per batching setting; the clients are asyncio tasks
over one httpx client that stop by themselves after ``--seconds``. Each row (``results/serve.jsonl``): requests/s,
texts/s, p50/p95/p99 latency in ms, errors (any answer that is not 200, or no answer).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import httpx
import numpy as np
from common import DATA, append_result, machine, machine_lock

from zhie.data import read_ner


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, max_batch: int, max_wait_ms: float, threads: int) -> subprocess.Popen:
    command = [sys.executable, "-c", f"import torch; torch.set_num_threads({threads}); from zhie.cli import main; "
               f"raise SystemExit(main())", "serve", model, "--port", str(port), "--max-batch", str(max_batch),
               "--max-wait-ms", str(max_wait_ms)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the server did not answer /health within 120 s")


async def load(url: str, texts: list[str], clients: int, seconds: float) -> dict:
    """``clients`` loops, each sending the next sentence and waiting for the answer, until ``seconds`` have passed."""
    latencies: list[float] = []
    errors = 0
    end = time.perf_counter() + seconds

    async def client(i: int, http: httpx.AsyncClient) -> None:
        nonlocal errors
        k = i
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            try:
                r = await http.post(url, json={"texts": [texts[k % len(texts)]]})
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - t0)
            else:
                errors += 1
            k += clients

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(i, http) for i in range(clients)))
        elapsed = time.perf_counter() - start
    ms = np.array(latencies) * 1000 if latencies else np.zeros(1)
    return {"requests_per_s": round(len(latencies) / elapsed, 1), "texts_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 1), "p95_ms": round(float(np.percentile(ms, 95)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1), "requests": len(latencies), "errors": errors}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model or export directory (a CLUENER NER model)")
    p.add_argument("--clients", default="1,4,16,64")
    p.add_argument("--seconds", type=float, default=10.0, help="per concurrency level")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    args = p.parse_args()
    texts = [ex.text for ex in read_ner(DATA / "ner" / "cluener" / "dev.json")]
    for max_batch in (args.max_batch, 1):
        port = free_port()
        server = start_server(args.model, port, max_batch, args.max_wait_ms, args.threads)
        try:
            for clients in map(int, args.clients.split(",")):
                row = asyncio.run(load(f"http://127.0.0.1:{port}/predict", texts, clients, args.seconds))
                append_result("serve", {"clients": clients, "batching": max_batch > 1, "max_batch": max_batch,
                                        "max_wait_ms": args.max_wait_ms, **row, "seconds": args.seconds,
                                        "model": Path(args.model).name, "threads": args.threads,
                                        "machine": machine(), "date": str(date.today())})
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    with machine_lock():
        main()
