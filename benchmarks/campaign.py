"""The benchmark campaign: long runs from a plan, one at a time, resumable across sessions.

Over 400 lines: one concern, the campaign (its plan, runner, status and import of GPU rows), whose parts share
the plan's rules.

    python benchmarks/campaign.py status              # done / running / failed / left, with CPU-time estimates
    nohup python benchmarks/campaign.py run >> ../campaign/runner.log 2>&1 &   # every missing row, in plan order
    python benchmarks/campaign.py run --only a/gp-start/ --max-rows 2

The plan (``benchmarks/campaign.toml``, committed) names a commit and lists rows, each a stable ``key``, a
``command``, an ``estimate_cpu_min`` and, when it needs a newer benchmark than the plan's commit has, a ``commit``
of its own. ``run`` executes the rows whose key has no line in ``benchmarks/results/campaign.jsonl`` yet:

- from a git worktree of the row's commit outside the repository (``<dir>/worktrees/<commit>``), with that
  worktree's ``src`` first on ``PYTHONPATH``: what changes on main meanwhile neither breaks a resumed row nor mixes
  two versions in one table. Moving rows to a newer commit is a deliberate edit of the plan;
- one at a time under ``nice``, holding the machine lock (:func:`common.machine_lock`): a second runner, or any
  benchmark script started by hand, waits for the row to end instead of sharing the cores;
- in a run directory of its own (``<dir>/runs/<key>``) that outlives the runner: the benchmarks train with
  ``resume=True``, so a row stopped by the end of a session continues from its ``checkpoint.pt`` (zhie's exact
  resume) the next time ``run`` reaches it, on the same machine;
- a row's benchmark writes its JSON lines to ``ZHIE_RESULTS`` (the run directory); when the command exits 0 the
  runner appends one line to ``campaign.jsonl``: the key, the row's commit, the seed, the command, the CPU and
  wall seconds over every session, the load average, and the benchmark's own lines (every option it records).
  A failed row is logged in ``<dir>/failed.jsonl`` with its stderr tail and retried by the next ``run``.

A GPU machine can run the plan's rows of ``GPU_SCRIPTS`` many at a time: ``device_pack.py --campaign``
packs the rows left with their commit's code, ``benchmarks/gpu_campaign.py`` runs them there, and ``import`` checks
what came back against the plan (the same key, commit and command) and appends it like the runner's lines, with
the device named and no CPU seconds.

    python benchmarks/device_pack.py --campaign c/                         # here
    python3 benchmarks/gpu_campaign.py --parallel 16 --seconds 540       # there, with .gpu-pack copied beside the code
    python benchmarks/campaign.py import DIR/gpu_rows.jsonl    # here, with what came back

``<dir>`` is ``ZHIE_CAMPAIGN_DIR`` or ``../campaign`` beside the repository. Placeholders in a command:
``{python}`` (this interpreter), ``{run_dir}``, ``{runs}`` (every row's run directory: a row may reuse another's
models), ``{data}`` (the datasets). Timings of campaign rows are not performance figures: the rows run niced beside
the session's other work.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path

from common import CAMPAIGN_DIR, DATA, ROOT, machine_lock, portable_paths
from gpu_campaign import ENCODER_SCRIPTS

PLAN = ROOT / "benchmarks" / "campaign.toml"
RESULTS = ROOT / "benchmarks" / "results" / "campaign.jsonl"
DIR = CAMPAIGN_DIR
KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


class PlanError(Exception):
    pass


def read_plan(path: Path) -> tuple[str, list[dict]]:
    """The plan's commit and rows, checked: unique keys, a command and an estimate each."""
    try:
        plan = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise PlanError(f"{path}: {e}") from None
    commit, rows = plan.get("commit"), plan.get("row", [])
    if not _is_commit(commit):
        raise PlanError(f"{path}: `commit` must be a git commit hash, got {commit!r}")
    seen = set()
    for i, row in enumerate(rows):
        where = f"{path}: row {i + 1}"
        if not _is_commit(row.setdefault("commit", commit)):
            raise PlanError(f"{where}: `commit` must be a git commit hash, got {row['commit']!r}")
        if not isinstance(row.get("key"), str) or not KEY.match(row["key"]) or ".." in row["key"]:
            raise PlanError(f"{where}: `key` must be letters, digits and . _ / - (got {row.get('key')!r})")
        if row["key"] in seen:
            raise PlanError(f"{where}: key {row['key']!r} appears twice")
        seen.add(row["key"])
        if not isinstance(row.get("command"), str) or not row["command"].strip():
            raise PlanError(f"{where} ({row['key']}): `command` is missing")
        if not isinstance(row.get("estimate_cpu_min", 0), (int, float)):
            raise PlanError(f"{where} ({row['key']}): `estimate_cpu_min` must be a number")
    return commit, rows


def _is_commit(value) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{7,40}", value) is not None


def read_results(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {line["key"]: line for line in lines}


def run_dir(directory: Path, key: str) -> Path:
    return directory / "runs" / key.replace("/", "__")


def worktree(repo: Path, commit: str, directory: Path) -> Path:
    """A detached worktree of ``commit`` under ``directory`` (made once, reused by every row of the plan)."""
    path = directory / "worktrees" / commit
    if not (path / ".git").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], check=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(path), commit], check=True,
                       stdout=subprocess.DEVNULL)
    return path


def seed_of(command: str) -> int | None:
    """The seed a row's ``command`` runs with: the first number of its first ``--seed``/``--seeds``, among the words
    its process is given (a quoted argument is one word: a students row's ``--train-teacher '... --seed 1'`` is its
    teacher's command, not the row's)."""
    words = shlex.split(command)
    for i, word in enumerate(words):
        flag, equals, value = word.partition("=")
        if flag in ("--seed", "--seeds"):
            if not equals:
                value = words[i + 1] if i + 1 < len(words) else ""
            match = re.match(r"\d+", value)
            return int(match.group()) if match else None
    return None


def run_row(row: dict, commit: str, tree: Path, directory: Path, results: Path) -> bool:
    """Run one row to its end (or resume it); True when it finished and its line was appended."""
    out = run_dir(directory, row["key"])
    (out / "results").mkdir(parents=True, exist_ok=True)
    for old in (out / "results").glob("*.jsonl"):  # what an interrupted session's command had written
        old.unlink()
    command = row["command"].format(python=sys.executable, run_dir=out, runs=directory / "runs", data=DATA)
    env = {**os.environ, "ZHIE_RESULTS": str(out / "results"), "ZHIE_DATA": str(DATA),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tree / "src"), os.environ.get("PYTHONPATH")]))}
    sessions_path = out / "sessions.json"
    sessions = json.loads(sessions_path.read_text()) if sessions_path.exists() else []
    session = {"started": _now(), "load_start": os.getloadavg()[0]}
    sessions.append(session)
    sessions_path.write_text(json.dumps(sessions, indent=1))  # a runner killed outright leaves this much
    print(f"[campaign] {row['key']}: {command}" + (f" (session {len(sessions)})" if len(sessions) > 1 else ""),
          flush=True)
    before = os.times()
    start = time.time()
    proc = subprocess.Popen(["nice", "-n", "10", *shlex.split(command)], cwd=tree, env=env,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
    stopped = []

    def stop(signum, frame):  # the session ends: stop the row, which resumes from its checkpoint next time
        stopped.append(signum)
        proc.send_signal(signal.SIGTERM)

    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        stderr_tail = _tail(proc.stderr)
        code = proc.wait()
    finally:
        for s, handler in old_handlers.items():
            signal.signal(s, handler)
        after = os.times()
        session.update(wall_s=round(time.time() - start, 1), load_end=os.getloadavg()[0],
                       cpu_s=round(after.children_user + after.children_system
                                   - before.children_user - before.children_system, 1))
        sessions_path.write_text(json.dumps(sessions, indent=1))
    if stopped:
        print(f"[campaign] {row['key']}: stopped; `run` resumes it", flush=True)
        raise KeyboardInterrupt
    if code != 0:
        with (directory / "failed.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps({"key": row["key"], "commit": commit, "exit": code, "finished": _now(),
                                "stderr_tail": stderr_tail}, ensure_ascii=False) + "\n")
        print(f"[campaign] {row['key']}: exit {code}\n{stderr_tail}", flush=True)
        return False
    lines = [json.loads(portable_paths(line, directory / "runs", tree, beside=False))
             for path in sorted((out / "results").glob("*.jsonl"))
             for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    record = {"key": row["key"], "commit": commit, "seed": seed_of(command), "command": row["command"],
              "cpu_s": round(sum(s.get("cpu_s", 0) for s in sessions), 1),
              "cpu_s_complete": all("cpu_s" in s for s in sessions),  # False: a session's runner was killed
              "wall_s": round(sum(s.get("wall_s", 0) for s in sessions), 1), "sessions": len(sessions),
              "load_avg": [round(s["load_start"], 2) for s in sessions], "finished": _now(), "results": lines}
    if row["key"] in read_results(results):  # imported from a GPU machine while it ran here: keep the first line
        print(f"[campaign] {row['key']}: already in {results.name} (imported meanwhile); this run's line dropped",
              flush=True)
        return True
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
    for checkpoint in out.rglob("checkpoint.pt"):  # the row is done: its resumable state is only disk now
        checkpoint.unlink()
    print(f"[campaign] {row['key']}: done in {record['cpu_s'] / 60:.0f} CPU min", flush=True)
    return True


def run(plan_path: Path, results: Path, directory: Path, repo: Path, only: str | None, max_rows: int | None) -> int:
    done = 0
    failed: set[str] = set()
    while max_rows is None or done < max_rows:
        with machine_lock(directory):  # taken per row: a benchmark started by hand gets its turn between rows
            _, rows = read_plan(plan_path)  # read again for every row: rows added meanwhile are run too
            finished = read_results(results)
            todo = [r for r in rows if r["key"] not in finished and r["key"] not in failed
                    and (only is None or r["key"].startswith(only))]
            if not todo:
                break
            row = todo[0]
            tree = worktree(repo, row["commit"], directory)
            (directory / "running.json").write_text(json.dumps({"key": row["key"], "pid": os.getpid(),
                                                                 "since": _now()}))
            try:
                ok = run_row(row, row["commit"], tree, directory, results)
            finally:
                (directory / "running.json").unlink(missing_ok=True)
        done += ok
        if not ok:
            failed.add(row["key"])
    return 1 if failed else 0


# The scripts outside ENCODER_SCRIPTS find the pruned e5-small as zhie's e5-small, in ZHIE_CACHE.
GPU_SCRIPTS = (*ENCODER_SCRIPTS, "benchmarks/students.py", "benchmarks/active_learning.py", "benchmarks/forgetting.py")


def device_command(command: str) -> str | None:
    """A row's command as ``gpu_campaign.py`` runs it: without ``{python}`` (python3 there), ``--save-every`` (no
    checkpoints there: a dozen rows writing one every few seconds would cost more than resuming saves) and
    ``--encoder`` (it adds e5-small's pruned copy to ``ENCODER_SCRIPTS``), placeholders kept; None for a script not
    in ``GPU_SCRIPTS``."""
    words = shlex.split(command)
    if len(words) < 2 or words[0] != "{python}" or words[1] not in GPU_SCRIPTS:
        return None
    kept, rest = [], words[1:]
    while rest:
        word = rest.pop(0)
        if word in ("--save-every", "--encoder"):
            del rest[:1]
        else:
            kept.append(word)
    return shlex.join(kept)


def gpu_rows(plan_path: Path, results: Path, only: str | tuple[str, ...] | None) -> list[tuple[str, str, str]]:
    """The plan's rows left that a GPU machine can run: (key, commit, device command) each (gpu_campaign.py's input)."""
    _, rows = read_plan(plan_path)
    finished = read_results(results)
    return [(r["key"], r["commit"], command) for r in rows
            if r["key"] not in finished and (only is None or r["key"].startswith(only))
            and (command := device_command(r["command"])) is not None]


def import_rows(plan_path: Path, results: Path, path: Path) -> int:
    """Append the rows that ``gpu_campaign.py`` ran (its ``gpu_rows.jsonl``) to the campaign's lines: each must be a
    row of the plan that has no line yet and have run the plan's command (as :func:`device_command` gives it, at the
    row's commit); returns how many were appended."""
    plan = {r["key"]: r for r in read_plan(plan_path)[1]}
    finished = read_results(results)
    records = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        ran = json.loads(line)
        where = f"{path}: line {i + 1} ({ran.get('key')})"
        missing = {"key", "commit", "rc", "wall_s", "command", "results"} - set(ran)
        if missing:
            raise PlanError(f"{where}: no {', '.join(sorted(missing))}; is this gpu_campaign.py's gpu_rows.jsonl?")
        row = plan.get(ran["key"])
        if row is None:
            raise PlanError(f"{where}: no row of the plan has this key; add it to the plan first")
        if ran["key"] in finished:
            print(f"{where}: already in {results.name}, skipped", file=sys.stderr)
            continue
        if ran["rc"] != 0 or not ran["results"]:
            print(f"{where}: exit {ran['rc']}, skipped", file=sys.stderr)
            continue
        if ran["command"] != device_command(row["command"]) or ran["commit"] != row["commit"]:
            raise PlanError(f"{where}: ran `{ran['command']}` at {ran['commit'][:10]}, the plan says "
                            f"`{row['command']}` at {row['commit'][:10]}")
        if ran.get("runs"):  # the GPU machine's directories, named as on this one
            text = json.dumps(ran["results"]).replace(f"{ran['runs']}/e5-small-pruned", ".gpu-pack/e5-small-pruned")
            ran["results"] = json.loads(portable_paths(text, ran["runs"], tree=None))
        records.append({"key": ran["key"], "commit": row["commit"], "seed": seed_of(row["command"]),
                        "command": row["command"], "device": ran["results"][-1]["machine"],
                        "device_command": ran["results"][-1]["command"], "parallel": ran.get("parallel"),
                        "cpu_s": None, "cpu_s_complete": False, "wall_s": ran["wall_s"], "sessions": 1,
                        "load_avg": [], "finished": ran.get("finished") or _now(), "results": ran["results"]})
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return len(records)


def status(plan_path: Path, results: Path, directory: Path) -> str:
    commit, rows = read_plan(plan_path)
    finished = read_results(results)
    running = {}
    if (directory / "running.json").exists():
        running = json.loads((directory / "running.json").read_text())
        if not _alive(running.get("pid")):
            running = {}
    failures = {}
    if (directory / "failed.jsonl").exists():
        for line in (directory / "failed.jsonl").read_text(encoding="utf-8").splitlines():
            failures[json.loads(line)["key"]] = json.loads(line)
    lines, left_min, done_min, estimate_done = [], 0.0, 0.0, 0.0
    for row in rows:
        key, estimate = row["key"], float(row.get("estimate_cpu_min", 0))
        if key in finished and finished[key].get("device"):
            lines.append(f"  done     {key}  ({finished[key]['wall_s'] / 60:.0f} min on {finished[key]['device']}, "
                         f"commit {finished[key]['commit'][:10]})")
            continue
        if key in finished:
            cpu_min = finished[key]["cpu_s"] / 60
            done_min += cpu_min
            estimate_done += estimate
            lines.append(f"  done     {key}  ({cpu_min:.0f} CPU min, commit {finished[key]['commit'][:10]})")
            continue
        left_min += estimate
        state = "running " if running.get("key") == key else "failed  " if key in failures else "left    "
        note = f"~{estimate:.0f} CPU min"
        progress = _progress(run_dir(directory, key))
        if progress:
            note += f"; {progress}"
        if key in failures:
            note += f"; exit {failures[key]['exit']} at {failures[key]['finished']}"
        lines.append(f"  {state} {key}  ({note})")
    n_done = sum(r["key"] in finished for r in rows)
    head = (f"campaign {plan_path.name} at commit {commit[:10]}: {n_done} done, {len(rows) - n_done} left "
            f"(~{left_min / 60:.1f} CPU h by the plan's estimates")
    if estimate_done:
        head += f"; the done rows took {done_min / estimate_done:.2f}x their estimates"
    head += f"); running: {running.get('key', 'nothing')}"
    return "\n".join([head, *lines])


def _progress(out: Path) -> str:
    """How far an unfinished row's training got: its last record (a step record or an evaluation's) and its sessions
    so far."""
    parts = []
    metrics = sorted(out.rglob("metrics.jsonl"))
    if metrics:
        last = metrics[-1].read_text(encoding="utf-8").strip().splitlines()
        if last:
            record = json.loads(last[-1])
            parts.append(f"epoch {record.get('epoch')}, step {record.get('step')}")
    sessions = out / "sessions.json"
    if sessions.exists():
        n = len(json.loads(sessions.read_text()))
        parts.append(f"{n} session{'s' if n > 1 else ''} so far")
    return ", ".join(parts)


def _die_with_parent() -> None:
    """In the row's process, before it starts: end it when the runner dies, even by SIGKILL (Linux), so that no
    orphaned row trains on beside the next runner's."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, TypeError, ValueError):
        return False


def _tail(stream, n: int = 40) -> str:
    """Copy a child's stderr through to ours as it comes, keeping its last ``n`` lines."""
    last: list[str] = []
    for line in stream:
        sys.stderr.write(line)
        last = (last + [line])[-n:]
    return "".join(last)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["run", "status", "import"])
    p.add_argument("file", nargs="?", type=Path, help="import: the gpu_rows.jsonl that gpu_campaign.py wrote")
    p.add_argument("--plan", type=Path, default=PLAN)
    p.add_argument("--results", type=Path, default=RESULTS, help="the campaign's JSON lines (default: %(default)s)")
    p.add_argument("--dir", type=Path, default=DIR, help="run directories, worktrees, lock (default: %(default)s)")
    p.add_argument("--repo", type=Path, default=ROOT, help="the git repository the plan's commit is in")
    p.add_argument("--only", help="run only the rows whose key starts with this")
    p.add_argument("--max-rows", type=int, help="stop after this many finished rows")
    args = p.parse_args(argv)
    try:
        if args.action == "status":
            print(status(args.plan, args.results, args.dir))
            return 0
        if args.action == "import":
            if args.file is None:
                p.error("import needs the gpu_rows.jsonl file")
            print(f"{import_rows(args.plan, args.results, args.file)} rows appended to {args.results}")
            return 0
        return run(args.plan, args.results, args.dir, args.repo, args.only, args.max_rows)
    except KeyboardInterrupt:
        return 130
    except (PlanError, OSError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
