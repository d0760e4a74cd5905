"""Reading plain YAML mappings into typed values, with the field's dotted path in every error.

One small reader serves the hardware catalog, the model and strategy specs and the run config,
so that all of them reject unknown keys and wrong types the same way.
"""

from __future__ import annotations

import difflib
import enum
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from clustersim.hardware_specs import units
from clustersim.hardware_specs.errors import SpecError, shown

E = TypeVar("E", bound=enum.Enum)
T = TypeVar("T")

LARGEST_INTEGER = 2**53
"""No count a user writes (layers, GPUs, batch, steps) comes near it; it is also the largest
integer a float holds exactly, so every integer read can be used in float arithmetic."""

MISSING = object()
"""Default meaning "the field is required"."""
_MISSING = MISSING


class Fields:
    """A mapping being read at ``path``; call :meth:`done` to reject keys nobody read."""

    def __init__(self, data: object, path: str = ""):
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise SpecError(path, f"expected a mapping, got {type(data).__name__} {shown(data)}")
        self.data: Mapping[str, Any] = data
        self.path = path
        self._read: set[str] = set()

    def at(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: object = _MISSING) -> Any:
        self._read.add(key)
        if key not in self.data or self.data[key] is None:
            if default is _MISSING:
                raise SpecError(self.at(key), "is required")
            return default
        return self.data[key]

    def sub(self, key: str, required: bool = False) -> "Fields":
        value = self.raw(key, _MISSING if required else {})
        return Fields(value, self.at(key))

    def text(self, key: str, default: object = _MISSING) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise SpecError(self.at(key), f"expected text, got {shown(value)}")
        return value

    def integer(self, key: str, default: object = _MISSING, minimum: int | None = None,
                maximum: int | None = None) -> int:
        value = whole_number(self.raw(key, default), self.at(key))
        if minimum is not None and value < minimum:
            raise SpecError(self.at(key), f"expected an integer >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise SpecError(self.at(key), f"expected an integer <= {maximum:,}, got {value:,}")
        return value

    def number(self, key: str, default: object = _MISSING, minimum: float | None = None,
               maximum: float | None = None) -> float:
        value = self.raw(key, default)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or isinstance(value, int) and abs(value) > 1e300     # an int past a float
                or not math.isfinite(value)):
            raise SpecError(self.at(key), f"expected a finite number, got {shown(value)}")
        value = float(value)
        if minimum is not None and value < minimum:
            raise SpecError(self.at(key), f"expected a number >= {minimum:g}, got {value:g}")
        if maximum is not None and value > maximum:
            raise SpecError(self.at(key), f"expected a number <= {maximum:g}, got {value:g}")
        return value

    def quantity(self, key: str, kind: units.Quantity, default: object = _MISSING,
                 positive: bool = True) -> float:
        value = self.raw(key, default)
        parsed = units.parse(value, kind, self.at(key))
        if positive and parsed <= 0:
            raise SpecError(self.at(key), f"expected a positive quantity, got {shown(value)}")
        if parsed < 0:
            raise SpecError(self.at(key), f"expected a quantity >= 0, got {shown(value)}")
        return parsed

    def boolean(self, key: str, default: object = _MISSING) -> bool:
        value = self.raw(key, default)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise SpecError(self.at(key), f"expected true or false, got {shown(value)}")
        return value

    def choice(self, key: str, enum_type: type[E], default: object = _MISSING) -> E:
        value = self.raw(key, default)
        if isinstance(value, enum_type):
            return value
        return parse_enum(enum_type, value, self.at(key))

    def integers(self, key: str, default: object = _MISSING, minimum: int | None = None,
                 maximum: int | None = None) -> list[int]:
        """A list of integers; a bad entry is named by its index (``key[2]``)."""
        entries = Fields(dict(enumerate(self.items(key, default))), self.at(key))
        return [entries.integer(i, minimum=minimum, maximum=maximum)
                for i in range(len(entries.data))]

    def items(self, key: str, default: object = _MISSING) -> list[Any]:
        value = self.raw(key, default)
        if not isinstance(value, list):
            raise SpecError(self.at(key), f"expected a list, got {shown(value)}")
        return value

    def mapping(self, key: str, read: Callable[["Fields"], T]) -> dict[str, T]:
        """Read ``{name: spec}``: every value through ``read``."""
        section = self.sub(key)
        out = {}
        for name in section.data:
            out[str(name)] = read(section.sub(str(name), required=True))
        section.done()
        return out

    def only(self, allowed) -> "Fields":
        """Reject unknown keys up front (before a missing required one is reported)."""
        unknown = sorted(set(map(str, self.data)) - set(allowed))
        if unknown:
            close = close_names(unknown[0], allowed, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise SpecError(self.at(unknown[0]), f"unknown field{hint} (expected one of: "
                            f"{', '.join(sorted(allowed))})")
        return self

    def done(self) -> None:
        given = {str(k) for k, v in self.data.items() if v is not None}   # null = not given
        unknown = sorted(given - self._read)
        if unknown:
            known = ", ".join(sorted(self._read)) or "none"
            raise SpecError(self.at(unknown[0]), f"unknown field; expected one of: {known}")


def close_names(name: str, choices, n: int = 3) -> list[str]:
    """The choices a user probably meant by ``name``: the same name in other case or punctuation
    alone (``H200`` -> ``h200``, ``llama-3-8b`` -> ``llama3-8b``), else the names it begins
    (``H100`` -> ``h100-sxm``, ...) and difflib's close matches."""
    def plain(text: str) -> str:
        return "".join(c for c in str(text).lower() if c.isalnum())
    key, names = plain(name), [str(c) for c in choices]
    found = [c for c in names if plain(c) == key]
    if found:
        return found[:n]
    found += [c for c in names if key and plain(c).startswith(key) and c not in found]
    by_plain = {plain(c): c for c in names}
    found += [by_plain[m] for m in difflib.get_close_matches(key, list(by_plain), n=n)
              if by_plain[m] not in found]
    return found[:n]


def did_you_mean(name: str, choices) -> str:
    """``"; did you mean a, b?"`` (or nothing) for an error message."""
    close = close_names(name, choices)
    return f"; did you mean {', '.join(close)}?" if close else ""


def whole_number(value: object, field: str, words: str = "an integer") -> int:
    """``value`` as an int: an int, or a float without fraction, of at most 2**53 (a bool is
    not a number; an int too large for a float is refused before any float arithmetic)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise SpecError(field, f"expected {words}, got {shown(value)}")
    if abs(value) > LARGEST_INTEGER:
        raise SpecError(field, f"expected {words} of at most 2**53, got {shown(value)}")
    return int(value)


def parse_enum(enum_type: type[E], value: object, field: str) -> E:
    """``'1f1b'`` -> ``Schedule.ONE_F_ONE_B``; the error lists the accepted values."""
    for member in enum_type:
        if value == member.value or (isinstance(value, str) and str(member.value) == value.lower()):
            return member
    accepted = "|".join(str(m.value) for m in enum_type)
    raise SpecError(field, f"expected one of {accepted}, got {shown(value)}")
