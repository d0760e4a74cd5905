"""Goldens of the README's trace table: recorded torch steps replayed with ``clustersim
simulate``, beside the step times measured in the same runs (``measured.json``, data)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from clustersim.analysis.config import read_yaml
from clustersim.analysis.traces.workload import simulate_trace_config, trace_config_from_mapping

from tests.golden.examples import GOLDEN, REPO

RECORDED = REPO / "analysis" / "data" / "traces" / "2026-12-01-amd-epyc-2-cores"


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceReplays:
    configs: tuple[tuple[str, str], ...]
    """(config in ``RECORDED``, the run folder whose measurement it is compared with)."""
    name: str = "traces_amd_epyc_2_cores"

    @property
    def path(self) -> Path:
        return GOLDEN / f"{self.name}.json"

    @property
    def args(self) -> tuple[str, ...]:
        return ("simulate", f"{RECORDED.relative_to(REPO)}/<run>.yaml")

    def run(self) -> dict:
        out = {}
        for config, run in self.configs:
            path = RECORDED / f"{config}.yaml"
            simulated = simulate_trace_config(
                trace_config_from_mapping(read_yaml(path), path.parent)).step_time_s
            measured = json.loads((RECORDED / run / "measured.json").read_text())
            untraced = measured["measured_step_time_s"]
            traced = measured["traced_steps_s"][measured["traced_step_kept"]]
            out[config] = {"simulated_s": simulated, "measured_s": untraced,
                           "error": simulated / untraced - 1, "traced_step_s": traced,
                           "error_vs_traced": simulated / traced - 1}
        return out

    def stored(self) -> dict:
        return json.loads(self.path.read_text())

    def write(self) -> None:
        self.path.write_text(json.dumps(self.run(), indent=1, sort_keys=True) + "\n")


TRACE_REPLAYS = (TraceReplays(configs=(("dp1", "dp1"), ("dp2", "dp2"), ("dp4_from_dp2", "dp4"),
                                       ("pp2", "pp2"))),)
