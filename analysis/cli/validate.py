"""``clustersim validate --runs FILE.csv``: replay published runs and compare step times."""

from __future__ import annotations

import sys
from pathlib import Path

from clustersim.analysis.cli.common import (
    add_catalog_option, add_command, add_progress_option, output_file, write_json,
)
from clustersim.analysis.validation.published import render_outcomes, summarize, validate_rows


def register(sub) -> None:
    p = add_command(sub, "validate", help="compare predictions with published runs", examples=[
        ("clustersim validate --runs analysis/data/published_runs_dev.csv --json dev.json",
         "replay the published runs of a table (in a clone of the repository) and print the "
         "error of each, prediction over measurement"),
    ])
    p.add_argument("--runs", required=True, metavar="FILE.csv", help="published-runs table")
    p.add_argument("--json", type=output_file, metavar="OUT", help="write rows and summary as JSON")
    add_progress_option(p)
    add_catalog_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from clustersim.hardware_specs import load_catalog

    outcomes = validate_rows(Path(args.runs), load_catalog(args.catalog),
                             progress=args.progress)
    print(render_outcomes(outcomes))
    summary = summarize(outcomes)
    if args.json:
        write_json({"summary": summary.to_dict(), "rows": [o.to_dict() for o in outcomes]},
                   args.json)
        print(f"\nwrote {args.json}")
    if not summary.compared:
        print("error: --runs: no run could be compared (see the notes above)", file=sys.stderr)
        return 2
    return 0
