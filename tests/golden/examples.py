"""Each example's golden run: the command its README line shows, and the numbers kept from it.

A golden is the summary of one command's JSON output (``tests/golden/<example>.json``): the
numbers a user reads, not the whole output, so that a golden changes only when a number does.
``python -m tests.golden.regenerate`` rewrites them (and the README's marked numbers).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clustersim.analysis.accuracy import time_error
from clustersim.analysis.cli.main import main

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent
EXAMPLES = REPO / "examples"
GIB = 2**30

TOLERANCE = 1e-6
"""Relative tolerance of a golden number. The simulation is deterministic: the margin only
absorbs floating-point differences between platforms and library versions, so any change of
the model shows, and is accepted by regenerating the goldens."""


def _step(out: dict) -> dict:
    return {key: out[key] for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                                      "fits_in_memory", "breakdown")} | {
        "peak_memory_gib": max(stage["required"] for stage in out["memory"]) / GIB,
        "rank_classes": len(out["rank_classes"]),
        "events": out["simulation"]["events"]}


def _faulted_step(out: dict) -> dict:
    faults = out["faults"]
    return _step(out) | {"faults": {
        "healthy_step_time_s": faults["healthy_step_time_s"], "lost_s": faults["lost_s"],
        "grown": {_slug(f"{g['group'].split(' (')[0]} {g['part']}"): g["grown_s"]
                  for g in faults["grown"]}}}


def _slug(text: str) -> str:
    """A README marker's key: ``the TP group of rank 17 tp`` -> ``the_tp_group_of_rank_17_tp``."""
    return re.sub(r"\W+", "_", text).strip("_").lower()


_FAILURE_KEYS = ("step_time_s", "checkpoint_interval_s", "young_daly_interval_s",
                 "interruptions_mean", "planned_interruptions_mean", "interruptions_by_cause",
                 "ettr_mean", "lost_work_hours_mean", "downtime_hours_mean",
                 "checkpoint_overhead_fraction", "time_to_train_days_mean")


def _failures(out: dict) -> dict:
    summary = {key: out[key] for key in _FAILURE_KEYS}
    if out.get("sweep"):
        summary["sweep"] = {policy: {k: s[k] for k in ("best_interval_s", "best_ettr",
                                                        "fitted_optimum_s")}
                            for policy, s in out["sweep"].items()}
    return summary


def _collective(rows: list[dict]) -> dict:
    # As the command prints it: predicted / measured time - 1 (analysis.accuracy).
    errors = [time_error(r["time_s"], r["measured_time_s"]) for r in rows]
    return {"sizes": {str(r["bytes"]): {"time_s": r["time_s"],
                                        "algorithm": f"{r['algorithm']}/{r['protocol']}"}
                      for r in rows},
            "time_mean_abs_error": sum(map(abs, errors)) / len(errors),
            "time_max_abs_error": max(map(abs, errors))}


@dataclass(frozen=True, kw_only=True, slots=True)
class GoldenRun:
    example: str
    """File name in ``examples/``."""
    args: tuple[str, ...]
    """The command line, without ``--json``."""
    summarize: Callable[[object], dict]
    slow: bool = False
    """Longer than a few seconds: left out of the fast test tier."""

    @property
    def name(self) -> str:
        return Path(self.example).stem

    @property
    def path(self) -> Path:
        return GOLDEN / f"{self.name}.json"

    def run(self) -> dict:
        """Run the command and summarise its JSON output."""
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.json"
            with contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()) as err:
                status = main([*self.args, "--json", str(out)])
            if status != 0:
                raise RuntimeError(f"clustersim {' '.join(self.args)} exited {status}: "
                                   f"{err.getvalue().strip()}")
            return json.loads(json.dumps(self.summarize(json.loads(out.read_text()))))

    def stored(self) -> dict:
        return json.loads(self.path.read_text())

    def write(self) -> None:
        self.path.write_text(json.dumps(self.run(), indent=1, sort_keys=True) + "\n")


def _shared(out: dict) -> dict:
    return {"jobs": {j["name"]: {k: j[k] for k in ("step_time_s", "alone_step_time_s", "lost_s",
                                                   "extra_exposed_comm_s")}
                     for j in out["jobs"]},
            "hot_links": [link["link"] for link in out["hot_links"]],
            "shared_links": out["shared_links"]}


def _plan(out: dict) -> dict:
    return {key: out[key] for key in ("replica_batch", "layers_per_stage", "step_time_s",
                                      "fits_in_memory", "speedup_over_even",
                                      "speedup_over_fastest_only")}


def _simulate(example: str, slow: bool = False) -> GoldenRun:
    return GoldenRun(example=example, args=("simulate", Path(example).stem), summarize=_step,
                     slow=slow)


RUNS = (
    _simulate("llama3_70b_h100.yaml", slow=True),
    _simulate("gpt3_175b_a100.yaml", slow=True),
    _simulate("llama3_8b_fsdp.yaml"),
    _simulate("llama3_8b_subnetworks.yaml"),
    _simulate("moe_fabric_contention.yaml"),
    _simulate("moe_fabric_contention_rail.yaml"),
    _simulate("deepseek_v3_h800.yaml", slow=True),
    _simulate("qwen3_235b_gb200.yaml", slow=True),
    _simulate("llama3_70b_gb200_fsdp.yaml"),
    GoldenRun(example="shared_fabric_4to1.yaml", args=("simulate", "shared_fabric_4to1"),
              summarize=_shared),
    _simulate("cosmoflow_a100.yaml"),
    GoldenRun(example="hetero_a100_h100.yaml", args=("plan", "hetero_a100_h100"),
              summarize=_plan, slow=True),
    GoldenRun(example="failures_llama3_405b.yaml", summarize=_failures, slow=True,
              args=("failures", "failures_llama3_405b", "--days", "54", "--seeds", "200")),
    GoldenRun(example="failures_bloom_176b.yaml", summarize=_failures, slow=True,
              args=("failures", "failures_bloom_176b", "--seeds", "200", "--sweep-interval")),
    GoldenRun(example="gpt3_175b_straggler.yaml", summarize=_faulted_step, slow=True,
              args=("simulate", "gpt3_175b_straggler")),
    GoldenRun(example="failures_reft_gpt3.yaml", summarize=_failures, slow=True,
              args=("failures", "failures_reft_gpt3", "--seeds", "20", "--sweep-interval")),
    GoldenRun(example="nccl_tests_h100_p5.log", summarize=_collective,
              args=("collective", "--gpu", "h100-sxm", "--gpus", "8",
                    "--against", str(EXAMPLES / "nccl_tests_h100_p5.log"))),
)
BY_NAME = {run.name: run for run in RUNS}


def differences(expected, actual, path: str = "") -> list[str]:
    """Where ``actual`` departs from ``expected``: numbers beyond :data:`TOLERANCE`, anything
    else when not equal."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = [f"{path}.{k}: missing" for k in expected.keys() - actual.keys()]
        out += [f"{path}.{k}: new" for k in actual.keys() - expected.keys()]
        for k in sorted(expected.keys() & actual.keys()):
            out += differences(expected[k], actual[k], f"{path}.{k}")
        return out
    numbers = (int, float)
    if (isinstance(expected, numbers) and isinstance(actual, numbers)
            and not isinstance(expected, bool) and not isinstance(actual, bool)):
        if abs(actual - expected) <= TOLERANCE * max(abs(expected), abs(actual), 1e-12):
            return []
        return [f"{path}: {expected!r} -> {actual!r}"]
    return [] if expected == actual else [f"{path}: {expected!r} -> {actual!r}"]
