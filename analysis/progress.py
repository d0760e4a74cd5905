"""Progress of a long command on stderr, wherever stderr goes: a bar on a terminal, and a plain
line every few seconds into a file or a pipe (a log of a 20-minute sweep shows it is alive and
how far it got), never on stdout, which carries the results."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

LINE_EVERY_S = 10.0
"""Seconds between two progress lines when stderr is not a terminal."""


class LineProgress:
    """``label: 120/540 points (22%), 35 s, about 2 min left`` every ``every_s`` seconds and
    once at the end of a run that lasted that long."""

    def __init__(self, total: int, label: str, unit: str, stream: TextIO,
                 every_s: float = LINE_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.total, self.label, self.unit, self.stream = total, label, unit, stream
        self.every_s, self.clock = every_s, clock
        self.done = 0
        self.start = self.last = clock()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.every_s and self.done < self.total:
            self.last = now
            self._line(now)

    def close(self) -> None:
        """The last line, for a run long enough to have needed one (a quick run stays quiet,
        so its one-line error stays one line)."""
        now = self.clock()
        if self.total and (self.last > self.start or now - self.start >= self.every_s):
            self._line(now)

    def _line(self, now: float) -> None:
        elapsed = now - self.start
        text = (f"{self.label}: {self.done}/{self.total} {self.unit}s "
                f"({100 * self.done / self.total:.0f}%), {_duration(elapsed)}")
        if 0 < self.done < self.total:
            text += f", about {_duration(elapsed * (self.total - self.done) / self.done)} left"
        print(text, file=self.stream, flush=True)


class NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int, label: str, unit: str, enabled: bool | None = None,
             stream: TextIO | None = None):
    """What a command shows while it works: nothing when ``enabled`` is False; otherwise a tqdm
    bar when ``stream`` (stderr) is a terminal, progress lines when it is not."""
    stream = stream or sys.stderr
    if enabled is False:
        return NoProgress()
    if stream.isatty():
        from tqdm import tqdm
        return tqdm(total=total, desc=label, unit=unit, file=stream, dynamic_ncols=True)
    return LineProgress(total, label, unit, stream, every_s=LINE_EVERY_S)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
