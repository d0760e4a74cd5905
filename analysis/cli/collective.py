"""``clustersim collective``: what nccl-tests would print on the described cluster, or, with
``--against LOG``, the model held against what nccl-tests printed.

Sizes double from ``--min-bytes`` to ``--max-bytes`` as ``nccl-tests -b -e -f 2`` does; one
group of ``--gpus`` ranks, packed onto nodes, runs alone on the fabric
(``analysis.validation.collectives`` says how each line is timed).
"""

from __future__ import annotations

import argparse
import math

from clustersim.hardware_specs import ClusterSpec, SpecError, load_catalog
from clustersim.hardware_specs.fields import parse_enum
from clustersim.hardware_specs.units import Quantity, parse
from clustersim.simulator.cost.collectives import Algorithm

from clustersim.analysis.accuracy import ERROR_MEANING, time_error
from clustersim.analysis.cli.common import add_catalog_option, add_command, output_file, write_json
from clustersim.analysis.tables import render
from clustersim.analysis.limits import COLLECTIVE_ROW_BUDGET, check_budget
from clustersim.analysis.validation.collectives import (
    MAX_ROWS, OPS, CollectiveRow, canonical_op, measure, sizes,
)
from clustersim.analysis.validation.nccl_tests_log import NcclTestsLog, read_log


def register(sub) -> None:
    p = add_command(sub, "collective", help="predict nccl-tests output for a collective", examples=[
        ("clustersim collective --gpu h100-sxm --gpus 16 --op all_reduce --max-bytes 1G",
         "all_reduce_perf on two DGX H100 nodes, 8 B to 1 GiB"),
        ("clustersim collective --gpu h100-sxm --gpus 8 --against examples/nccl_tests_h100_p5.log",
         "hold the model against a real nccl-tests log (its sizes and op; ranks when it lists them)"),
    ])
    p.add_argument("--cluster", metavar="CONFIG", help="YAML with a cluster: section (a run config)")
    p.add_argument("--gpu", help="catalog device, instead of --cluster (its usual node)")
    p.add_argument("--op", type=canonical_op, choices=sorted(OPS),
                   help="collective (default all_reduce, or the log's)")
    p.add_argument("--gpus", type=int, help="ranks in the collective (default: the log's ranks)")
    p.add_argument("--gpus-per-node", type=int, help="populate each node with this many GPUs")
    p.add_argument("--min-bytes", default="8", help="smallest size (e.g. 8, 1M)")
    p.add_argument("--max-bytes", default="8G", help="largest size (e.g. 8G)")
    p.add_argument("--step-factor", type=float, default=2.0,
                   help="multiply the size by this between rows (nccl-tests -f; default 2)")
    p.add_argument("--algorithm", choices=[a.value for a in Algorithm],
                   help="force an algorithm (default: NCCL-style automatic choice)")
    p.add_argument("--gpus-per-thread", type=int,
                   help="nccl-tests -g: GPUs one thread launches (default 1: mpirun, -t; or the "
                        "log's nGpus)")
    p.add_argument("--against", metavar="LOG",
                   help="an nccl-tests output file: predict its sizes and print measured, "
                        "predicted and the error per size")
    p.add_argument("--json", type=output_file, metavar="OUT", help="write the rows as JSON")
    p.add_argument("--no-limit", action="store_true",
                   help="run even when GPUs x sizes is over the work budget")
    add_catalog_option(p)
    p.set_defaults(func=run)


def _size(text: str, flag: str) -> float:
    value = text.strip()
    if value and value[-1] in "KMGT":
        value += "iB"     # nccl-tests' sizes are binary: 1K = 1024
    return parse(float(value) if value.isascii() and value.isdigit() else value, Quantity.BYTES, flag)


def _cluster(args, gpus: int) -> ClusterSpec:
    catalog = load_catalog(args.catalog)
    if args.cluster:
        from pathlib import Path

        from clustersim.analysis.config import parse_cluster, read_yaml
        from clustersim.hardware_specs.fields import Fields
        data = read_yaml(Path(args.cluster))
        section = dict(Fields(data.get("cluster", data), "cluster").data)
        section.setdefault("num_gpus", gpus)
        if args.gpus_per_node:
            section["gpus_per_node"] = args.gpus_per_node
        return parse_cluster(Fields(section, "cluster"), catalog)
    if not args.gpu:
        raise SpecError("--cluster", "give --cluster CONFIG or --gpu NAME")
    try:
        return catalog.cluster(device=args.gpu, num_devices=gpus,
                               devices_per_node=args.gpus_per_node)
    except SpecError as err:
        raise SpecError(FLAG_OF_FIELD.get(err.field, err.field), err.message) from None


FLAG_OF_FIELD = {"cluster.gpu": "--gpu", "cluster.node": "--gpu", "cluster.num_gpus": "--gpus",
                 "cluster.gpus_per_node": "--gpus-per-node"}
"""The flag a user gave for each field the catalog checks, so that its errors name the flag."""


def _size_range(args) -> list[float]:
    lo, hi = _size(args.min_bytes, "--min-bytes"), _size(args.max_bytes, "--max-bytes")
    if lo < 1:
        raise SpecError("--min-bytes", f"expected at least 1 byte, got {args.min_bytes}")
    if hi < lo:
        raise SpecError("--max-bytes", f"expected at least --min-bytes ({args.min_bytes}), "
                        f"got {args.max_bytes}")
    if not args.step_factor > 1:
        raise SpecError("--step-factor", f"expected a factor above 1, got {args.step_factor:g}")
    if math.log(hi / lo) / math.log(args.step_factor) > MAX_ROWS:
        raise SpecError("--step-factor", f"{args.step_factor} gives more than {MAX_ROWS} sizes "
                        f"from {args.min_bytes} to {args.max_bytes}")
    return sizes(lo, hi, args.step_factor)


def _from_log(given, logged, flag: str, default):
    """A flag's value, or what the nccl-tests log says; both must agree."""
    if given is not None and logged is not None and given != logged:
        raise SpecError(flag, f"{given} disagrees with the log's {logged}")
    return given if given is not None else logged if logged is not None else default


def _avg(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def _print_comparison(rows: list[CollectiveRow], log: NcclTestsLog) -> None:
    errors = [time_error(r.time_s, m.time_s) for r, m in zip(rows, log.rows)]
    table = [[f"{m.bytes}", f"{m.time_s * 1e6:.2f}", f"{r.time_s * 1e6:.2f}", f"{m.busbw_gbps:.2f}",
              f"{r.busbw_gbps:.2f}", f"{e:+.1%}", f"{r.algorithm}/{r.protocol}"]
             for r, m, e in zip(rows, log.rows, errors)]
    print(render(["size (B)", "measured (us)", "predicted (us)", "measured busbw",
                  "predicted busbw", "error", "algorithm"], table))
    worst = max(range(len(errors)), key=lambda i: abs(errors[i]))
    print(f"\n{ERROR_MEANING}\nover {len(rows)} sizes: mean |error| "
          f"{_avg(abs(e) for e in errors):.1%}, max {errors[worst]:+.1%} "
          f"at {log.rows[worst].bytes} B")
    print(f"avg bus bandwidth (GB/s): measured {_avg(m.busbw_gbps for m in log.rows):.2f}, "
          f"predicted {_avg(r.busbw_gbps for r in rows):.2f}")


def run(args: argparse.Namespace) -> int:
    log = read_log(args.against) if args.against else None
    gpus = _from_log(args.gpus, log and log.ranks, "--gpus", None)
    if gpus is None:
        raise SpecError("--gpus", "give the number of ranks (or --against a log that lists them)")
    op = _from_log(args.op, log and log.op and canonical_op(log.op), "--op", "all_reduce")
    if op not in OPS:
        raise SpecError("--op", f"expected one of {', '.join(sorted(OPS))}, got {op!r}")
    per_thread = _from_log(args.gpus_per_thread, log and log.gpus_per_thread,
                           "--gpus-per-thread", 1)
    if gpus < 2:
        raise SpecError("--gpus", f"a collective needs at least 2 ranks, got {gpus}")
    sizes_ = [m.bytes for m in log.rows] if log else _size_range(args)
    if not args.no_limit:
        check_budget(gpus * len(sizes_), COLLECTIVE_ROW_BUDGET, "GPUs x sizes", "--no-limit")
    cluster = _cluster(args, gpus)
    if cluster.num_devices < gpus:
        raise SpecError("--gpus", f"{gpus} exceeds the cluster's {cluster.num_devices} GPUs")
    if not 1 <= per_thread <= gpus:
        raise SpecError("--gpus-per-thread", f"expected 1 to --gpus ({gpus}), got {per_thread}")
    algorithm = parse_enum(Algorithm, args.algorithm, "--algorithm") if args.algorithm else None
    rows = [measure(cluster, op, gpus, s, algorithm, per_thread) for s in sizes_]
    print(f"# {op} on {gpus} x {cluster.device.name} ({cluster.devices_per_node} per "
          f"{cluster.node.name} node, {cluster.fabric.name}); float32, sum"
          + (f"; {per_thread} GPUs per thread" if per_thread > 1 else "")
          + (f"; against {args.against}" if log else ""))
    if log:
        _print_comparison(rows, log)
    else:
        table = [[f"{r.bytes:.0f}", f"{r.bytes / 4:.0f}", f"{r.time_s * 1e6:.2f}",
                  f"{r.algbw_gbps:.2f}", f"{r.busbw_gbps:.2f}", f"{r.algorithm}/{r.protocol}"]
                 for r in rows]
        print(render(["size (B)", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
                      "algorithm"], table))
        print(f"\n# Avg bus bandwidth    : {_avg(r.busbw_gbps for r in rows):.4g}")
    if algorithm is not None and any(r.algorithm != algorithm.value for r in rows):
        print(f"\nnote: {algorithm.value} cannot run this {op} here; NCCL falls back to "
              "the ring, as above")
    if args.json:
        measured = log.rows if log else [None] * len(rows)
        write_json([r.to_dict() | ({"measured_time_s": m.time_s,
                                    "measured_busbw_gbps": m.busbw_gbps} if m else {})
                    for r, m in zip(rows, measured)], args.json)
        print(f"\nwrote {args.json}")
    return 0
