"""Sweep throughput: configurations per second, serial against local worker processes.

Two numbers side by side:
- enumeration and pruning (strategy rules and the memory model, no simulation) of the
  Llama-3-70B example's default space;
- simulated points per second of a Llama-3-8B sweep on 8 H100 SXM (examples/llama3_8b_fsdp.yaml,
  a fixed 24-point space) with 1 worker and with 2 workers, and their ratio.

    python benchmarks/bench_sweep.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import yaml

from clustersim.analysis.sweeps.space import Status, enumerate_space, space_from_mapping
from clustersim.analysis.sweeps.runner import from_mapping, load_for_sweep, run_sweep

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


def main() -> None:
    total, to_simulate, rate = enumeration_rate()
    print(f"enumerate + prune (llama3-70b, 64 GPUs): {total} strategies, {to_simulate} to "
          f"simulate, {rate:,.0f} strategies/s")
    n1, serial = sweep_rate(1)
    n2, parallel = sweep_rate(2)
    print(f"simulate (llama3-8b, 8 GPUs, {n1} points): 1 worker {serial:.3f} points/s, "
          f"2 workers {parallel:.3f} points/s, ratio {parallel / serial:.2f}x")


if __name__ == "__main__":
    main()
