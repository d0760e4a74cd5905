"""Rerun the examples, rewrite their goldens and the README's marked numbers.

    python -m tests.golden.regenerate              # every golden (about 15 minutes on 2 cores)
    python -m tests.golden.regenerate moe_fabric_contention validate_dev ...
    python -m tests.golden.regenerate --readme     # only rewrite README numbers from the goldens

Run it after a change that moves a number on purpose, then read the diff: every number that
changed is in it.
"""

from __future__ import annotations

import argparse
import sys

from tests.golden.registry import BY_NAME, GOLDENS
from tests.golden.readme import README, goldens, rendered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.golden.regenerate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", nargs="*", choices=[[]] + sorted(BY_NAME), metavar="GOLDEN",
                        help=f"goldens to rerun (default: all): {', '.join(sorted(BY_NAME))}")
    parser.add_argument("--readme", action="store_true", help="only rewrite the README numbers")
    args = parser.parse_args(argv)
    if not args.readme:
        for run in [BY_NAME[n] for n in args.examples] or GOLDENS:
            print(f"clustersim {' '.join(run.args)}", file=sys.stderr)
            run.write()
    text = README.read_text()
    new = rendered(text, goldens())
    if new != text:
        README.write_text(new)
        print("README.md: numbers rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
