"""Failure-study speed: 200 seeds of the 54-day Llama 3 405B study on 16,384 H100
(examples/failures_llama3_405b.yaml), next to a bare SimPy loop run in the same process.

Prints, side by side: the one-off engine step simulation, the 200 long-horizon runs (on 1 worker
and on all CPUs), the time per run and per simulated interruption, and the ratio of a run's cost
to a bare SimPy loop with as many timeouts as the run had events. The target is the 200 runs in
under a minute on 2 cores.

    python benchmarks/bench_failures.py [--seeds 200] [--workers N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench_engine import bare_simpy_seconds    # the same reference loop as the engine bench

from clustersim.simulator.longrun.montecarlo import default_workers, run_seeds

from clustersim.analysis.config import load_config
from clustersim.analysis.failures.config import failure_spec
from clustersim.analysis.failures.study import prepare

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "failures_llama3_405b.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--workers", type=int, default=default_workers())
    args = parser.parse_args()
    config = load_config(EXAMPLE)
    spec = failure_spec(config, days=54)

    start = time.perf_counter()
    prepared = prepare(config, spec)
    engine_s = time.perf_counter() - start

    timings = {}
    for workers in sorted({1, args.workers}):
        start = time.perf_counter()
        runs = run_seeds(prepared.plan, args.seeds, spec.seed, workers)
        timings[workers] = time.perf_counter() - start
    events = sum(len(r.events) for r in runs)
    interruptions = sum(r.interruptions + r.planned for r in runs)
    bare = bare_simpy_seconds(events * 4)   # a failure costs the run about four SimPy events

    print(f"failure study: {EXAMPLE.name}, 54 days, {args.seeds} seeds, "
          f"step {prepared.plan.step_time_s:.3f} s (engine), "
          f"{interruptions / args.seeds:.0f} interruptions per run")
    print(f"{'part':<34}{'seconds':>10}{'per run (ms)':>14}")
    print(f"{'engine: healthy step, once':<34}{engine_s:>10.2f}{'':>14}")
    for workers, seconds in timings.items():
        print(f"{f'{args.seeds} runs on {workers} worker(s)':<34}{seconds:>10.2f}"
              f"{1e3 * seconds / args.seeds:>14.1f}")
    fastest = min(timings.values())
    print(f"{'bare SimPy, 4 timeouts per event':<34}{bare:>10.2f}{1e3 * bare / args.seeds:>14.1f}")
    print(f"per interruption: {1e6 * timings[1] / max(interruptions, 1):.0f} us on one worker; "
          f"runs / bare SimPy = {timings[1] / bare:.1f}x")
    print(f"study total (engine + runs on {max(timings)} workers): {engine_s + fastest:.1f} s; "
          f"runs alone {'under' if fastest < 60 else 'OVER'} a minute")


if __name__ == "__main__":
    main()
