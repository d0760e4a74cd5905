"""Engine speed: the Llama-3-405B step on 16,384 H100 SXM next to a bare SimPy loop.

Config (Llama 3 Herd, arXiv 2407.21783, sec. 3.3.2): TP8 PP16 DP128, seq 8192, global batch
2048, micro-batch 1, interleaved 1F1B. Reference: a bare SimPy loop of 1,000,000 timeouts run in
the same process just before each step (build + simulate), so the ratio is meaningful on a
shared, noisy machine; the step runs ``--repeats`` times, each after its own bare loop, and the
ratio is given in wall time and in this process's CPU time (less sensitive to other processes).
Then the same job on 1,024 and 4,096 GPUs (DP 8 and 32, the global batch scaled with DP so that
every replica runs the same 16 micro-batches): how the cost grows with the GPU count. Last,
the DeepSeek-V3 example and a DeepEP row of the MoE table (DeepEP's kernels hold SMs) replayed
folded and with an event per op, side by side: their step times must be equal, their cost is
given as a ratio.

    python benchmarks/bench_engine.py
    python benchmarks/bench_engine.py --repeats 5
    python benchmarks/bench_engine.py --only held-sms
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import simpy

from clustersim.analysis.config import RunConfig, load_config
from clustersim.analysis.step import simulation_options
from clustersim.analysis.validation.published import row_config
from clustersim.hardware_specs import load_catalog
from clustersim.simulator import StepSimulation, simulate
from clustersim.workloads import Job, Recompute, Schedule, Strategy, TrainingSpec
from clustersim.workloads.builder import build_trace
from clustersim.workloads.model import PRESETS

BARE_TIMEOUTS = 1_000_000
REPO = Path(__file__).resolve().parents[1]


def bare_simpy_seconds(n: int = BARE_TIMEOUTS) -> float:
    return bare_simpy_times(n)[0]


def bare_simpy_times(n: int = BARE_TIMEOUTS) -> tuple[float, float]:
    """(wall, CPU) seconds of a bare SimPy loop of ``n`` timeouts."""
    env = simpy.Environment()

    def loop():
        for _ in range(n):
            yield env.timeout(1.0)

    env.process(loop())
    wall, cpu = time.perf_counter(), time.process_time()
    env.run()
    return time.perf_counter() - wall, time.process_time() - cpu


def llama3_405b_job(gpus: int = 16384) -> Job:
    dp = gpus // (8 * 16)
    strategy = Strategy(tp=8, pp=16, dp=dp, sequence_parallel=True, schedule=Schedule.INTERLEAVED,
                        virtual_stages=2, recompute=Recompute.NONE, zero=1)
    training = TrainingSpec(seq_len=8192, global_batch=16 * dp, micro_batch=1)
    return Job(PRESETS["llama3-405b"], training, strategy).checked(gpus)


def timed_step(gpus: int, bare: tuple[float, float]) -> tuple[float, float]:
    """Build and simulate the step on ``gpus`` H100, print its cost next to ``bare`` (wall, CPU)
    and return the two ratios."""
    cluster = load_catalog().cluster(device="h100-sxm", num_devices=gpus)
    start, cpu = time.perf_counter(), time.process_time()
    trace = build_trace(llama3_405b_job(gpus))
    built = time.perf_counter() - start
    result = simulate(trace, cluster)
    total, total_cpu = time.perf_counter() - start, time.process_time() - cpu
    ops = sum(len(p.ops) for p in trace.programs)
    wall_ratio, cpu_ratio = total / bare[0], total_cpu / bare[1]
    print(f"llama3-405b on {gpus:,} h100-sxm: build {built:.2f} s + simulate "
          f"{result.wall_time_s:.2f} s = {total:.2f} s ({wall_ratio:.2f}x bare SimPy; CPU "
          f"{cpu_ratio:.2f}x); {ops:,} ops in {len(result.classes)} rank classes; "
          f"{result.events:,} events; step time {result.step_time_s:.6f} s, "
          f"MFU {100 * result.mfu:.1f}%")
    return wall_ratio, cpu_ratio


HELD_SMS_ROW = "mz_qwen3_235b_h100_deepep_tp4_ep8_pp8"
"""A DeepEP row of ``analysis/data/published_runs_moe.csv`` run 1F1B-interleaved without
all-to-all overlap: no compute beside its dispatches, so the whole trace but those folds."""


def held_sms_configs() -> list[tuple[str, RunConfig]]:
    """The DeepSeek-V3 example (DualPipe: 64% of its compute beside DeepEP's dispatches) and
    ``HELD_SMS_ROW`` (none beside)."""
    rows = csv.DictReader((REPO / "analysis/data/published_runs_moe.csv").open())
    row = next(r for r in rows if r["id"] == HELD_SMS_ROW)
    return [("deepseek_v3_h800", load_config("deepseek_v3_h800")),
            (HELD_SMS_ROW, row_config(row, load_catalog()))]


def held_sms_folding(name: str, config: RunConfig) -> float:
    """Replay ``config`` (collectives that hold SMs) with an event per op and folded, side by
    side; print both costs and which the engine picks, and return the folded replay's share of
    the other's CPU time."""
    trace = build_trace(config.job)
    costs = {}
    for fold in (False, True):
        sim = StepSimulation(trace, config.cluster, simulation_options(config), fold=fold)
        cpu = time.process_time()
        result = sim.run()
        costs[fold] = (time.process_time() - cpu, result.events, result.step_time_s)
    (slow, slow_events, slow_step), (fast, fast_events, fast_step) = costs[False], costs[True]
    if fast_step != slow_step:
        raise AssertionError(f"{name}: folded step {fast_step!r} s != {slow_step!r} s")
    picked = StepSimulation(trace, config.cluster, simulation_options(config)).fold
    print(f"{name} (collectives hold SMs): event per op {slow:.2f} s CPU, {slow_events:,} "
          f"events; folded {fast:.2f} s CPU, {fast_events:,} events: {fast / slow:.2f}x the "
          f"CPU, {fast_events / slow_events:.2f}x the events; step time {fast_step:.6f} s in "
          f"both; the engine {'folds' if picked else 'runs an event per op'} by default")
    return fast / slow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--repeats", type=int, default=3,
                        help="16,384-GPU steps, each after its own bare loop (default 3)")
    parser.add_argument("--only", choices=["held-sms"],
                        help="run only the DeepSeek-V3 folded-against-event-per-op comparison")
    args = parser.parse_args()
    if args.only == "held-sms":
        for name, config in held_sms_configs():
            held_sms_folding(name, config)
        return
    ratios = []
    for _ in range(args.repeats):
        bare = bare_simpy_times()
        print(f"bare SimPy, {BARE_TIMEOUTS:,} timeouts: {bare[0]:.2f} s (CPU {bare[1]:.2f} s)")
        ratios.append(timed_step(16384, bare))
    wall, cpu = (sorted(r[i] for r in ratios) for i in (0, 1))
    print(f"16,384 GPUs over {args.repeats} runs: {wall[0]:.2f}x-{wall[-1]:.2f}x bare SimPy "
          f"(median {statistics.median(wall):.2f}x), CPU {cpu[0]:.2f}x-{cpu[-1]:.2f}x "
          f"(median {statistics.median(cpu):.2f}x)")
    for gpus in (1024, 4096):
        timed_step(gpus, bare_simpy_times())
    print(f"bare SimPy again: {bare_simpy_seconds():.2f} s (the machine's noise)")
    for name, config in held_sms_configs():
        held_sms_folding(name, config)


if __name__ == "__main__":
    main()
