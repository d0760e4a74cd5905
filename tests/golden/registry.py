"""Every golden, by name: the examples' runs, the README's calibration table and its trace
replays."""

from __future__ import annotations

from tests.golden.calibration import CALIBRATION_RUNS
from tests.golden.examples import RUNS
from tests.golden.traces import TRACE_REPLAYS

GOLDENS = (*RUNS, *CALIBRATION_RUNS, *TRACE_REPLAYS)
BY_NAME = {golden.name: golden for golden in GOLDENS}
