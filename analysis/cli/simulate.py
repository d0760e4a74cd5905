"""``clustersim simulate CONFIG``: one training step, its breakdown and memory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clustersim.analysis.cli.common import (
    add_catalog_option, add_command, load_checked_config, output_file, write_json,
)

DEFAULT_EXAMPLE = "llama3_70b_h100"
EXIT_DOES_NOT_FIT = 3
"""Exit status of a step that does not fit in memory (2 is a bad input, 0 a step that runs)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "simulate", help="simulate one training step of a config", examples=[
        ("clustersim simulate", f"the bundled {DEFAULT_EXAMPLE} example: step time, breakdown, memory"),
        ("clustersim simulate my_job.yaml --json step.json --trace step.trace.json",
         "your config; the result as JSON and a timeline to open in https://ui.perfetto.dev"),
        ("clustersim simulate shared_fabric_4to1",
         "two jobs on one 4:1 fabric: each one's step together and alone, the busiest links"),
    ])
    p.add_argument("config", nargs="?", help="run config YAML, or a bundled example's name "
                        f"(default: {DEFAULT_EXAMPLE})")
    p.add_argument("--json", type=output_file, metavar="OUT", help="write the result as JSON")
    p.add_argument("--trace", type=output_file, metavar="OUT",
                   help="write a Chrome/Perfetto trace JSON")
    p.add_argument("--allow-oom", action="store_true",
                   help=f"exit 0 even when the config does not fit in GPU memory (default: exit "
                        f"{EXIT_DOES_NOT_FIT} after printing the result)")
    p.add_argument("--no-limit", action="store_true",
                   help="run even a step over the work budget (about a minute of engine time)")
    add_catalog_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clustersim.analysis.chrome_trace import write_chrome_trace
    from clustersim.analysis.reports.summary import summary
    from clustersim.analysis.step import fault_summary, run_faulted_step, run_step, step_faults

    from clustersim.analysis.cli.trace import simulate_trace_workload
    if simulate_trace_workload(args):    # the config's workload is a recorded trace
        return 0
    from clustersim.analysis.config import config_path, load_cnn_config, read_yaml
    from clustersim.analysis.reports.summary import cnn_summary
    from clustersim.analysis.step import run_cnn_step
    from clustersim.analysis.sweeps.costs import cost_record, cost_summary, costs_for
    from clustersim.analysis.sweeps.shared_fabric import is_shared
    from clustersim.workloads.cnn.job import is_cnn_model
    path = config_path(args.config or DEFAULT_EXAMPLE)
    data = read_yaml(path) if path.exists() else {}
    if is_shared(data):                                 # several jobs on one cluster
        return run_shared_cluster(args, path)
    if is_cnn_model(data.get("model")):                 # a 3D CNN's layer list or preset
        config = load_cnn_config(path, args.catalog)
        report, faults, faulted, costs = run_cnn_step(config), None, None, None
        print(cnn_summary(report))
    else:
        config = load_checked_config(args.config or DEFAULT_EXAMPLE, args.catalog)
        faults = step_faults(config)
        if faults is None:
            report, faulted = run_step(config, limit=not args.no_limit), None
        else:
            report, faulted = run_faulted_step(config, faults, limit=not args.no_limit)
        print(summary(report))
        costs = costs_for(config.sections.get("costs"), config.cluster, config.catalog)
        if costs.priced:
            print(cost_summary(costs, config.cluster, report.result.tokens_per_s))
        if faulted is not None:
            print(fault_summary(faults, faulted))
    if args.json:
        out = report.to_dict()
        if costs is not None and costs.priced:
            out["costs"] = cost_record(costs, config.cluster, report.result.tokens_per_s)
        if faulted is not None:
            out["faults"] = {"described": list(faults.described), **faulted.to_dict()}
        write_json(out, args.json)
        print(f"\nwrote {args.json}")
    if args.trace:
        write_chrome_trace(report.result, Path(args.trace), report.trace)
        print(f"wrote {args.trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    if not report.result.fits_in_memory and not args.allow_oom:
        print(f"error: {report.config.name} does not fit in GPU memory (see the banner above); "
              "--allow-oom exits 0 anyway", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return 0


def run_shared_cluster(args: argparse.Namespace, path: Path) -> int:
    """``simulate`` of a config with a ``jobs`` list: every job's step together and alone."""
    from clustersim.hardware_specs import SpecError
    from clustersim.analysis.sweeps.shared_fabric import load_shared, run_shared, shared_table

    if args.trace:
        raise SpecError("--trace", "a cluster shared by several jobs has no one timeline; "
                                   "simulate a job's own config for its trace")
    config = load_shared(path, args.catalog)
    result = run_shared(config, limit=not args.no_limit)
    print(shared_table(config, result))
    if args.json:
        write_json({"name": config.name, "placement": config.placement.value,
                    **result.to_dict()}, args.json)
        print(f"\nwrote {args.json}")
    too_big = [j.name for j in result.jobs if not j.together.fits_in_memory]
    if too_big and not args.allow_oom:
        print(f"error: {', '.join(too_big)} do(es) not fit in GPU memory; --allow-oom exits 0 "
              "anyway", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return 0
