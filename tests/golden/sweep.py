"""Golden of the README's sweep: ``clustersim sweep examples/llama3_70b_h100.yaml``.

It keeps the enumeration's counts and every simulated point's ranking, so the README's sweep
table and counts are rendered from it. The whole sweep takes minutes; the test enumerates the
space again (cheap) and re-simulates the fastest points.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from clustersim.analysis.step import simulation_options
from clustersim.analysis.sweeps.ranking import ranking, ranking_rows
from clustersim.analysis.sweeps.runner import evaluate, job_of_row, load_for_sweep, run_sweep
from clustersim.analysis.sweeps.space import enumerate_space, space_from_mapping

from tests.golden.examples import EXAMPLES, GOLDEN

_STRATEGY = ("tp", "pp", "dp", "cp", "cp_algorithm", "cp_a2a", "micro_batch", "schedule",
             "virtual_stages", "sequence_parallel", "recompute", "zero", "offload")
_KEPT = ("key", "rank", *_STRATEGY, "tokens_per_s", "mfu", "step_time_s", "peak_memory_gib",
         "failure_waste")


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepGolden:
    example: str
    workers: int = 2
    sample: int = 3

    @property
    def name(self) -> str:
        return "sweep_" + Path(self.example).stem

    @property
    def path(self) -> Path:
        return GOLDEN / f"{self.name}.json"

    @property
    def args(self) -> tuple[str, ...]:
        return ("sweep", f"examples/{self.example}", "--workers", str(self.workers))

    def loaded(self):
        return load_for_sweep(EXAMPLES / self.example)

    def counts(self) -> dict[str, int]:
        """How many strategies the space holds, by status (enumeration only, no simulation)."""
        config = self.loaded().config
        candidates = enumerate_space(config.job, config.cluster.num_devices,
                                     config.cluster.device.memory_bytes,
                                     space_from_mapping(config.sections.get("sweep")))
        out: dict[str, int] = {"enumerated": len(candidates)}
        for c in candidates:
            out[c.status.value] = out.get(c.status.value, 0) + 1
        return out

    def run(self) -> dict:
        loaded = self.loaded()
        with tempfile.TemporaryDirectory() as tmp:
            run_sweep(loaded, Path(tmp) / "run", workers=self.workers, progress=False)
            frame = ranking(Path(tmp) / "run", loaded.config)
        headers, rows = ranking_rows(frame, len(frame))
        points = [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
                  for r in frame[list(_KEPT)].to_dict("records")]
        return json.loads(json.dumps({"counts": self.counts(), "simulated": len(frame),
                                      "points": points, "table": {"headers": headers,
                                                                  "rows": rows}}))

    def sample_ranks(self, simulated: int) -> list[int]:
        """The first ranks: the README's table starts there, and the fastest points are
        cheap to simulate (the slowest hold hundreds of micro-batches)."""
        return list(range(1, min(self.sample, simulated) + 1))

    def run_sample(self, points: list[dict]) -> dict[str, float]:
        """Tokens per second of the sampled ranked points, simulated again one by one."""
        config = self.loaded().config
        options = replace(simulation_options(config), record=False)
        by_rank = {p["rank"]: p for p in points}
        out = {}
        for rank in self.sample_ranks(len(points)):
            point = by_rank[rank]
            _, metrics = evaluate((point["key"], job_of_row(config, point), config.cluster,
                                   options))
            out[point["key"]] = metrics["tokens_per_s"]
        return out

    def stored(self) -> dict:
        return json.loads(self.path.read_text())

    def write(self) -> None:
        self.path.write_text(json.dumps(self.run(), indent=1, sort_keys=True) + "\n")


SWEEPS = (SweepGolden(example="llama3_70b_h100.yaml"),)
