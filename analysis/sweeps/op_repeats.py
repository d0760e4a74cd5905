"""Whether a replay's ops repeat a period: the checks behind a pipeline's steady state.

Op end times of one or two replays (``steady_state``) compared a period of ops apart, within
the rounding of floats summed in another order.
"""

from __future__ import annotations

import numpy as np

from clustersim.simulator import Replay

OP_TOLERANCE_S = 1e-9
"""Rounding allowed when two replays' op times are compared (sums of floats in another order)."""


def settled_share(replay: Replay, lags: tuple[int, ...]) -> float:
    """The share of ``replay``'s classes that have settled: whose longest stretch of ops that
    each end the same time after the same op a period before lasts two periods or more, and
    that time is the longest of any class's (``lags``: each class's ops per period). A stage
    still settling may repeat itself at a shorter period until its slack is used up (GPT-3
    175B, TP16 1F1B on A100: 13 us a micro-batch faster), so a repeat alone does not show it
    settled."""
    repeats = [longest_repeat(np.asarray(tl.end_s), lag)
               for tl, lag in zip(replay.timelines, lags, strict=True)]
    known = [r for r in repeats if r is not None]
    if not known:
        return 0.0
    period = max(known)
    return sum(abs(r - period) <= OP_TOLERANCE_S for r in known) / len(repeats)


def longest_repeat(end: np.ndarray, lag: int) -> float | None:
    """How long after the same op ``lag`` ops before each op ends, over the longest stretch
    where that stays the same (None: no stretch of two periods of ops)."""
    if lag <= 0 or len(end) < 3 * lag:
        return None
    repeat = end[lag:] - end[:-lag]
    steady = np.abs(np.diff(repeat)) <= OP_TOLERANCE_S
    edges = np.flatnonzero(np.diff(np.concatenate(([0], steady.astype(np.int8), [0]))))
    if not len(edges):
        return None
    runs = edges[1::2] - edges[::2]
    longest = int(np.argmax(runs))
    return float(repeat[edges[2 * longest]]) if runs[longest] >= lag else None


def inserted_round(shorter: Replay, longer: Replay, growth_s: float) -> bool:
    """Whether ``longer`` is ``shorter`` with one round inserted: in every rank class, each op
    ends at the same time as in ``shorter`` up to some op, and ``growth_s`` later from there to
    the end, the ops counted from the end. (When an op could start says less: a receive is
    posted at the start of the step.)"""
    for a, b in zip(shorter.timelines, longer.timelines, strict=True):
        end, later = np.asarray(a.end_s), np.asarray(b.end_s)
        n, extra = len(end), len(later) - len(end)
        if extra <= 0:
            return False
        same = np.abs(later[:n] - end) <= OP_TOLERANCE_S
        shifted = np.abs(later[extra:] - end - growth_s) <= OP_TOLERANCE_S
        if leading(same) + leading(shifted[::-1]) < n:
            return False
    return True


def leading(ok: np.ndarray) -> int:
    """How many of ``ok`` are true before the first false."""
    misses = np.flatnonzero(~ok)
    return int(misses[0]) if len(misses) else len(ok)


def settled_round(shorter: Replay, longer: Replay, growth_s: float) -> bool:
    """In every class of ``longer`` (``shorter`` with a period inserted, :func:`inserted_round`),
    the ops of the period after the point where it parts from ``shorter`` each end ``growth_s``
    after the same op a period before: the state the inserted period leaves is the one it
    found, shifted, so a longer step inserts the same period again. This stands for a third
    step one period further."""
    for a, b in zip(shorter.timelines, longer.timelines, strict=True):
        end, later = np.asarray(a.end_s), np.asarray(b.end_s)
        lag = len(later) - len(end)
        parted = leading(np.abs(later[:len(end)] - end) <= OP_TOLERANCE_S)
        if lag <= 0 or parted < lag or parted + lag > len(later):
            return False
        window = later[parted:parted + lag] - later[parted - lag:parted]
        if not np.all(np.abs(window - growth_s) <= OP_TOLERANCE_S):
            return False
    return True
