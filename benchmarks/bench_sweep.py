"""Sweep throughput: configurations per second, serial against local worker processes.

Two numbers side by side:
- enumeration and pruning (strategy rules and the memory model, no simulation) of the
  Llama-3-70B example's default space;
- simulated points per second of a Llama-3-8B sweep on 8 H100 SXM (examples/llama3_8b_fsdp.yaml,
  a fixed 24-point space) with 1 worker and with 2 workers, and their ratio.

With ``--gpt3 [WORKERS]`` (minutes): the default sweep of examples/gpt3_175b_a100.yaml (GPT-3
175B on 1,024 A100) with WORKERS workers (default 2), in the order ``run_sweep`` uses: its wall
time, each point's CPU and wall seconds, the serial total, and the time the same points would
take on that many workers longest first and cheapest first (list scheduling of the measured
CPU times: on a shared machine the wall time also counts other people's work). With ``--sample
K``, every K-th of those points only (a spread of sizes in minutes; the totals are the sample's).

    python benchmarks/bench_sweep.py
    python benchmarks/bench_sweep.py --gpt3 2
    python benchmarks/bench_sweep.py --gpt3 2 --sample 8
"""

from __future__ import annotations

import heapq
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml

from clustersim.analysis.step import simulation_options
from clustersim.analysis.sweeps.executors import run_tasks
from clustersim.analysis.sweeps.space import Status, enumerate_space, space_from_mapping
from clustersim.analysis.sweeps.runner import (
    evaluate, from_mapping, load_for_sweep, run_sweep, work_order,
)

REPO = Path(__file__).resolve().parents[1]
SPACE = {"tp": [1, 2, 4, 8], "pp": [1, 2], "cp": [1], "micro_batch": [1, 2],
         "schedule": ["1f1b"], "recompute": ["selective"], "zero": [1, 3], "offload": ["none"]}


def enumeration_rate() -> tuple[int, int, float]:
    loaded = load_for_sweep(REPO / "examples/llama3_70b_h100.yaml")
    cfg = loaded.config
    start = time.perf_counter()
    cands = enumerate_space(cfg.job, cfg.cluster.num_devices, cfg.cluster.device.memory_bytes,
                            space_from_mapping(None))
    wall = time.perf_counter() - start
    return len(cands), sum(c.status is Status.SIMULATE for c in cands), len(cands) / wall


def sweep_rate(workers: int) -> tuple[int, float]:
    raw = yaml.safe_load((REPO / "examples/llama3_8b_fsdp.yaml").read_text())
    loaded = from_mapping({**raw, "sweep": SPACE})
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        outcome = run_sweep(loaded, out, workers=workers, progress=False)
        wall = time.perf_counter() - start
    return outcome.simulated, outcome.simulated / wall


def timed_evaluate(task) -> tuple[str, dict, float, float]:
    """``evaluate`` in a worker, with its CPU and wall seconds."""
    cpu, wall = time.process_time(), time.perf_counter()
    key, metrics = evaluate(task)
    return key, metrics, time.process_time() - cpu, time.perf_counter() - wall


def makespan(costs: list[float], workers: int) -> float:
    """When the last of ``costs`` ends, each handed in order to the first free worker."""
    free = [0.0] * workers
    for cost in costs:
        heapq.heappush(free, heapq.heappop(free) + cost)
    return max(free)


def gpt3_sweep(workers: int, sample: int = 1) -> None:
    loaded = load_for_sweep(REPO / "examples/gpt3_175b_a100.yaml")
    cfg = loaded.config
    candidates = enumerate_space(cfg.job, cfg.cluster.num_devices, cfg.cluster.device.memory_bytes,
                                 space_from_mapping(cfg.sections.get("sweep")))
    todo = work_order([c for c in candidates if c.status is Status.SIMULATE], workers > 1)
    todo = todo[::sample]
    options = replace(simulation_options(cfg), record=False)
    by_key = {c.key: c for c in todo}
    tasks = [(c.key, c.job, cfg.cluster, options) for c in todo]
    print(f"gpt3-175b on 1,024 a100: {len(candidates):,} strategies, {len(todo)} to simulate"
          f"{f' (every {sample}th)' if sample > 1 else ''}, {workers} workers")
    cpu: dict[str, float] = {}
    start = time.perf_counter()
    for key, metrics, cpu_s, wall_s in run_tasks(timed_evaluate, tasks, workers):
        c, s = by_key[key], by_key[key].job.strategy
        cpu[key] = cpu_s
        print(f"  {time.perf_counter() - start:7.1f} s  #{c.index:<5} tp{s.tp} pp{s.pp} dp{s.dp} "
              f"mb{c.job.training.micro_batch} {s.schedule.value} zero{s.zero} "
              f"{s.recompute.value}: {c.job.micro_batches} micro-batches, cpu {cpu_s:.1f} s, "
              f"wall {wall_s:.1f} s, step {metrics.get('step_time_s', metrics['error'])}",
              flush=True)
    wall = time.perf_counter() - start
    serial = sum(cpu.values())
    longest = [cpu[c.key] for c in work_order(todo, parallel=True)]
    cheapest = [cpu[c.key] for c in work_order(todo, parallel=False)]
    print(f"sweep wall time with {workers} workers: {wall:.0f} s ({wall / 60:.1f} min)")
    print(f"serial CPU total {serial:.0f} s; longest point {max(cpu.values()):.0f} s; on "
          f"{workers} workers from the CPU times: longest first {makespan(longest, workers):.0f} s, "
          f"cheapest first {makespan(cheapest, workers):.0f} s, ideal {serial / workers:.0f} s")


def main() -> None:
    if "--gpt3" in sys.argv:
        rest = sys.argv[sys.argv.index("--gpt3") + 1:]
        sample = int(rest[rest.index("--sample") + 1]) if "--sample" in rest else 1
        gpt3_sweep(int(rest[0]) if rest and rest[0].isdigit() else 2, sample)
        return
    total, to_simulate, rate = enumeration_rate()
    print(f"enumerate + prune (llama3-70b, 64 GPUs): {total} strategies, {to_simulate} to "
          f"simulate, {rate:,.0f} strategies/s")
    n1, serial = sweep_rate(1)
    n2, parallel = sweep_rate(2)
    print(f"simulate (llama3-8b, 8 GPUs, {n1} points): 1 worker {serial:.3f} points/s, "
          f"2 workers {parallel:.3f} points/s, ratio {parallel / serial:.2f}x")


if __name__ == "__main__":
    main()
