"""Expanded-mode speed: every rank on its own clock (``simulation: {expand: true}``), 1K-100K ranks.

Layout of the Llama-3-405B benchmark (``bench_engine.py``: TP8 PP16, interleaved 1F1B, 16
micro-batches per data-parallel replica) with DP = ranks / 128. Each case runs in a fresh process,
so its peak RSS is its own, and times a bare SimPy loop of 1,000,000 timeouts in that same process
first, so the ratio holds on a shared, noisy machine. Two cases per size: a healthy cluster, and
every rank's compute slower by its own factor in [1, 1.05) (every rank different: no two ranks'
clocks agree, the hard case for the lanes).

    python benchmarks/bench_expanded.py                 # 1,024 4,096 16,384 100,352 ranks
    python benchmarks/bench_expanded.py --sizes 1024 4096
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from clustersim.hardware_specs import load_catalog
from clustersim.simulator import Faults, SimulationOptions, simulate
from clustersim.workloads import Job
from clustersim.workloads.builder import build_trace

sys.path.insert(0, str(Path(__file__).parent))
from bench_engine import BARE_TIMEOUTS, bare_simpy_seconds, llama3_405b_job  # noqa: E402

SIZES = (1024, 4096, 16384, 100352)
CASES = ("healthy", "every rank different")


def job_of(ranks: int) -> Job:
    base = llama3_405b_job()
    s = base.strategy
    dp = ranks // (s.tp * s.pp)
    if dp * s.tp * s.pp != ranks:
        raise SystemExit(f"--sizes: {ranks} is not a multiple of TP x PP = {s.tp * s.pp}")
    training = replace(base.training, global_batch=16 * dp)
    return Job(base.model, training, replace(s, dp=dp)).checked(ranks)


def faults_of(case: str, ranks: int) -> Faults:
    if case == "healthy":
        return Faults()
    factors = 1.0 + 0.05 * np.random.default_rng(0).random(ranks)
    return Faults(compute_slowdown=dict(enumerate(factors.tolist())))


def one_case(ranks: int, case: str) -> dict:
    """Run in a child process: bare loop, trace, expanded step; peak RSS of this process."""
    bare = bare_simpy_seconds()
    start = time.perf_counter()
    trace = build_trace(job_of(ranks))
    built = time.perf_counter() - start
    cluster = load_catalog().cluster(device="h100-sxm", num_devices=ranks)
    result = simulate(trace, cluster, SimulationOptions(expand=True, record=False),
                      faults_of(case, ranks))
    total = time.perf_counter() - start
    return {"ranks": ranks, "case": case, "bare_s": bare, "build_s": built,
            "simulate_s": result.wall_time_s, "total_s": total, "events": result.events,
            "step_time_s": result.step_time_s,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    parser.add_argument("--child", nargs=2, metavar=("RANKS", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_case(int(args.child[0]), args.child[1])))
        return
    print(f"{'ranks':>8} {'case':<21} {'bare SimPy':>10} {'build':>7} {'simulate':>9} "
          f"{'total':>7} {'ratio':>6} {'peak RSS':>9} {'events':>8}  step")
    for ranks in args.sizes:
        for case in CASES:
            out = subprocess.run([sys.executable, __file__, "--child", str(ranks), case],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{r['ranks']:>8,} {r['case']:<21} {r['bare_s']:>9.2f}s {r['build_s']:>6.1f}s "
                  f"{r['simulate_s']:>8.1f}s {r['total_s']:>6.1f}s {r['total_s'] / r['bare_s']:>5.1f}x "
                  f"{r['peak_rss_gb']:>7.2f}GB {r['events']:>8,}  {r['step_time_s']:.4f} s",
                  flush=True)
    print(f"ratio: (trace build + expanded step) over the bare loop of {BARE_TIMEOUTS:,} "
          f"timeouts in the same process; the issue's floor is 60x and 4 GB at 16,384 ranks")


if __name__ == "__main__":
    main()
