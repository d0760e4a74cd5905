"""``clustersim sweep CONFIG --out DIR``: rank every strategy of a model on a cluster."""

from __future__ import annotations

import argparse

from clustersim.analysis.cli.common import (
    add_catalog_option, add_command, add_parallel_options, check_sections, output_path,
    positive_int,
)

TOP = 15


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "sweep", help="simulate every valid strategy and rank them", examples=[
        ("clustersim sweep llama3_8b_fsdp --out runs/llama8b --workers 2",
         "rank the strategies of a bundled example; rerun the same line to resume"),
        ("clustersim report runs/llama8b --out runs/llama8b.html", "then render the report"),
    ])
    p.add_argument("config", help="run config YAML (its strategy is the base; a `sweep:` "
                                  "section narrows or widens the space)")
    p.add_argument("--out", type=output_path, required=True, metavar="DIR",
                   help="results folder; rerunning with it resumes without recomputing")
    p.add_argument("--top", type=positive_int, default=TOP, metavar="K",
                   help=f"rows to print ({TOP})")
    add_parallel_options(p)
    add_catalog_option(p)
    p.set_defaults(func=run)


def ranking_table(frame, top: int) -> str:
    from clustersim.analysis.sweeps.ranking import ranking_rows
    from clustersim.analysis.tables import render
    return render(*ranking_rows(frame, top))


def run(args: argparse.Namespace) -> int:
    from clustersim.analysis.sweeps.ranking import ranking, write_ranking
    from clustersim.analysis.sweeps.runner import load_for_sweep, run_sweep

    loaded = load_for_sweep(args.config, args.catalog)
    check_sections(loaded.config)
    outcome = run_sweep(loaded, args.out, workers=args.workers, dask_address=args.dask,
                        progress=args.progress)
    s = outcome.by_status
    print(f"{loaded.config.name}: {outcome.candidates} strategies enumerated: "
          f"{s.get('invalid', 0)} do not divide, {s.get('does_not_fit', 0)} do not fit in "
          f"memory, {s.get('dominated', 0)} dominated, {s.get('simulate', 0)} simulated "
          f"({outcome.reused} reused from {args.out}, {outcome.simulated} now"
          f"{f', {outcome.errors} failed' if outcome.errors else ''}) in {outcome.wall_s:.1f} s")
    frame = ranking(args.out, loaded.config)
    if frame.empty:
        print(f"nothing to rank: {outcome.why_nothing_ranked()}")
        return 0
    path = write_ranking(args.out, frame)
    print()
    print(ranking_table(frame, args.top))
    print(f"\nwrote {path} ({len(frame)} ranked); `clustersim report {args.out}` makes the report")
    return 0
