"""``clustersim compare A.yaml B.yaml ... [--vary cluster.gpu=h100-sxm,h200-sxm]``."""

from __future__ import annotations

from pathlib import Path

from clustersim.hardware_specs import SpecError

from clustersim.analysis.cli.common import add_catalog_option, add_command, add_parallel_options, output_path
from clustersim.analysis.reports.comparison import table
from clustersim.analysis.sweeps.compare import compare
from clustersim.analysis.sweeps.run_store import COMPARE


def register(sub) -> None:
    p = add_command(sub, "compare", help="compare clusters (what should we buy?)", examples=[
        ("clustersim compare llama3_70b_h100 --vary cluster.gpu=h100-sxm,h200",
         "one config on two GPU types, each with the config's own strategy"),
        ("clustersim compare llama3_8b_fsdp --vary cluster.oversubscription=1,2 --sweep "
         "--out runs/fabric", "each fabric with the best strategy a sweep finds for it"),
        ("clustersim compare shared_fabric_4to1 --vary placement=packed,scattered",
         "jobs sharing a cluster, placed two ways: what each job loses to the others"),
    ])
    p.add_argument("configs", nargs="+", help="run config YAML files")
    p.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                   help="try each value of a config field, e.g. cluster.gpu=h100-sxm,h200 "
                        "or cluster.oversubscription=1,2 (repeatable: every combination)")
    p.add_argument("--sweep", action="store_true",
                   help="find each cluster's best strategy with a full sweep (needs --out)")
    p.add_argument("--out", type=output_path, metavar="DIR",
                   help="write compare.csv (and the sweeps) here")
    add_parallel_options(p)
    add_catalog_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    rows = compare(args.configs, args.vary, sweep=args.sweep, out=args.out, catalog=args.catalog,
                   workers=args.workers, dask_address=args.dask, progress=args.progress)
    print(table(rows))
    if args.out:
        print(f"\nwrote {Path(args.out) / COMPARE}")
    if all(r.get("problem") for r in rows):
        raise SpecError("configs", f"none of the {len(rows)} configurations could be compared "
                                   f"(first: {rows[0]['problem']})")
    return 0
