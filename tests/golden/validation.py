"""Goldens of the accuracy tables: ``clustersim validate`` on each published-runs file.

A validation golden keeps every row's error and the file's summary, so the README's accuracy
numbers (a MAPE, a source's range, one row's error) are rendered from it like the examples'.
Replaying a whole file takes minutes, so the test replays a spread sample of its rows and
checks they give the stored errors: a change of the model moves them and asks for
``python -m tests.golden.regenerate validate_<file>``, which replays every row.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from clustersim.analysis.cli.main import main

from tests.golden.examples import GOLDEN, REPO

DATA = REPO / "analysis" / "data"
SAMPLE = 4
"""Rows replayed by the test, spread evenly over the file."""


def _validate(runs: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            status = main(["validate", "--runs", str(runs), "--no-progress", "--json", str(out)])
        if status != 0:
            raise RuntimeError(f"clustersim validate --runs {runs} exited {status}")
        return json.loads(out.read_text())


def _finite(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidationGolden:
    runs: str
    """File name in ``analysis/data``."""

    @property
    def name(self) -> str:
        return "validate_" + Path(self.runs).stem.removeprefix("published_runs_")

    @property
    def path(self) -> Path:
        return GOLDEN / f"{self.name}.json"

    @property
    def args(self) -> tuple[str, ...]:
        return ("validate", "--runs", f"analysis/data/{self.runs}")

    def table(self) -> list[dict]:
        with (DATA / self.runs).open(newline="") as fh:
            return list(csv.DictReader(fh))

    def summarize(self, out: dict) -> dict:
        by_id = {row["id"]: row for row in self.table()}
        rows = {}
        for r in out["rows"]:
            row = by_id.get(r["id"], {})
            rows[r["id"]] = {"error": _finite(r["error"]), "problem": r["problem"],
                             "fits_in_memory": r["fits_in_memory"], "gpu": row.get("gpu", ""),
                             "precision": row.get("fp8_recipe") or row.get("precision", "")}
            if r.get("measured_peak_memory_gib") is not None:
                rows[r["id"]] |= {key: r[key] for key in (
                    "measured_peak_memory_gib", "predicted_peak_memory_gib", "peak_memory_error")}
        return {"summary": out["summary"], "rows": rows}

    def run(self) -> dict:
        return json.loads(json.dumps(self.summarize(_validate(DATA / self.runs))))

    def sample_ids(self) -> list[str]:
        """Rows the test replays: evenly spread, the first and the last included."""
        ids = [row["id"] for row in self.table()]
        if len(ids) <= SAMPLE:
            return ids
        return [ids[round(i * (len(ids) - 1) / (SAMPLE - 1))] for i in range(SAMPLE)]

    def run_sample(self) -> dict[str, dict]:
        """The step-time and peak-memory errors of :meth:`sample_ids`, replayed from a copy of
        the file cut to them."""
        table, wanted = self.table(), set(self.sample_ids())
        with tempfile.TemporaryDirectory() as tmp:
            cut = Path(tmp) / self.runs
            with cut.open("w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=list(table[0]))
                writer.writeheader()
                writer.writerows(row for row in table if row["id"] in wanted)
            out = _validate(cut)
        return {r["id"]: {"error": _finite(r["error"]),
                          "peak_memory_error": r.get("peak_memory_error")}
                for r in out["rows"]}

    def stored(self) -> dict:
        return json.loads(self.path.read_text())

    def write(self) -> None:
        self.path.write_text(json.dumps(self.run(), indent=1, sort_keys=True) + "\n")


VALIDATIONS = tuple(ValidationGolden(runs=f"published_runs_{name}.csv")
                    for name in ("dev", "megatron_family", "torchtitan", "blackwell", "moe",
                                 "long_context"))
