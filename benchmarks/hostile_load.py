"""``zhie serve`` under hostile load (issue 51): how much memory clients can make it hold, and whether a keyed client
is still answered meanwhile.

    python benchmarks/hostile_load.py                    # on a tiny NER model it trains first (a few seconds)
    python benchmarks/hostile_load.py --model runs/x/best

It starts ``zhie serve MODEL --api-key-file KEY`` (every limit at its default) and runs three phases of ``--clients``
(64) clients each, in a process of their own (asyncio, raw sockets):

a. keyless: each sends a ``--junk-mb`` (15) MB body to every path (the open ones, the model's, an unknown one), over
   and over, for ``--seconds``;
b. slow: half send a request's headers a byte every ``--trickle-s`` (1) s, half (with the key) a 1 MB body as slowly;
   each reconnects when cut off, for the server's ``--body-timeout`` + 5 s;
c. keyed: each sends ``/predict`` a body of exactly the body limit (one short text, padded with spaces), over and
   over, for ``--seconds``.

Throughout, a probe sends a keyed ``/predict`` of one short text every 0.2 s (answered 200?, latency), a poller reads
``/health`` every 0.2 s (answered?, requests in flight and body bytes held: within the limits, and zero at the end),
and the server's resident memory (children included) is sampled every 20 ms (psutil); its peak (VmHWM, reset per
phase) is read too. Row (``results/hostile_load.jsonl``): peak RSS growth over the idle baseline per phase and overall,
the probe's answered share and p50/p99 ms, the answers by status (``reset``: the server closed the connection first),
the cut-off times of the slow clients, what ``/health`` said (``health_truthful``: within the limits, the slow bodies
seen in flight and held, zero at the end), machine, date, command.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import date
from pathlib import Path

import httpx
import numpy as np
import psutil
from common import append_result, machine, machine_lock

KEY = "hostile-load-key"
TEXT = "王伟在青山市的远华大学工作。"
PATHS = ["/health", "/health/ready", "/", "/page.js", "/page.css", "/docs", "/redoc", "/openapi.json", "/info",
         "/predict", "/embed", "/similarity", "/label-studio/health", "/label-studio/setup", "/label-studio/predict",
         "/nowhere"]


def tiny_model(out: Path) -> str:
    import zhie
    from zhie import demo
    from zhie.data import write_ner_jsonl
    from zhie.training import TrainConfig

    write_ner_jsonl(demo.make_corpus(200, seed=0), out / "train.jsonl")
    zhie.fit("ner", out / "train.jsonl", out / "train.jsonl", out=out / "run", encoder="tiny", head="gp",
             max_length=64, config=TrainConfig(epochs=1, batch_size=16, seed=0, eval_every=10**9), resume=False,
             progress=False)
    return str(out / "run" / "best")


# ------------------------------------------------------------------------------------ the clients (their own process)
async def exchange(port: int, head: bytes, body: bytes = b"", trickle: float = 0.0) -> tuple[str, float]:
    """Send ``head``, then ``body`` (a byte every ``trickle`` s, or in 1 MB writes) while reading the answer: its
    status (``closed`` or ``reset`` when the server cut the connection unanswered) and the seconds it took."""
    start = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return "refused", 0.0

    async def pump() -> None:
        try:
            writer.write(head)
            view, step = memoryview(body), 1 if trickle else 1 << 20
            for i in range(0, len(view), step):
                writer.write(view[i:i + step])
                await (asyncio.sleep(trickle) if trickle else writer.drain())
        except OSError:  # the server closed first
            pass

    pumping = asyncio.create_task(pump())
    try:
        line = (await reader.readuntil(b"\r\n\r\n")).split(b" ", 2)
        status = line[1].decode() if line[0].startswith(b"HTTP/") else "garbled"
    except asyncio.IncompleteReadError:
        status = "closed"
    except OSError:
        status = "reset"
    finally:
        pumping.cancel()
        writer.close()
    return status, round(time.monotonic() - start, 2)


def run_phase(phase: str, port: int, clients: int, seconds: float, junk_mb: int, trickle: float,
              body_limit: int) -> dict:
    async def main() -> dict:
        end, answers, cut = time.monotonic() + seconds, Counter(), {"head": [], "body": []}
        junk = b"x" * (junk_mb << 20)
        padded = b'{"texts": ["' + TEXT.encode() + b'"]'
        padded += b" " * (body_limit - len(padded) - 1) + b"}"
        keyed = f"Authorization: Bearer {KEY}\r\n".encode()
        post = b"POST %s HTTP/1.1\r\nHost: h\r\n%sContent-Length: %d\r\n\r\n"
        jobs = {"keyless": [(post % (p.encode(), b"", len(junk)), junk, 0.0, None) for p in PATHS],
                "head": [(b"", b"GET /health HTTP/1.1\r\nHost: h\r\nX-Slow: " + b"a" * 1000, trickle, "head")],
                "body": [(post % (b"/predict", keyed, 1 << 20), b"a" * (1 << 20), trickle, "body")],
                "keyed": [(post % (b"/predict", keyed + b"Content-Type: application/json\r\n", len(padded)), padded,
                           0.0, None)]}

        async def client(i: int) -> None:
            while True:  # at least once
                for head, body, slow, kind in jobs[("head" if i % 2 else "body") if phase == "slow" else phase]:
                    try:
                        status, took = await asyncio.wait_for(exchange(port, head, body, slow),
                                                              max(end - time.monotonic(), 0.5))
                    except TimeoutError:
                        status, took = "phase ended", None
                    answers[status] += 1
                    if kind and took is not None:
                        cut[kind].append(took)
                if time.monotonic() >= end:
                    return

        await asyncio.gather(*(client(i) for i in range(clients)))
        return {"answers": dict(answers), "cut_off_s": {k: [min(v), max(v)] for k, v in cut.items() if v}}

    return asyncio.run(main())


# ------------------------------------------------------------------------------------ the watchers (threads here)
def watch(port: int, pid: int, stop: threading.Event, log: dict) -> list[threading.Thread]:
    def rss() -> None:
        server = psutil.Process(pid)
        while not stop.is_set():
            try:
                total = sum(p.memory_info().rss for p in [server, *server.children(recursive=True)])
            except psutil.Error:
                break
            log["rss"].append((time.monotonic(), total / 1e6))
            time.sleep(0.02)

    def every(seconds: float, fn, key: str) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    log[key].append((t0, *fn(client), time.monotonic() - t0))
                except httpx.HTTPError as err:
                    log[key].append((t0, type(err).__name__, None, time.monotonic() - t0))
                stop.wait(max(0.0, t0 + seconds - time.monotonic()))

    probe = lambda c: (c.post("/predict", json={"texts": [TEXT]}, headers={"Authorization": f"Bearer {KEY}"})  # noqa: E731
                       .status_code, None)
    health = lambda c: (lambda r: (r.status_code, r.json()))(c.get("/health"))  # noqa: E731
    threads = [threading.Thread(target=rss), threading.Thread(target=every, args=(0.2, probe, "probe")),
               threading.Thread(target=every, args=(0.2, health, "health"))]
    for t in threads:
        t.start()
    return threads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model or export directory (default: a tiny NER model trained here)")
    p.add_argument("--clients", type=int, default=64, help="clients per phase")
    p.add_argument("--seconds", type=float, default=10.0, help="length of the keyless and keyed phases")
    p.add_argument("--junk-mb", type=int, default=15, help="the keyless clients' bodies")
    p.add_argument("--trickle-s", type=float, default=1.0, help="seconds between the slow clients' bytes")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zhie-hostile-"))
    model = args.model or tiny_model(work)
    (work / "key").write_text(KEY + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-c", "from zhie.cli import main; raise SystemExit(main())", "serve", model,
               "--port", str(port), "--api-key-file", str(work / "key")]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=(work / "server.log").open("w"))
    log, stop = {"rss": [], "probe": [], "health": []}, threading.Event()
    try:
        for _ in range(600):
            try:
                info = httpx.get(f"http://127.0.0.1:{port}/info", headers={"Authorization": f"Bearer {KEY}"}).json()
                break
            except httpx.HTTPError:
                if server.poll() is not None:
                    raise SystemExit(f"zhie serve exited: {(work / 'server.log').read_text()[-2000:]}") from None
                time.sleep(0.2)
        else:
            raise SystemExit("zhie serve did not answer within 120 s")
        limits = info["limits"]
        for _ in range(5):  # the model has run before the baseline
            httpx.post(f"http://127.0.0.1:{port}/predict", json={"texts": [TEXT]},
                       headers={"Authorization": f"Bearer {KEY}"})
        threads = watch(port, server.pid, stop, log)
        time.sleep(2)
        baseline = float(np.median([r for _, r in log["rss"]]))
        hwm = Path(f"/proc/{server.pid}/status")
        phases, windows = {}, {}
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            pool.apply(int)  # the clients' process has started before the first phase
            for phase, seconds in [("keyless", args.seconds), ("slow", limits["body_timeout"] + 5),
                                   ("keyed", args.seconds)]:
                Path(f"/proc/{server.pid}/clear_refs").write_text("5")  # VmHWM starts again from the RSS now
                t0 = time.monotonic()
                phases[phase] = pool.apply(run_phase, (phase, port, args.clients, seconds, args.junk_mb,
                                                       args.trickle_s, limits["max_body_bytes"]))
                windows[phase] = (t0, time.monotonic())
                peak_kb = int(next(x for x in hwm.read_text().splitlines() if x.startswith("VmHWM:")).split()[1])
                phases[phase]["peak_hwm_growth_mb"] = round(peak_kb * 1.024e-3 - baseline, 1)
                time.sleep(2)
        time.sleep(1)
        stop.set()
        for t in threads:
            t.join()
        end = httpx.get(f"http://127.0.0.1:{port}/health").json()
    finally:
        server.terminate()
        server.wait(30)
    shutil.rmtree(work, ignore_errors=True)
    for phase, (t0, t1) in windows.items():
        seen = {key: [r for r in rows if t0 <= r[0] <= t1] for key, rows in log.items()}
        probes = seen["probe"]
        ms = np.array([r[3] * 1000 for r in probes if r[1] == 200] or [np.nan])
        polls = seen["health"]
        said = [r[2] for r in polls if r[1] == 200]
        phases[phase].update(
            peak_rss_growth_mb=round(max(r for _, r in seen["rss"]) - baseline, 1),
            probe_answered=f"{sum(r[1] == 200 for r in probes)}/{len(probes)}",
            probe_statuses=dict(Counter(str(r[1]) for r in probes)),
            probe_p50_ms=round(float(np.percentile(ms, 50)), 1), probe_p99_ms=round(float(np.percentile(ms, 99)), 1),
            health_answered=f"{len(said)}/{len(polls)}",
            health_max_in_flight=max((h["requests_in_flight"] for h in said), default=None),
            health_max_held_mb=round(max((h["body_bytes_held"] for h in said), default=0) / 1e6, 1),
            health_within_limits=all(0 <= h["body_bytes_held"] <= limits["max_buffered_mb"] * 1e6 and
                                     0 <= h["requests_in_flight"] <= limits["max_in_flight"] for h in said))
    probes, slow_bodies = log["probe"], args.clients // 2  # the slow bodies are in flight, 1 MB each, for 30 s
    truthful = (all(r["health_within_limits"] for r in phases.values()) and end["requests_in_flight"] == 0 and
                end["body_bytes_held"] == 0 and phases["slow"]["health_max_in_flight"] >= slow_bodies and
                phases["slow"]["health_max_held_mb"] >= round(slow_bodies * 2**20 / 1e6, 1))
    row = {"phases": phases, "baseline_rss_mb": round(baseline, 1), "health_truthful": truthful,
           "peak_rss_growth_mb": round(max(r for _, r in log["rss"]) - baseline, 1),
           "probe_answered_share": round(sum(r[1] == 200 for r in probes) / len(probes), 4),
           "end_in_flight": end["requests_in_flight"], "end_body_bytes_held": end["body_bytes_held"],
           "clients": args.clients, "junk_mb": args.junk_mb, "trickle_s": args.trickle_s, "limits": limits,
           "model": Path(model).name if args.model else "tiny (trained here)", "machine": machine(),
           "date": str(date.today()), "command": "python " + " ".join(sys.argv)}
    for phase, r in phases.items():
        print(f"{phase:8s} peak RSS +{r['peak_rss_growth_mb']} MB (VmHWM +{r['peak_hwm_growth_mb']}), probe "
              f"{r['probe_answered']} answered 200, p50 {r['probe_p50_ms']} ms, p99 {r['probe_p99_ms']} ms; "
              f"answers {r['answers']}; cut off after {r['cut_off_s']} s; /health {r['health_answered']} answered, "
              f"max in flight {r['health_max_in_flight']}, max held {r['health_max_held_mb']} MB", file=sys.stderr)
    print(f"overall: peak RSS growth {row['peak_rss_growth_mb']} MB over {row['baseline_rss_mb']} MB; probe answered "
          f"{row['probe_answered_share']:.1%}; at the end {end['requests_in_flight']} in flight, "
          f"{end['body_bytes_held']} bytes held; /health truthful: {truthful}", file=sys.stderr)
    append_result("hostile_load", row)


if __name__ == "__main__":
    with machine_lock():
        main()
