"""``clustersim plan CONFIG``: balance a job over a mixed cluster's device groups as HAP does,
and compare the plan with the naive even split and with the fastest group alone."""

from __future__ import annotations

import argparse
import itertools

from clustersim.analysis.cli.common import (
    add_catalog_option, add_command, load_checked_config, output_file, write_json,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "plan", help="balance a job over a mixed cluster (cluster.groups)",
                    examples=[
        ("clustersim plan examples/hetero_a100_h100.yaml",
         "batch per replica (and layers per stage) for 64 A100 + 64 H100; three step times"),
    ])
    p.add_argument("config", help="run config YAML with cluster.groups, or a bundled example")
    p.add_argument("--json", type=output_file, metavar="OUT", help="write the plan as JSON")
    p.add_argument("--no-limit", action="store_true",
                   help="run even steps over the work budget (about a minute of engine time)")
    add_catalog_option(p)
    p.set_defaults(func=run)


def render(plan, name: str) -> str:
    from clustersim.analysis.sweeps.balance import HAP_CITATION
    from clustersim.analysis.tables import key_values, render as table
    from clustersim.hardware_specs.units import format_time

    groups = table(["group", "device", "GPUs", "one micro-batch through every layer"],
                   [[i, g.device, g.num_devices, format_time(sum(g.layer_s))]
                    for i, g in enumerate(plan.groups)], title="Device groups")
    runs = [("balanced plan", plan.balanced, ""),
            ("even split", plan.even, f"{plan.speedup_over_even:.2f}x"),
            (f"{plan.groups[plan.fastest_group].device} only", plan.fastest_only,
             f"{plan.speedup_over_fastest:.2f}x")]
    steps = table(["run", "step time", "balanced plan's speed-up", "fits in memory"],
                  [[label, format_time(r.result.step_time_s), gain,
                    "yes" if r.result.fits_in_memory else "NO"] for label, r, gain in runs],
                  title="Step time")
    batch = ", ".join(f"{len(list(same))} x {b} ({device})" for (b, device), same in
                      itertools.groupby(zip(plan.replica_batch, plan.replica_devices)))
    head = key_values([
        ("layers per stage", str(list(plan.layers_per_stage)) if plan.layers_per_stage
         else "the even split (no pipeline spans groups)"),
        ("samples per replica", batch),
        ("method", HAP_CITATION),
    ], title=f"clustersim plan: {name}")
    return "\n\n".join([head, groups, steps])


def run(args: argparse.Namespace) -> int:
    from clustersim.analysis.sweeps.balance import plan

    config = load_checked_config(args.config, args.catalog)
    result = plan(config, limit=not args.no_limit)
    print(render(result, config.name))
    if args.json:
        write_json(result.to_dict(), args.json)
        print(f"\nwrote {args.json}")
    return 0
