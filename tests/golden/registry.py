"""Every golden, by name: the examples' runs, the accuracy tables' validations, the README's
sweep, its calibration table and its trace replays."""

from __future__ import annotations

from tests.golden.calibration import CALIBRATION_RUNS
from tests.golden.examples import RUNS
from tests.golden.sweep import SWEEPS
from tests.golden.traces import TRACE_REPLAYS
from tests.golden.validation import VALIDATIONS

GOLDENS = (*RUNS, *VALIDATIONS, *SWEEPS, *CALIBRATION_RUNS, *TRACE_REPLAYS)
BY_NAME = {golden.name: golden for golden in GOLDENS}
