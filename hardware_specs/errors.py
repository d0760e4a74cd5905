"""The one error type for bad user input, carried from the YAML edge to the CLI.

Every layer raises it with the dotted path of the offending field, so the CLI can print
``error: strategy.tp: 7 does not divide model.heads=64`` and exit with status 2.
"""

from __future__ import annotations

import reprlib

_SHOWN = reprlib.Repr()
(_SHOWN.maxlevel, _SHOWN.maxdict, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxset,
 _SHOWN.maxstring, _SHOWN.maxlong, _SHOWN.maxother) = (3, 4, 4, 4, 4, 60, 40, 60)


def shown(value: object) -> str:
    """``repr(value)`` cut to a line: an error message never spells out an unbounded value (a
    YAML alias bomb, a 10,000-digit integer, a megabyte string)."""
    try:
        text = _SHOWN.repr(value)
    except (ValueError, RecursionError):   # an int past Python's digit limit; a cycle
        return f"<{type(value).__name__}>"
    return text if len(text) <= 100 else text[:96] + " ..."


class SpecError(ValueError):
    """A user-supplied value is wrong; ``field`` is its dotted path (may be empty).

    ``args`` is ``(field, message)``, so the error survives being rebuilt from its args, as
    SimPy does when a process fails (``type(err)(*err.args)``) and as pickling across worker
    processes does."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(field, message)

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message

    def under(self, prefix: str) -> "SpecError":
        """The same error, with its field path placed under ``prefix``."""
        if not prefix:
            return self
        return SpecError(f"{prefix}.{self.field}" if self.field else prefix, self.message)
