"""How much of the host other processes used while we measured.

On a shared machine another job can take a core in the middle of a measurement and slow it by
tens of percent. The host's busy CPU time (``/proc/stat``: user, nice, system, irq, softirq and
steal, the last being time the hypervisor gave to other guests) less the CPU time of our own
processes, over the wall time, is the load of everything else, in cores. Measurements carry
it so that a report can say under which conditions they were taken. Linux only; elsewhere the
load is unknown (None).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""user, nice, system, irq, softirq, steal in the ``cpu`` line of /proc/stat."""


def host_busy_s() -> float | None:
    """CPU-seconds the whole host has been busy since boot, or None where unknown."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    ticks = sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU-seconds of this process (all its threads) and of its children that have exited."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@dataclass(slots=True)
class LoadMeter:
    """Started at construction; ``foreign_cores()`` is the mean load of other processes since.

    ``own`` adds CPU time of ours that this process cannot see (other ranks' processes that
    are still running)."""

    wall: float = 0.0
    busy: float | None = None
    cpu: float = 0.0

    def __post_init__(self) -> None:
        self.wall, self.busy, self.cpu = time.perf_counter(), host_busy_s(), own_cpu_s()

    def foreign_cores(self, own: float = 0.0) -> float | None:
        busy = host_busy_s()
        wall = time.perf_counter() - self.wall
        if busy is None or self.busy is None or wall <= 0:
            return None
        mine = own_cpu_s() - self.cpu + own
        return max(0.0, (busy - self.busy - mine) / wall)
