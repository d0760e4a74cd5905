"""Compute and communication that share a device slow each other down.

A collective kernel and a GEMM compete for SMs and HBM bandwidth: vTrain (MICRO'24) measured NCCL
about 30% slower inside training than alone, and the GEMMs lose time too. Two calibrated
fractions model it: a transfer that starts while its ranks compute takes ``1 + comm`` times its
bandwidth time; compute that runs while a transfer of its rank moves data runs ``1 + compute``
times slower for the overlapping part only, whichever of the two started first.

A communication kernel that holds SMs for as long as it runs (DeepEP's and HybridEP's dispatch
and combine, launched on a fixed number of SMs: Megatron-Core ``moe_deepep_num_sms``,
``moe_hybridep_num_sms``) leaves compute the rest: a GEMM's thread blocks then run on
``sms - held`` SMs, so compute that overlaps it takes ``sms / (sms - held)`` times as long
(:func:`sm_share_slowdown`), on top of the calibrated fractions.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.hardware_specs import DeviceSpec, SpecError


def sm_share_slowdown(held_sms: int, device_sms: int) -> float:
    """Extra fraction of time compute takes while a communication kernel holds ``held_sms`` of
    the device's ``device_sms``: the compute kernels' thread blocks have ``device_sms -
    held_sms`` SMs left, and a compute-bound kernel's time goes as the inverse of its SMs."""
    if not held_sms:
        return 0.0
    if held_sms >= device_sms:
        raise SpecError("strategy.ep_dispatcher_sms", f"{held_sms} SMs for the dispatcher leave "
                        f"none of the device's {device_sms} to compute")
    return held_sms / (device_sms - held_sms)


def stretch(slowdown: float, compute_s: float, window_s: float) -> float:
    """Extra time of ``compute_s`` of compute that runs ``1 + slowdown`` times slower while a
    transfer moves data for the next ``window_s``: the overlap stretches, the rest does not."""
    if window_s <= 0 or not slowdown:
        return 0.0
    return slowdown * min(compute_s, window_s / (1.0 + slowdown))


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
        slower while a transfer moves data for the next ``window_s``."""
        return stretch(self.compute_slowdown, compute_s, window_s)


class DeviceActivity:
    """What one rank class's device is doing now, as far as interference cares."""

    __slots__ = ("model", "compute_busy_until", "transfers", "transfer_busy_until", "debt",
                 "holding")

    def __init__(self, model: Interference):
        self.model = model
        self.compute_busy_until = 0.0
        self.transfers = 0
        """Transfers in flight."""
        self.transfer_busy_until = 0.0
        """When the transfers in flight are expected to end (their uncontended times)."""
        self.debt = 0.0
        """Time the running compute op owes to transfers that started while it ran."""
        self.holding: list[tuple[float, float]] = []
        """(SM-share slowdown, expected end) of the transfers in flight that hold SMs."""

    def computing(self, now: float) -> bool:
        return self.compute_busy_until > now

    def start_compute(self, now: float, alone_s: float) -> float:
        """A compute op of ``alone_s`` starts: its duration with the transfers in flight."""
        duration = alone_s
        if self.transfers:
            duration += self.model.penalty(duration, self.transfer_busy_until - now)
        if self.holding:
            held, until = max(self.holding)
            duration += stretch(held, alone_s, until - now)
        self.compute_busy_until = now + duration
        return duration

    def take_debt(self) -> float:
        """Time the compute op must still run for transfers that started while it ran."""
        debt, self.debt = self.debt, 0.0
        self.compute_busy_until += debt
        return debt

    def start_transfer(self, now: float, expected_s: float, held: float = 0.0) -> None:
        """A transfer expected to move data for ``expected_s`` (0: not tracked) starts; its
        kernels' SMs slow compute by ``held`` (``sm_share_slowdown``)."""
        self.transfers += 1
        if held:
            self.holding.append((held, now + expected_s))
        if expected_s:
            self.transfer_busy_until = max(self.transfer_busy_until, now + expected_s)
            if self.compute_busy_until > now:
                left = self.compute_busy_until - now
                self.debt += (self.model.penalty(left, expected_s)
                              + stretch(held, left, expected_s))

    def end_transfer(self, held: float = 0.0) -> None:
        self.transfers -= 1
        if held:
            self.holding.remove(next(h for h in self.holding if h[0] == held))
