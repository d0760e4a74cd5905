"""What a replay leaves behind: plain records of who did what when, per rank class.

The engine (``engine.py``) writes them and knows nothing of breakdowns or metrics; attribution
(``attribution.py``) and the step summary (``summary.py``) read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from clustersim.simulator.classes import RankClass


class OpRecord(NamedTuple):
    """One op's execution on one rank class. A named tuple, not a dataclass: a replay makes one
    per op (26,512 for Llama-3-405B on 16,384 GPUs), and a frozen dataclass's ``__init__``
    was 8% of that step's simulation."""

    rank_class: int
    op_id: int
    name: str
    stream: str
    start: float
    end: float
    category: str
    """compute phase (forward/backward/recompute/optimizer) or communication axis."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ClassTimeline:
    """Every op of one rank class's program, indexed by op id."""

    rank_class: RankClass
    ready_s: tuple[float, ...]
    """When each op could start: its deps and its stream predecessor were done."""
    end_s: tuple[float, ...]
    stream_predecessor: tuple[int, ...]
    """The op before it on its stream (-1: the first, or an op of the unordered pp stream)."""
    send_posted_s: Mapping[int, float]
    """recv op id -> when the matching send was posted (waiting before that is bubble)."""
    records: tuple[OpRecord, ...]
    """Ops in the order they finished: compute ops always, every op when recording."""

    @property
    def finish_s(self) -> float:
        return max(self.end_s) if self.end_s else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Replay:
    """A step replayed on a cluster: one timeline per rank class."""

    timelines: tuple[ClassTimeline, ...]
    class_of: np.ndarray
    """rank -> index of its rank class."""
    events: int
    """SimPy events processed."""
    wall_time_s: float
    rank_finish_s: np.ndarray | None = None
    """rank -> when it finished its last op (expanded replays, which follow every rank)."""
