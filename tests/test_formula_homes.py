"""Formulas written once: each has one definition that every other place calls (a second
copy of a formula drifts from the first)."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = [p for p in REPO.glob("*/**/*.py")
           if p.parts[len(REPO.parts)] in ("workloads", "simulator", "analysis", "hardware_specs")
           and "calibration" not in p.parts[len(REPO.parts):-1]]
"""Library code (the calibration GPT is a real torch model and keeps its own arithmetic)."""

HOMES = {
    "GiB": (r"2(\.0)?\s*\*\*\s*30", {"workloads/memory.py", "hardware_specs/units.py"}),
    "ring factor 2(n-1)/n": (r"2(\.0)?\s*\*\s*\((n|per_node) - 1\)\s*/\s*(n|per_node)\b",
                             {"simulator/cost/collectives.py"}),
    "sequence-parallel divisor": (r"tp if \w+\.sequence_parallel else 1", {"workloads/strategy.py"}),
    "vocabulary shard": (r"vocab(\s*\*\s*\w+\.hidden)?\s*(//|/)\s*\w*\.?tp\b", {"workloads/shards.py"}),
    "2 + 12 bytes per parameter": (r"12\.0\b(?!\s*\*\s*local)", {"workloads/memory.py"}),
}


@pytest.mark.parametrize("formula", sorted(HOMES))
def test_a_formula_has_one_home(formula):
    pattern, homes = HOMES[formula]
    found = {str(p.relative_to(REPO)) for p in SOURCES
             if re.search(pattern, "\n".join(line.split("#")[0] for line in
                                            p.read_text().splitlines()
                                            if not line.strip().startswith(('"', "'"))))}
    assert found <= homes, f"{formula} written again in {sorted(found - homes)}"
