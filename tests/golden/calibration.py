"""Golden of the README's calibration table: the committed measurements of a calibration run,
against what today's simulator predicts from the profile fitted in that run.

The measured step times are data (``validate.json`` of the run's folder); the predictions are
recomputed here, as ``clustersim calibrate validate`` computes them, with the measuring host's
cores (the folder says how many), so a change of the model shows in the README's table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from clustersim.analysis.calibration.compare import (
    calibration_config, parse_strategy, predict, profile_device, signed_error)

from tests.golden.examples import GOLDEN, REPO

CALIBRATIONS = REPO / "analysis" / "data" / "calibration"


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrationGolden:
    folder: str
    """A calibration run's folder in ``analysis/data/calibration``."""
    baseline: str = "cpu-core"
    """The uncalibrated catalog device the run was compared with."""

    @property
    def name(self) -> str:
        return "calibration_" + re.sub(r"\W", "_", self.folder.split("-", 3)[-1])

    @property
    def path(self) -> Path:
        return GOLDEN / f"{self.name}.json"

    @property
    def args(self) -> tuple[str, ...]:
        return ("calibrate", "validate", "--profile",
                f"analysis/data/calibration/{self.folder}/profile.yaml")

    @property
    def cores(self) -> int:
        return int(re.search(r"(\d+)-cores", self.folder)[1])

    def run(self) -> dict:
        root = CALIBRATIONS / self.folder
        profile = root / "profile.yaml"
        device = profile_device(profile)
        rows = {}
        for measured in json.loads((root / "validate.json").read_text()):
            strategy = parse_strategy(measured["strategy"])
            step = measured["measured_step_time_s"]
            predicted = predict(calibration_config(strategy, device, [profile]),
                                self.cores).step_time_s
            baseline = predict(calibration_config(strategy, self.baseline, [profile]),
                               self.cores).step_time_s
            rows[measured["strategy"]] = {
                "measured_s": step, "predicted_s": predicted,
                "error": signed_error(predicted, step),
                "baseline_error": signed_error(baseline, step)}
        errors = [abs(r["error"]) for r in rows.values()]
        base = [abs(r["baseline_error"]) for r in rows.values()]
        return {"rows": rows, "mean_abs_error": sum(errors) / len(errors),
                "max_abs_error": max(errors), "baseline_mean_abs_error": sum(base) / len(base),
                "baseline_max_abs_error": max(base)}

    def stored(self) -> dict:
        return json.loads(self.path.read_text())

    def write(self) -> None:
        self.path.write_text(json.dumps(self.run(), indent=1, sort_keys=True) + "\n")


CALIBRATION_RUNS = (CalibrationGolden(folder="2026-11-30-amd-epyc-2-cores"),)
