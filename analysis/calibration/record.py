"""Record the calibration GPT's training step with ``torch.profiler`` and time the real job.

Each rank trains ``warmup`` steps, then alternates an untraced and a traced step ``pairs``
times (CPU activity with ``record_shapes``; CUDA activity too on GPUs): the untraced steps are
the measurement a simulated trace is judged against, the traced steps' own wall time says what
the profiler added, and interleaving them lets a busy spell of a shared host hit both alike.
Rank files carry their provenance (device, framework, host, date) as trace metadata; each is
trimmed to one traced step, the one whose slowest rank took the median time, so it stays small.
"""

from __future__ import annotations

import datetime
import json
import platform
import socket
import statistics
import time
import warnings
from pathlib import Path

from clustersim.workloads import Job

from clustersim.analysis.calibration.hostload import host_busy_s
from clustersim.analysis.calibration.launch import RankEnv, synchronize

STEP_MARK = "clustersim.step"
"""User annotation around each traced step (what the trimmer keeps)."""
UNREAD_ARGS = ("Input Strides", "Ev Idx", "Record function id", "Sequence number",
               "Fwd thread id")
"""Event arguments the importer does not read, dropped to keep committed traces small."""


def _timed_step(runner, env: RankEnv) -> float:
    import torch.distributed as dist
    synchronize(env)
    dist.barrier()
    start = time.perf_counter()
    runner.step()
    synchronize(env)
    return time.perf_counter() - start


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def record_rank(env: RankEnv, job: Job, out: str, warmup: int, pairs: int) -> dict:
    """One rank: warm up, then ``pairs`` times an untimed-by-the-profiler step followed by a
    traced one (interleaved, so a busy spell of the host hits both alike); writes
    ``out/rank<r>.json``, the traced step whose slowest rank took the median time."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule
    from clustersim.analysis.calibration.train import _Runner
    runner = _Runner(env, job, 0)
    for _ in range(warmup):
        _timed_step(runner, env)
    files: list[Path] = []

    def ready(prof) -> None:
        files.append(Path(out) / f"rank{env.rank}.traced{len(files)}.json")
        prof.export_chrome_trace(str(files[-1]))

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if env.device == "cuda" else [])
    untraced, traced = [], []
    host0, wall0 = host_busy_s(), time.perf_counter()
    with warnings.catch_warnings():
        # "won't be using warmup" and "clears events at the end of each cycle": both intended.
        warnings.simplefilter("ignore", UserWarning)
        prof = profile(activities=activities, record_shapes=True, on_trace_ready=ready,
                       schedule=schedule(wait=1, warmup=0, active=1, repeat=pairs))
    with prof, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for i in range(2 * pairs):
            with record_function(STEP_MARK):
                (traced if i % 2 else untraced).append(_timed_step(runner, env))
            prof.step()
    host1, wall1 = host_busy_s(), time.perf_counter()
    slowest = torch.tensor(traced, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    order = sorted(range(pairs), key=lambda i: float(slowest[i]))
    keep = order[len(order) // 2]
    device = (torch.cuda.get_device_name(env.torch_device()) if env.device == "cuda"
              else _cpu_name())
    facts = {"framework": f"torch {torch.__version__}", "device": device,
             "host": socket.gethostname(), "recorded_at": _now()}
    path = Path(out) / f"rank{env.rank}.json"
    trim_to_step(files[keep], path, facts)
    for f in files:
        f.unlink()
    busy = None if host0 is None or host1 is None else (host1 - host0) / (wall1 - wall0)
    return {"rank": env.rank, "untraced_s": untraced, "traced_s": traced,
            "kept": keep, "host_busy_cores": busy}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def trim_to_step(source: Path, path: Path, facts: dict) -> None:
    """Keep the metadata and the events that start inside the traced step (gloo's worker
    threads included), add the recording's provenance; drop flow arrows and arguments the
    importer does not read."""
    data = json.loads(source.read_text())
    data.update(facts)
    events = data["traceEvents"]
    marks = [e for e in events if e.get("name") == STEP_MARK and e.get("ph") == "X"]
    if not marks:
        raise RuntimeError(f"{source}: no {STEP_MARK} annotation (the profiler missed the step)")
    last = max(marks, key=lambda e: e["ts"])
    lo, hi = float(last["ts"]), float(last["ts"]) + float(last["dur"])
    keep = []
    for e in events:
        if e.get("ph") == "M":
            keep.append(e)
        elif e.get("ph") == "X" and lo <= float(e["ts"]) and float(e["ts"]) < hi:
            args = e.get("args")
            if isinstance(args, dict):
                e["args"] = {k: v for k, v in args.items() if k not in UNREAD_ARGS}
            keep.append(e)
    data["traceEvents"] = keep
    path.write_text(json.dumps(data, separators=(",", ":")))


def record(job: Job, out: Path, *, warmup: int = 3, pairs: int = 5, device: str = "cpu",
           threads: int = 1) -> dict:
    """Record ``job`` on its world of spawned ranks; returns (and writes ``out/measured.json``)
    the measured step times."""
    from clustersim.analysis.calibration.launch import run_ranks
    from clustersim.analysis.calibration.train import check_runnable
    check_runnable(job)
    out.mkdir(parents=True, exist_ok=True)
    ranks = run_ranks(record_rank, job.strategy.world_size,
                      (job, str(out), warmup, pairs), device=device, threads=threads)
    untraced = [max(r["untraced_s"][i] for r in ranks) for i in range(pairs)]
    traced_s = [max(r["traced_s"][i] for r in ranks) for i in range(pairs)]
    import torch
    result = {
        "measured_step_time_s": statistics.median(untraced),
        "untraced_steps_s": untraced, "traced_steps_s": traced_s,
        "host_busy_cores": ranks[0]["host_busy_cores"],
        "strategy": job.strategy.to_dict(), "training": job.training.to_dict(),
        "model": job.model.name, "world_size": job.strategy.world_size,
        "traced_step_kept": ranks[0]["kept"],
        "provenance": {"date": _now(), "host": socket.gethostname(),
                       "device": _cpu_name() if device == "cpu" else device,
                       "framework": f"torch {torch.__version__}", "threads_per_rank": threads,
                       "os": f"{platform.system()} {platform.release()}"},
    }
    (out / "measured.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
