"""``zhie serve`` under N concurrent clients against ``zhie predict``'s offline rate on the same texts.

    python benchmarks/serve.py --model runs/pd-e5/best --data peoples_daily --clients 1,16,64 --seconds 30
    python benchmarks/serve.py --model EXPORT_DIR --data cluener --clients 1,16,64 --texts-per-request 1,32

``--model`` is a model directory or an export directory (``zhie export``): the offline run and the server both load
it with :func:`zhie.load`, so both run the export on onnxruntime; the runtime each reports (the offline process's
``pipe.model``, the server's ``GET /info``) is checked to be the same and recorded as ``runtime``.

Three processes on disjoint CPUs (Linux CPU affinity), so that the client does not share the server's cores:

1. offline, once per run: a fresh process on ``--server-cpus`` loads the model and times ``zhie predict``'s own path
   (``Pipeline.stream`` over chunks of ``--chunk-lines`` texts, sorted by length inside, ``--batch-size``, each
   prediction written as ``zhie.deploy.outputs.output_line`` writes it)
   over all the texts ``--offline-passes`` times, after a warm-up call -> the median pass's sentences/s;
2. the server: ``zhie serve`` on ``--server-cpus`` with ``--max-batch``, ``--max-wait-ms`` and ``--server-batch-size``
   (its ``--batch-size``);
3. the client: this process, on ``--client-cpus``: for each number of texts per request k of ``--texts-per-request``
   and each concurrency level N of ``--clients``, N keep-alive connections each send k texts per request (the next k
   of the shuffled texts; a minimal HTTP/1.1 client on asyncio streams, so that the client's own work stays small)
   for ``--warmup`` + ``--seconds`` seconds; only answers that arrive within the last ``--seconds`` count. A request
   of k texts counts k sentences; latency is per request.

Torch's threads are the server CPUs' count in both 1 and 2. Default CPUs: the last one for the client, the others for
the server (and the offline run). Each row (``results/serve.jsonl``), one per k and N: service sentences/s (and
requests/s), the offline sentences/s of the run, their ratio, p50/p99 latency per request in ms, errors (an answer
that is not 200, or none), the server's resident memory when the warm-up ends and when the level ends
(``rss_warm_mb``, ``rss_end_mb``, from ``/proc``), the settings (``texts_per_request`` among them) and the machine.

The server's settings for k texts per request (:mod:`zhie.deploy.service`): ``--max-batch`` stays the server's
default, 64 texts per model call. The batcher takes the oldest requests while they fit in ``max_batch`` texts and
never splits one, so a call holds two 32-text requests (64 single texts), and inside it the texts are sorted by length
into forward passes of at most ``--server-batch-size`` (the server's default, 16; ``zhie predict``'s ``--batch-size``
is 32): what a user of ``zhie serve`` gets. A larger ``--max-batch`` sorts more texts together (less
padding) but makes every request of a call wait for the whole call. ``--max-wait-ms`` is the server's default (0:
a call starts as soon as the model is free; with 5, the old default, a lone 32-text request waited 5 ms for a second
that never came). The limits must not refuse the load: 32 texts are far within ``--max-texts`` (256) and
the body limit, and N requests in flight within ``--max-in-flight`` (256), but N x k texts may wait at once, so the
server's ``--max-queue`` (default 1,024 texts; 64 x 32 = 2,048 would be answered 503) is raised to the largest
N x k of the run when that is more; each limit passed is recorded in the row (``server_flags``).

Before the levels, ``--big-body-mb`` (default 200; 0: skip) streams one chunked body of that size to ``/predict``
and reports the answer's status and how much the server's peak resident memory grew meanwhile (its ``VmHWM``, reset
through ``/proc/PID/clear_refs`` just before): the body limit must stop reading, not buffer the body.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import date
from pathlib import Path

import numpy as np
import torch
from common import DATA, append_result, machine, machine_lock

from zhie.data import read_ner
from zhie.deploy.service import Batching

DATASETS = {"peoples_daily": ("ner/peoples_daily/example.dev", "conll"), "cluener": ("ner/cluener/dev.json", "auto")}
OFFLINE = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[3]))
import zhie
from zhie.deploy.outputs import output_line
from zhie.deploy.stream import Line
texts = json.load(open(sys.argv[1], encoding="utf-8"))
batch_size, chunk_lines = int(sys.argv[4]), int(sys.argv[5])
pipe = zhie.load(sys.argv[2])
pipe.predict(texts[:batch_size], batch_size)  # warm-up
rates = []
for _ in range(int(sys.argv[6])):
    t0 = time.perf_counter()
    n = sum(len(output_line(pipe.task, Line(None, i, t), p)) > 0 for i, (t, p) in
            enumerate(zip(texts, pipe.stream(texts, batch_size=batch_size, chunk_size=chunk_lines))))
    rates.append(n / (time.perf_counter() - t0))
print(json.dumps({"rates": rates, "runtime": getattr(pipe.model, "runtime", "torch")}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pinned(cpus: set[int]):
    return lambda: os.sched_setaffinity(0, cpus)


def offline_rate(model: str, texts_file: str, cpus: set[int], batch_size: int, chunk_lines: int, passes: int
                 ) -> tuple[float, list[float], str]:
    """``zhie predict``'s sentences/s over the texts, the median of ``passes`` passes over them in a fresh process on
    ``cpus`` (one pass of a fast student's 1,343 texts takes 0.4 s: single passes differed by 15 %), every pass's
    rate, and the runtime it ran on (``torch`` or ``onnxruntime``)."""
    out = subprocess.run([sys.executable, "-c", OFFLINE, texts_file, model, str(len(cpus)), str(batch_size),
                          str(chunk_lines), str(passes)], capture_output=True, text=True, check=True,
                         preexec_fn=pinned(cpus))
    record = json.loads(out.stdout.strip().splitlines()[-1])
    return float(np.median(record["rates"])), [round(r, 1) for r in record["rates"]], record["runtime"]


def start_server(model: str, port: int, cpus: set[int], flags: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-c", f"import torch; torch.set_num_threads({len(cpus)}); from zhie.cli import main; "
               "raise SystemExit(main())", "serve", model, "--port", str(port), *flags]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pinned(cpus))
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=1) as r:
                if r.status == 200:
                    return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the server was not ready within 300 s")


def server_runtime(port: int) -> str:
    """The runtime the server runs its model on (``GET /info``: ``torch`` or ``onnxruntime``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=10) as r:
        return json.load(r)["runtime"]


def request_bodies(texts: list[str], per_request: int) -> list[bytes]:
    """The bodies of requests of ``per_request`` texts each: the texts in order, cut into runs of that many (wrapping
    round to the first when fewer are left)."""
    count = max(1, len(texts) // per_request)
    return [json.dumps({"texts": [texts[(i * per_request + j) % len(texts)] for j in range(per_request)]},
                       ensure_ascii=False).encode() for i in range(count)]


def limit_flags(clients: list[int], per_request: list[int]) -> list[str]:
    """The server's limits raised where the load would pass them (:mod:`zhie.deploy.service`'s defaults): texts per
    request, requests in flight, texts waiting (N clients of k texts each: N x k at once); none when it fits."""
    from zhie.deploy.service import Limits

    needed = {"--max-texts": (max(per_request), Limits().max_texts),
              "--max-in-flight": (max(clients), Limits().max_in_flight),
              "--max-queue": (max(clients) * max(per_request), Batching().max_queue)}
    return [part for flag, (value, default) in needed.items() if value > default for part in (flag, str(value))]


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> int:
    """POST ``body`` to /predict on a keep-alive connection; the answer's status (its body is read and dropped)."""
    writer.write(b"POST /predict HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(v) for k, _, v in (line.partition(":") for line in lines[1:]) if k.lower() == "content-length")
    await reader.readexactly(length)
    return int(lines[0].split()[1])


def memory_mb(pid: int, field: str = "VmRSS") -> float:
    """A memory figure of process ``pid`` from ``/proc`` (``VmRSS``: resident now; ``VmHWM``: its peak), in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return round(int(next(line.split()[1] for line in status.splitlines() if line.startswith(field + ":"))) / 1024, 1)


def big_body(port: int, pid: int, megabytes: int) -> dict:
    """Stream a chunked body of ``megabytes`` to /predict as fast as the server takes it; the answer's status and the
    growth of the server's peak RSS meanwhile."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the RSS now
    before = memory_mb(pid, "VmHWM")
    chunk = b'{"texts": ["' + b"a" * (1 << 20)  # one MiB per chunk, of a JSON text that never ends
    sent, status = 0, None
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"POST /predict HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        try:
            while sent < megabytes << 20:
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
            s.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, TimeoutError):  # the server stopped reading first
            pass
        try:
            answer = s.recv(4096)
            status = int(answer.split()[1]) if answer.startswith(b"HTTP/1.1") else None
        except (TimeoutError, ConnectionResetError):
            pass
    return {"big_body_mb": megabytes, "big_body_sent_mb": round(sent / (1 << 20), 1), "big_body_status": status,
            "big_body_peak_rss_growth_mb": round(memory_mb(pid, "VmHWM") - before, 1)}


async def load(port: int, bodies: list[bytes], clients: int, warmup: float, seconds: float, pid: int,
               per_request: int = 1) -> dict:
    """``clients`` connections, each sending the next body (of ``per_request`` texts) as soon as its last answer came,
    for warmup + seconds; the server's (``pid``) resident memory when the warm-up ends and at the end."""
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter() + warmup
    end = start + seconds

    async def rss_when_warm() -> float:
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        return memory_mb(pid)

    async def client(i: int) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        k = i
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            try:
                ok = await exchange(reader, writer, bodies[k % len(bodies)]) == 200
            except (OSError, asyncio.IncompleteReadError, ValueError, StopIteration):
                ok = False
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            t1 = time.perf_counter()
            if start <= t1 <= end:
                if ok:
                    latencies.append(t1 - t0)
                else:
                    errors += 1
            k += clients
        writer.close()

    warm, *_ = await asyncio.gather(rss_when_warm(), *(client(i) for i in range(clients)))
    ms = np.array(latencies) * 1000 if latencies else np.zeros(1)
    return {"sentences_per_s": round(len(latencies) * per_request / seconds, 2),
            "requests_per_s": round(len(latencies) / seconds, 2), "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1), "requests": len(latencies), "errors": errors,
            "rss_warm_mb": warm, "rss_end_mb": memory_mb(pid)}


def cpu_set(value: str) -> set[int]:
    """``0-2,5`` -> {0, 1, 2, 5}."""
    cpus: set[int] = set()
    for part in value.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model or export directory (an NER model)")
    p.add_argument("--data", default="peoples_daily", choices=sorted(DATASETS))
    p.add_argument("--limit", type=int, default=None, help="use the first N texts (after a seeded shuffle)")
    p.add_argument("--clients", default="1,16,64")
    p.add_argument("--texts-per-request", default="1",
                   help="texts per request, a list (e.g. 1,32): every level of --clients runs with each")
    p.add_argument("--seconds", type=float, default=30.0, help="measured, per concurrency level")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of load before measuring, per level")
    p.add_argument("--max-batch", type=int, default=Batching.max_batch, help="zhie serve's (default: its default)")
    p.add_argument("--max-wait-ms", type=float, default=Batching.max_wait_ms,
                   help="zhie serve's (default: its default)")
    p.add_argument("--batch-size", type=int, default=32, help="zhie predict's")
    p.add_argument("--server-batch-size", type=int, default=Batching.batch_size,
                   help="zhie serve's --batch-size (default: its default)")
    p.add_argument("--chunk-lines", type=int, default=4096, help="zhie predict's")
    p.add_argument("--offline-passes", type=int, default=5, help="passes over the texts of the offline run (median)")
    p.add_argument("--big-body-mb", type=int, default=200, help="one chunked body of this size first (0: none)")
    p.add_argument("--label", default=None, help="the rows' name (default: the model directory's name)")
    available = sorted(os.sched_getaffinity(0))
    p.add_argument("--server-cpus", type=cpu_set, default=set(available[:-1] or available),
                   help="CPUs of the server and the offline run, e.g. 0-6 (default: all but the last)")
    p.add_argument("--client-cpus", type=cpu_set, default={available[-1]},
                   help="CPUs of the client (default: the last)")
    args = p.parse_args()
    levels = [int(n) for n in args.clients.split(",")]
    shapes = [int(k) for k in args.texts_per_request.split(",")]
    if min(levels + shapes) < 1:
        p.error("--clients and --texts-per-request take numbers of at least 1")
    if args.server_cpus & args.client_cpus:
        print(f"note: the client shares CPUs {sorted(args.server_cpus & args.client_cpus)} with the server",
              file=sys.stderr)
    path, fmt = DATASETS[args.data]
    texts = [ex.text for ex in read_ner(DATA / path, fmt) if ex.text]
    random.Random(0).shuffle(texts)
    texts = texts[:args.limit]
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8", delete=False) as f:
        json.dump(texts, f, ensure_ascii=False)
    try:
        offline, passes, runtime = offline_rate(args.model, f.name, args.server_cpus, args.batch_size,
                                                args.chunk_lines, args.offline_passes)
    finally:
        os.unlink(f.name)
    print(f"offline (zhie predict): {offline:.2f} sentences/s over {len(texts)} texts on {runtime} (median of "
          f"{passes})", file=sys.stderr)
    os.sched_setaffinity(0, args.client_cpus)
    torch.set_num_threads(len(args.server_cpus))  # what machine() reports: the server's threads (the client has none)
    limits = limit_flags(levels, shapes)
    flags = ["--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms),
             "--batch-size", str(args.server_batch_size), *limits]
    port = free_port()
    server = start_server(args.model, port, args.server_cpus, flags)
    try:
        served = server_runtime(port)
        if served != runtime:
            raise RuntimeError(f"the server runs {args.model} on {served}, the offline run on {runtime}")
        single = request_bodies(texts, 1)
        asyncio.run(load(port, single, 1, 0.0, 2.0, server.pid))  # the model has run before the big body comes
        big = big_body(port, server.pid, args.big_body_mb) if args.big_body_mb else {}
        if big:
            print(f"big body: {big}", file=sys.stderr)
        for per_request in shapes:
            bodies = request_bodies(texts, per_request)
            for clients in levels:
                row = asyncio.run(load(port, bodies, clients, args.warmup, args.seconds, server.pid, per_request))
                append_result("serve", {
                    "clients": clients, "texts_per_request": per_request, **row, **big,
                    "offline_sentences_per_s": round(offline, 2), "offline_passes": passes,
                    "ratio": round(row["sentences_per_s"] / offline, 3),
                    "max_batch": args.max_batch, "max_wait_ms": args.max_wait_ms, "batch_size": args.batch_size,
                    "server_batch_size": args.server_batch_size,
                    "server_flags": limits, "runtime": runtime, "data": args.data, "texts": len(texts),
                    "seconds": args.seconds, "model": Path(args.model).name, "model_path": args.model,
                    "label": args.label or Path(args.model).name,
                    "server_cpus": sorted(args.server_cpus), "client_cpus": sorted(args.client_cpus),
                    "threads": len(args.server_cpus), "machine": machine(), "date": str(date.today())})
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    with machine_lock():
        main()
