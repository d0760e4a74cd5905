"""Cost of flow-level contention: the 1,024-GPU GPT-3 175B step (examples/gpt3_175b_a100.yaml)
simulated with the flow model and with the analytic (uncontended) model, side by side.

    python benchmarks/bench_network.py
"""

from __future__ import annotations

import time

from clustersim.analysis.config import load_config
from clustersim.simulator import SimulationOptions, simulate
from clustersim.simulator.engine import NetworkMode
from clustersim.workloads.builder import build_trace

from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples/gpt3_175b_a100.yaml"


def main() -> None:
    config = load_config(EXAMPLE)
    trace = build_trace(config.job)
    walls = {}
    for mode in (NetworkMode.ANALYTIC, NetworkMode.FLOW):
        start = time.perf_counter()
        result = simulate(trace, config.cluster, SimulationOptions(network=mode))
        walls[mode] = time.perf_counter() - start
        print(f"{mode.value:8s}: step {result.step_time_s:.3f} s simulated in {walls[mode]:.2f} s "
              f"({result.events:,} events)")
    ratio = walls[NetworkMode.FLOW] / walls[NetworkMode.ANALYTIC]
    print(f"flow / analytic wall time: {ratio:.2f}x (must stay at or under 10x)")


if __name__ == "__main__":
    main()
