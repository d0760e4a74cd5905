"""Where offloaded state lives: the tiers ``strategy.offload_tier`` or ``strategy.offload_split``
name, and whether each holds its share.

Every GPU of a node offloads into the same node-scope tiers (its host DRAM, CXL expanders,
persistent memory, NVMe), so a tier's capacity is checked against the node's sum: the offloaded
bytes of one GPU (the stage that offloads most) x GPUs per node x the tier's share. A device-
scope tier holds one GPU's share; a cluster-scope tier every node's. Overflow is refused with the
tier named, as ZeRO-Infinity's placement would fail to allocate.
"""

from __future__ import annotations

from dataclasses import replace

from clustersim.hardware_specs import Catalog, ClusterSpec, SpecError
from clustersim.hardware_specs.memory import MemoryTierSpec, TierKind, TierScope
from clustersim.hardware_specs.units import format_bytes
from clustersim.workloads.job import Job

OFFLOAD_KINDS = (TierKind.HOST_DRAM, TierKind.CXL, TierKind.NON_VOLATILE, TierKind.LOCAL_NVME)


def offload_tier(catalog: Catalog, name: str, field: str = "strategy.offload_tier"
                 ) -> MemoryTierSpec:
    """The memory tier ``field`` names: host DRAM, CXL, persistent memory or local NVMe
    (ZeRO-Infinity), not HBM or a shared file system."""
    tier = catalog.get("memory_tiers", name, field)
    if tier.kind not in OFFLOAD_KINDS:
        raise SpecError(field, f"{name} is {tier.kind.value}; expected one of "
                        f"{', '.join(k.value for k in OFFLOAD_KINDS)}")
    return tier


def with_offload_tiers(cluster: ClusterSpec, catalog: Catalog, job: Job) -> ClusterSpec:
    """The cluster with the job's offload tiers resolved, each tier's share checked to fit."""
    s = job.strategy
    if s.offload_tier:
        cluster = replace(cluster, offload_tier=offload_tier(catalog, s.offload_tier))
    if s.offload_split:
        cluster = replace(cluster, offload_split=tuple(
            (offload_tier(catalog, name, f"strategy.offload_split.{name}"), share)
            for name, share in s.offload_split))
    check_tier_capacity(job, cluster)
    return cluster


def tier_bytes(tier: MemoryTierSpec, share: float, per_gpu: float, cluster: ClusterSpec) -> float:
    """Bytes a tier of ``tier.scope`` holds when every GPU puts ``share`` of ``per_gpu`` in it."""
    gpus = {TierScope.DEVICE: 1, TierScope.NODE: cluster.devices_per_node,
            TierScope.CLUSTER: cluster.num_devices}[tier.scope]
    return per_gpu * share * gpus


def check_tier_capacity(job: Job, cluster: ClusterSpec) -> None:
    """Refuse a placement whose share of a tier exceeds that tier's capacity."""
    if job.strategy.offload_split:
        field = "strategy.offload_split"
    elif job.strategy.offload_tier:
        field = "strategy.offload_tier"
    else:
        field = "strategy.offload"
    per_gpu = max((m.offloaded_bytes + m.offloaded_activation_bytes for m in job.memory()),
                  default=0.0)
    if not per_gpu:
        return
    for tier, share in cluster.offload_placement:
        held = tier_bytes(tier, share, per_gpu, cluster)
        if held > tier.capacity_bytes:
            at = f"{field}.{tier.name}" if job.strategy.offload_split else field
            raise SpecError(at, f"tier {tier.name} ({tier.kind.value}, {tier.scope.value} scope) "
                            f"would hold {format_bytes(held)} ({share:.0%} of "
                            f"{format_bytes(per_gpu)} offloaded per GPU"
                            + (f" x {cluster.devices_per_node} GPUs per node"
                               if tier.scope is TierScope.NODE else "")
                            + f") but has {format_bytes(tier.capacity_bytes)}; move part of "
                            "it to another tier (offload_split) or shard it over more GPUs")
