"""Monte Carlo over seeds: run ``i`` draws from ``SeedSequence([seed, i])`` alone, so results are
the same whatever the number of worker processes and whatever order they finish in."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from clustersim.simulator.longrun.job_run import JobRun
from clustersim.simulator.longrun.plan import RunPlan, RunResult

_PLAN: RunPlan | None = None


def run_one(plan: RunPlan, seed: int, index: int, record: bool = False) -> RunResult:
    rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
    return JobRun(plan, rng, index, record).result()


def _init(plan: RunPlan) -> None:
    global _PLAN
    _PLAN = plan


def _run_index(args: tuple[int, int, bool]) -> RunResult:
    seed, index, record = args
    return run_one(_PLAN, seed, index, record)


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_seeds(plan: RunPlan, seeds: int, seed: int = 0, workers: int = 1,
              record_first: bool = False) -> list[RunResult]:
    """``seeds`` runs of ``plan``, in index order; run 0 keeps its timeline if asked."""
    jobs = [(seed, i, record_first and i == 0) for i in range(seeds)]
    workers = max(1, min(workers, seeds))
    if workers == 1:
        return [run_one(plan, *job) for job in jobs]
    chunk = max(1, seeds // (4 * workers))
    with ProcessPoolExecutor(max_workers=workers, initializer=_init, initargs=(plan,)) as pool:
        return list(pool.map(_run_index, jobs, chunksize=chunk))
