"""The ``clustersim`` entry point: the parser of every command, and the one place that turns
errors into exit statuses (a bad input is status 2, never a traceback)."""

from __future__ import annotations

import argparse
import os
import sys

from clustersim import __version__
from clustersim.hardware_specs import SpecError

from clustersim.analysis.cli import (
    calibrate, collective, compare, failures, hardware, plan, report, simulate, sweep, trace,
    validate,
)

COMMANDS = (simulate, sweep, compare, plan, failures, report, collective, hardware, validate,
            calibrate, trace)
"""Command modules, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clustersim",
        description="Discrete-event simulator of GPU training clusters: step time, memory, "
                    "failures and strategy comparisons.")
    parser.add_argument("--version", action="version", version=f"clustersim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``clustersim ... | head``): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:
        # An output path that cannot be written (what was computed is already printed).
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
