"""Which devices of a shared cluster each job gets: the scheduler's placement policy.

Devices are numbered node by node (device ``d`` is GPU ``d % per_node`` of node
``d // per_node``), and consecutive nodes share a leaf switch (a rack, or a rail group), as in
``topology.py``. So the policies below decide which switches' uplinks the jobs have in common:

- packed: every job on whole consecutive nodes, one job after the other (a job fills a rack
  before the next starts): jobs meet on a leaf only where one job's nodes end and the next's
  begin;
- scattered: nodes dealt to the jobs in turn (node 0 to job A, node 1 to job B, ...), as a
  scheduler that takes whatever nodes are free ends up doing: every rack holds every job, so the
  jobs' rings cross the same leaf uplinks;
- rail-aligned: every job on every node, each on its own GPUs of the node (job A on GPUs 0-3,
  job B on 4-7): on a rail-optimised fabric each GPU's NIC sits on its own rail, so the jobs
  never share a leaf switch.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from clustersim.hardware_specs.errors import SpecError


class JobPlacement(enum.Enum):
    PACKED = "packed"
    SCATTERED = "scattered"
    RAIL_ALIGNED = "rail_aligned"


@dataclass(frozen=True, kw_only=True, slots=True)
class Allocation:
    """One job's devices on the shared cluster."""

    devices: tuple[int, ...]
    """Cluster device of each of the job's devices, in the job's own order (node by node)."""
    per_node: int
    """Devices the job uses on each of its nodes."""


def allocate(sizes: Sequence[int], per_node: int, num_devices: int, policy: JobPlacement,
             path: str = "jobs") -> tuple[Allocation, ...]:
    """Devices for jobs of ``sizes`` devices on a cluster of ``num_devices`` with ``per_node``
    devices per node; a request the cluster cannot meet is a :class:`SpecError` on ``path``."""
    total = sum(sizes)
    if total > num_devices:
        raise SpecError(path, f"the jobs need {total} GPUs; the cluster has {num_devices}")
    if policy is JobPlacement.RAIL_ALIGNED:
        return _rail_aligned(sizes, per_node, num_devices, path)
    for i, size in enumerate(sizes):
        if size > per_node and size % per_node:
            raise SpecError(f"{path}[{i}].gpus", f"{size} is not a whole number of nodes of "
                            f"{per_node} GPUs (placement {policy.value} gives whole nodes)")
    nodes = [max(1, size // per_node) for size in sizes]
    if policy is JobPlacement.PACKED:
        order = [j for j, n in enumerate(nodes) for _ in range(n)]
    else:
        order, left = [], list(nodes)
        while any(left):
            for j, n in enumerate(left):
                if n:
                    order.append(j)
                    left[j] -= 1
    if len(order) * per_node > num_devices:
        raise SpecError(path, f"the jobs need {len(order)} whole nodes of {per_node} GPUs; the "
                        f"cluster has {num_devices // per_node}")
    devices: list[list[int]] = [[] for _ in sizes]
    for node, j in enumerate(order):
        take = min(per_node, sizes[j])
        devices[j] += range(node * per_node, node * per_node + take)
    return tuple(Allocation(devices=tuple(d), per_node=min(per_node, sizes[j]))
                 for j, d in enumerate(devices))


def _rail_aligned(sizes: Sequence[int], per_node: int, num_devices: int,
                  path: str) -> tuple[Allocation, ...]:
    """An equal share of every node's GPUs per job, job j on GPUs [j*share, (j+1)*share)."""
    share = per_node // len(sizes)
    if share < 1:
        raise SpecError(path, f"rail_aligned gives each of {len(sizes)} jobs its own GPUs of a "
                        f"{per_node}-GPU node: at most {per_node} jobs")
    out = []
    for j, size in enumerate(sizes):
        if size % share:
            raise SpecError(f"{path}[{j}].gpus", f"{size} is not a multiple of the job's "
                            f"{share} GPUs per node (rail_aligned, {len(sizes)} jobs)")
        nodes = size // share
        if nodes * per_node > num_devices:
            raise SpecError(f"{path}[{j}].gpus", f"{size} GPUs at {share} per node need {nodes} "
                            f"nodes; the cluster has {num_devices // per_node}")
        out.append(Allocation(
            devices=tuple(n * per_node + j * share + k for n in range(nodes) for k in range(share)),
            per_node=share))
    return tuple(out)
