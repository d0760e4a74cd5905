"""``clustersim collective``: what nccl-tests would print on the described cluster.

Sizes double from ``--min-bytes`` to ``--max-bytes`` as ``nccl-tests -b -e -f 2`` does; the
columns follow nccl-tests (doc/PERFORMANCE.md): algbw = size / time, busbw = algbw x the
collective's bus factor (all-reduce 2(n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n).
One group of ``--gpus`` ranks, packed onto nodes, runs alone on the fabric.
``--gpus-per-thread N`` is nccl-tests' ``-g N``: one thread launches N GPUs' kernels back to
back, and small sizes then measure that host loop rather than the GPUs.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from hardware_specs import ClusterSpec, SpecError, load_catalog
from hardware_specs.fields import parse_enum
from hardware_specs.units import Quantity, parse
from simulator.cost.collectives import (
    COLL_CHANNELS, Algorithm, nccl_channels, single_thread_launch_s,
)
from simulator.cost.network import NetworkModel, bus_factor
from workloads.trace import CollectiveKind

from analysis.cli_common import add_catalog_option, write_json
from analysis.tables import render

OPS = {"all_reduce": CollectiveKind.ALL_REDUCE, "all_gather": CollectiveKind.ALL_GATHER,
       "reduce_scatter": CollectiveKind.REDUCE_SCATTER, "alltoall": CollectiveKind.ALL_TO_ALL,
       "all_to_all": CollectiveKind.ALL_TO_ALL, "broadcast": CollectiveKind.BROADCAST,
       "sendrecv": None}


@dataclass(frozen=True)
class CollectiveRow:
    bytes: float
    time_s: float
    algbw_gbps: float
    busbw_gbps: float
    algorithm: str
    protocol: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def measure(cluster: ClusterSpec, op: str, gpus: int, size: float,
            algorithm: Algorithm | None = None, gpus_per_thread: int = 1) -> CollectiveRow:
    """One nccl-tests line: ``op`` of ``size`` bytes over the first ``gpus`` devices.

    ``gpus_per_thread``: nccl-tests ``-g`` (one thread launching that many GPUs' kernels);
    1 for one process or thread per GPU (mpirun, ``-t``)."""
    kind = OPS[op]
    network = NetworkModel(cluster, {kind: algorithm} if algorithm and kind else None)
    devices = tuple(cluster.device_of(r) for r in range(gpus))
    if kind is None:   # sendrecv: rank i sends to i+1, in a ring, all at once
        pairs = [(devices[i], devices[(i + 1) % gpus]) for i in range(gpus)]
        plan = network.p2p_plan(size, pairs)
        factor = 1.0
    else:
        plan = network.plan(kind, size, (devices,))
        factor = bus_factor(kind, gpus)
    t = plan.time(network.topology)
    if gpus_per_thread > 1 and kind is not None:
        channels = COLL_CHANNELS.get(cluster.device.scale_up_generation, 16)
        if plan.algorithm is Algorithm.RING:
            channels = nccl_channels(plan.protocol, size, gpus, channels)
        t = max(t, single_thread_launch_s(gpus_per_thread, channels))
    algbw = size / t / 1e9
    return CollectiveRow(size, t, algbw, algbw * factor, plan.algorithm.value, plan.protocol.value)


MAX_ROWS = 10_000


def sizes(lo: float, hi: float, factor: float = 2.0) -> list[float]:
    out, s = [], lo
    while s <= hi * (1 + 1e-9):
        out.append(s)
        s *= factor
    return out


def register(sub) -> None:
    p = sub.add_parser("collective", help="predict nccl-tests output for a collective")
    p.add_argument("--cluster", metavar="CONFIG", help="YAML with a cluster: section (a run config)")
    p.add_argument("--gpu", help="catalog device, instead of --cluster (its usual node)")
    p.add_argument("--op", default="all_reduce", choices=sorted(OPS))
    p.add_argument("--gpus", type=int, required=True, help="ranks in the collective")
    p.add_argument("--gpus-per-node", type=int, help="populate each node with this many GPUs")
    p.add_argument("--min-bytes", default="8", help="smallest size (e.g. 8, 1M)")
    p.add_argument("--max-bytes", default="8G", help="largest size (e.g. 8G)")
    p.add_argument("--step-factor", type=float, default=2.0,
                   help="multiply the size by this between rows (nccl-tests -f; default 2)")
    p.add_argument("--algorithm", choices=[a.value for a in Algorithm],
                   help="force an algorithm (default: NCCL-style automatic choice)")
    p.add_argument("--gpus-per-thread", type=int, default=1,
                   help="nccl-tests -g: GPUs one thread launches (default 1: mpirun, -t)")
    p.add_argument("--json", metavar="OUT", help="write the rows as JSON")
    add_catalog_option(p)
    p.set_defaults(func=run)


def _size(text: str, flag: str) -> float:
    value = text.strip()
    if value and value[-1] in "KMGT":
        value += "iB"     # nccl-tests' sizes are binary: 1K = 1024
    return parse(value if not value.isdigit() else float(value), Quantity.BYTES, flag)


def _cluster(args) -> ClusterSpec:
    catalog = load_catalog(args.catalog)
    if args.cluster:
        from pathlib import Path

        from analysis.config import parse_cluster, read_yaml
        from hardware_specs.fields import Fields
        data = read_yaml(Path(args.cluster))
        section = dict(data.get("cluster", data))
        section.setdefault("num_gpus", args.gpus)
        if args.gpus_per_node:
            section["gpus_per_node"] = args.gpus_per_node
        return parse_cluster(Fields(section, "cluster"), catalog)
    if not args.gpu:
        raise SpecError("--cluster", "give --cluster CONFIG or --gpu NAME")
    return catalog.cluster(device=args.gpu, num_devices=args.gpus,
                           devices_per_node=args.gpus_per_node)


def run(args: argparse.Namespace) -> int:
    if args.gpus < 2:
        raise SpecError("--gpus", f"a collective needs at least 2 ranks, got {args.gpus}")
    cluster = _cluster(args)
    if cluster.num_devices < args.gpus:
        raise SpecError("--gpus", f"{args.gpus} exceeds the cluster's {cluster.num_devices} GPUs")
    if not 1 <= args.gpus_per_thread <= args.gpus:
        raise SpecError("--gpus-per-thread", f"expected 1 to --gpus ({args.gpus}), got "
                        f"{args.gpus_per_thread}")
    algorithm = parse_enum(Algorithm, args.algorithm, "--algorithm") if args.algorithm else None
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
    rows = [measure(cluster, args.op, args.gpus, s, algorithm, args.gpus_per_thread)
            for s in sizes(lo, hi, args.step_factor)]
    table = [[f"{r.bytes:.0f}", f"{r.bytes / 4:.0f}", f"{r.time_s * 1e6:.2f}", f"{r.algbw_gbps:.2f}",
              f"{r.busbw_gbps:.2f}", f"{r.algorithm}/{r.protocol}"] for r in rows]
    print(f"# {args.op} on {args.gpus} x {cluster.device.name} ({cluster.devices_per_node} per "
          f"{cluster.node.name} node, {cluster.fabric.name}); float32, sum")
    print(render(["size (B)", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "algorithm"],
                 table))
    if algorithm is not None and any(r.algorithm != algorithm.value for r in rows):
        print(f"\nnote: {algorithm.value} cannot run this {args.op} here; NCCL falls back to "
              "the ring, as above")
    if args.json:
        write_json([r.to_dict() for r in rows], args.json)
        print(f"\nwrote {args.json}")
    return 0
