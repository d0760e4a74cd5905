"""The one error type for bad user input, carried from the YAML edge to the CLI.

Every layer raises it with the dotted path of the offending field, so the CLI can print
``error: strategy.tp: 7 does not divide model.heads=64`` and exit with status 2.
"""

from __future__ import annotations


class SpecError(ValueError):
    """A user-supplied value is wrong; ``field`` is its dotted path (may be empty)."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)

    def under(self, prefix: str) -> "SpecError":
        """The same error, with its field path placed under ``prefix``."""
        if not prefix:
            return self
        return SpecError(f"{prefix}.{self.field}" if self.field else prefix, self.message)
