"""One error sign in every command that holds the simulator against a measurement: prediction
over measurement, in time. ``+10%`` means the simulator predicts 10% more time than was
measured (too slow, i.e. pessimistic); ``-10%`` that it predicts 10% less."""

from __future__ import annotations

ERROR_MEANING = "error = predicted / measured time - 1 (+: the simulator predicts more time)"
"""The line each command prints under its error column."""


def time_error(predicted_s: float, measured_s: float) -> float:
    """Signed relative error of a predicted duration: predicted / measured - 1."""
    return predicted_s / measured_s - 1.0
