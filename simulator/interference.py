"""Compute and communication that share a device slow each other down.

A collective kernel and a GEMM compete for SMs and HBM bandwidth: vTrain (MICRO'24) measured NCCL
about 30% slower inside training than alone, and the GEMMs lose time too. Two calibrated
fractions model it: a transfer that starts while its ranks compute takes ``1 + comm`` times its
bandwidth time; compute that runs while a transfer of its rank moves data runs ``1 + compute``
times slower for the overlapping part only, whichever of the two started first.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.hardware_specs import DeviceSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Interference:
    comm_slowdown: float
    """Extra fraction of bandwidth time of a transfer that starts while compute runs."""
    compute_slowdown: float
    """Extra fraction of compute time while a transfer of the same rank moves data."""

    @classmethod
    def of(cls, device: DeviceSpec, comm: float | None = None,
           compute: float | None = None) -> Interference:
        """The given fractions, or the device's own where None."""
        eff = device.efficiency
        return cls(comm_slowdown=eff.comm_slowdown_when_overlapped if comm is None else comm,
                   compute_slowdown=(eff.compute_slowdown_when_overlapped if compute is None
                                     else compute))

    @property
    def any(self) -> bool:
        return bool(self.comm_slowdown or self.compute_slowdown)

    def penalty(self, compute_s: float, window_s: float) -> float:
        """Extra time of ``compute_s`` of compute that runs ``1 + compute_slowdown`` times
        slower while a transfer moves data for the next ``window_s``: the overlap stretches,
        the rest does not."""
        if window_s <= 0:
            return 0.0
        slowdown = self.compute_slowdown
        return slowdown * min(compute_s, window_s / (1.0 + slowdown))


class DeviceActivity:
    """What one rank class's device is doing now, as far as interference cares."""

    __slots__ = ("model", "compute_busy_until", "transfers", "transfer_busy_until", "debt")

    def __init__(self, model: Interference):
        self.model = model
        self.compute_busy_until = 0.0
        self.transfers = 0
        """Transfers in flight."""
        self.transfer_busy_until = 0.0
        """When the transfers in flight are expected to end (their uncontended times)."""
        self.debt = 0.0
        """Time the running compute op owes to transfers that started while it ran."""

    def computing(self, now: float) -> bool:
        return self.compute_busy_until > now

    def start_compute(self, now: float, alone_s: float) -> float:
        """A compute op of ``alone_s`` starts: its duration with the transfers in flight."""
        duration = alone_s
        if self.transfers and self.model.compute_slowdown:
            duration += self.model.penalty(duration, self.transfer_busy_until - now)
        self.compute_busy_until = now + duration
        return duration

    def take_debt(self) -> float:
        """Time the compute op must still run for transfers that started while it ran."""
        debt, self.debt = self.debt, 0.0
        self.compute_busy_until += debt
        return debt

    def start_transfer(self, now: float, expected_s: float) -> None:
        """A transfer expected to move data for ``expected_s`` (0: not tracked) starts."""
        self.transfers += 1
        if expected_s:
            self.transfer_busy_until = max(self.transfer_busy_until, now + expected_s)
            if self.compute_busy_until > now:
                self.debt += self.model.penalty(self.compute_busy_until - now, expected_s)

    def end_transfer(self) -> None:
        self.transfers -= 1
