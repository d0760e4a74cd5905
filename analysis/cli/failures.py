"""``clustersim failures CONFIG``: what failures cost a long job, and which checkpoint interval
and recovery policy to choose."""

from __future__ import annotations

import argparse
from dataclasses import replace

from clustersim.analysis.cli.common import (
    add_catalog_option, add_command, load_checked_config,
    output_file, output_path, positive_int, write_json,
)

SWEEP_SEEDS = 40
PLOT_SWEEP_SEEDS = 20
MAX_SEEDS = 100_000


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "failures", help="failure injection and recovery study over many days",
                    examples=[
        ("clustersim failures failures_llama3_405b --seeds 50",
         "Llama 3 405B on 16,384 H100 for 54 days: interruptions, ETTR, lost time by cause"),
        ("clustersim failures failures_bloom_176b --sweep-interval --plots figures/",
         "the best checkpoint interval of every checkpoint policy, with plots"),
    ])
    p.add_argument("config", help="run config YAML (its `failures:` section sets the policies)")
    p.add_argument("--days", type=float, help="horizon in days (default: failures.days, or 30)")
    p.add_argument("--seeds", type=int, default=200, help="Monte Carlo runs (default 200)")
    p.add_argument("--seed", type=int, help="base seed (default: failures.seed, or 0)")
    p.add_argument("--workers", type=positive_int, help="worker processes (default: all CPUs)")
    p.add_argument("--sweep-interval", action="store_true",
                   help="find the best checkpoint interval of every checkpoint policy "
                        f"(min(seeds, {SWEEP_SEEDS}) seeds per point)")
    p.add_argument("--json", type=output_file, metavar="OUT", help="write the summary as JSON")
    p.add_argument("--events-csv", type=output_file, metavar="OUT",
                   help="write every run's events as CSV")
    p.add_argument("--plots", type=output_path, metavar="DIR", help="write PNG plots into DIR")
    add_catalog_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clustersim.hardware_specs import SpecError
    from clustersim.simulator.longrun.montecarlo import default_workers

    from clustersim.analysis.failures.config import MAX_DAYS, failure_spec
    from clustersim.analysis.failures.report import report, write_events_csv
    from clustersim.analysis.failures.study import prepare, run_study
    from clustersim.analysis.failures.sweep import sweep, sweep_policy

    if not 1 <= args.seeds <= MAX_SEEDS:
        raise SpecError("--seeds", f"expected 1 to {MAX_SEEDS:,}, got {args.seeds}")
    if args.days is not None and not 0 < args.days <= MAX_DAYS:
        raise SpecError("--days", f"expected a number of days above 0 and at most {MAX_DAYS:g}, "
                                  f"got {args.days:g}")
    if args.seed is not None and args.seed < 0:
        raise SpecError("--seed", f"expected an integer >= 0, got {args.seed}")
    config = load_checked_config(args.config, args.catalog)
    spec = failure_spec(config, args.days)
    if args.seed is not None:
        spec = replace(spec, seed=args.seed)
    workers = args.workers or default_workers()
    prepared = prepare(config, spec)
    result = run_study(prepared, args.seeds, workers)
    sweep_result = {}
    if args.sweep_interval:
        sweep_result = sweep(prepared, min(args.seeds, SWEEP_SEEDS), workers)
        result = replace(result, sweep=sweep_result)
    print(report(result))
    if args.json:
        write_json(result.to_dict(), args.json)
        print(f"\nwrote {args.json}")
    if args.events_csv:
        rows = write_events_csv(result, args.events_csv)
        print(f"wrote {args.events_csv} ({rows} events)")
    if args.plots:
        from clustersim.analysis.failures.plots import write_plots
        if not sweep_result and prepared.young_interval_s != float("inf"):
            one = sweep_policy(prepared, min(args.seeds, PLOT_SWEEP_SEEDS), workers)
            sweep_result = {one["policy"]: one}
        for path in write_plots(result, args.plots, sweep_result):
            print(f"wrote {path}")
    return 0
