"""Engine speed: the Llama-3-405B step on 16,384 H100 SXM next to a bare SimPy loop.

Config (Llama 3 Herd, arXiv 2407.21783, sec. 3.3.2): TP8 PP16 DP128, seq 8192, global batch
2048, micro-batch 1, interleaved 1F1B. Reference: a bare SimPy loop of 1,000,000 timeouts run in
the same process, so the ratio is meaningful on a shared, noisy machine. Then the same job
on 1,024 and 4,096 GPUs (DP 8 and 32, the global batch scaled with DP so that every replica
runs the same 16 micro-batches): how the cost grows with the GPU count.

    python benchmarks/bench_engine.py
"""

from __future__ import annotations

import time

import simpy

from clustersim.hardware_specs import load_catalog
from clustersim.simulator import simulate
from clustersim.workloads import Job, Recompute, Schedule, Strategy, TrainingSpec
from clustersim.workloads.builder import build_trace
from clustersim.workloads.model import PRESETS

BARE_TIMEOUTS = 1_000_000


def bare_simpy_seconds(n: int = BARE_TIMEOUTS) -> float:
    env = simpy.Environment()

    def loop():
        for _ in range(n):
            yield env.timeout(1.0)

    env.process(loop())
    start = time.perf_counter()
    env.run()
    return time.perf_counter() - start


def llama3_405b_job(gpus: int = 16384) -> Job:
    dp = gpus // (8 * 16)
    strategy = Strategy(tp=8, pp=16, dp=dp, sequence_parallel=True, schedule=Schedule.INTERLEAVED,
                        virtual_stages=2, recompute=Recompute.NONE, zero=1)
    training = TrainingSpec(seq_len=8192, global_batch=16 * dp, micro_batch=1)
    return Job(PRESETS["llama3-405b"], training, strategy).checked(gpus)


def timed_step(gpus: int, bare: float) -> None:
    """Build and simulate the step on ``gpus`` H100 and print its cost next to ``bare``."""
    cluster = load_catalog().cluster(device="h100-sxm", num_devices=gpus)
    start = time.perf_counter()
    trace = build_trace(llama3_405b_job(gpus))
    built = time.perf_counter() - start
    result = simulate(trace, cluster)
    total = time.perf_counter() - start
    ops = sum(len(p.ops) for p in trace.programs)
    print(f"llama3-405b on {gpus:,} h100-sxm: build {built:.2f} s + simulate "
          f"{result.wall_time_s:.2f} s = {total:.2f} s ({total / bare:.2f}x bare SimPy); "
          f"{ops:,} ops in {len(result.classes)} rank classes; {result.events:,} events; "
          f"step time {result.step_time_s:.6f} s, MFU {100 * result.mfu:.1f}%")


def main() -> None:
    bare = bare_simpy_seconds()
    print(f"bare SimPy, {BARE_TIMEOUTS:,} timeouts: {bare:.2f} s")
    for gpus in (16384, 1024, 4096):
        timed_step(gpus, bare)
    print(f"bare SimPy again: {bare_simpy_seconds():.2f} s (the machine's noise)")


if __name__ == "__main__":
    main()
