"""The only unit parser: ``900 GB/s``, ``989 TFLOPS``, ``80 GiB``, ``2 us``, ``400 Gb/s`` -> SI floats.

Inside clustersim every quantity is in SI base units (bytes, seconds, FLOP/s, bytes/s, watts);
strings with units appear only in YAML and on the command line and are converted here, once.
Decimal prefixes are powers of 1000 and binary ones (KiB, GiB) powers of 1024, as in IEC 80000-13.
"""

from __future__ import annotations

import enum
import math
import re

from clustersim.hardware_specs.errors import SpecError, shown


class Quantity(enum.Enum):
    """What a number measures; picks the units a string may carry."""

    BYTES = "bytes"
    BANDWIDTH = "bytes/s"
    FLOPS = "FLOP/s"
    TIME = "seconds"
    POWER = "watts"
    COUNT = "count"


_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_TIME = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0,
    "min": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0, "d": 86400.0, "day": 86400.0,
    "days": 86400.0, "week": 604800.0, "weeks": 604800.0,
}

_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_PATTERN = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-zµ/]*)\s*$")


def _prefix_scale(prefix: str) -> float | None:
    if prefix in _BINARY:
        return _BINARY[prefix]
    return _DECIMAL.get(prefix)


def _scale(unit: str, kind: Quantity) -> float | None:
    """Factor from ``unit`` to the SI base unit of ``kind``; None if the unit does not fit."""
    if kind is Quantity.TIME:
        return _TIME.get(unit)
    if kind is Quantity.COUNT:
        return _DECIMAL.get(unit)
    if kind is Quantity.POWER:
        return _prefix_scale(unit[:-1]) if unit.endswith("W") else None
    if kind is Quantity.FLOPS:
        for suffix in ("FLOPS", "FLOP/s", "flops", "FLOPs"):
            if unit.endswith(suffix):
                return _prefix_scale(unit[: -len(suffix)])
        return None
    if kind is Quantity.BYTES:
        return _prefix_scale(unit[:-1]) if unit.endswith("B") else None
    if kind is Quantity.BANDWIDTH:
        if unit.endswith("B/s"):
            return _prefix_scale(unit[:-3])
        if unit.endswith("b/s") or unit.endswith("bps"):
            scale = _prefix_scale(unit[:-3])
            return None if scale is None else scale / 8.0
        return None
    return None


_EXAMPLES = {
    Quantity.BYTES: "80 GiB, 50 MB or a number of bytes",
    Quantity.BANDWIDTH: "900 GB/s, 400 Gb/s or a number of bytes/s",
    Quantity.FLOPS: "989 TFLOPS or a number of FLOP/s",
    Quantity.TIME: "2 us, 30 min, 3 h or a number of seconds",
    Quantity.POWER: "700 W or a number of watts",
    Quantity.COUNT: "a number",
}


def parse(value: object, kind: Quantity, field: str = "") -> float:
    """Convert ``value`` (a number in SI units, or a string with a unit) to a float in SI units."""
    if isinstance(value, bool):
        raise SpecError(field, f"expected {_EXAMPLES[kind]}, got {shown(value)}")
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        match = _PATTERN.match(value)
        if match:
            number, unit = float(match.group(1)), match.group(2)
            scale = 1.0 if unit == "" else _scale(unit, kind)
            if scale is not None and math.isfinite(number * scale):
                return number * scale
    raise SpecError(field, f"expected {_EXAMPLES[kind]}, got {shown(value)}")


def format_bytes(value: float) -> str:
    """``85899345920`` -> ``80.0 GiB`` (binary units, as memory is sold and reported)."""
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def format_rate(value: float, unit: str) -> str:
    """``9.89e14, 'FLOP/s'`` -> ``989 TFLOP/s`` (decimal prefixes)."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def format_time(seconds: float) -> str:
    """A duration in the unit that reads best."""
    if seconds >= 86400:
        return f"{seconds / 86400:.2f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"
