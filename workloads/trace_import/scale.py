"""Record small, simulate big: more data-parallel replicas of a recorded step.

Rules (the README states them too):
1. Only a pure data-parallel trace scales: every collective spans all recorded ranks, and there
   is no send/recv. Anything else (tensor or pipeline groups) is refused, naming the op.
2. Weak scaling: every new replica runs a recorded rank's program (rank r runs the program of
   recorded rank r mod N), so the per-replica batch, the compute and the collective sizes stay
   as recorded (an all-reduce of the gradients is as large on 1,024 ranks as on 2); the group
   grows to all ranks and the target network re-costs it. Tokens grow with the replicas.
3. A trace with no collective (one rank) has no gradient synchronisation to scale: refused.
4. Warnings: more than ``EXTRAPOLATION_LIMIT`` times the recorded ranks (collective algorithms
   and network tiers change with scale, and nothing recorded checks that); ZeRO-3/FSDP
   collectives (all-gather, reduce-scatter), whose shards and optimizer work shrink with the
   replicas in a real run but are kept as recorded here; fewer replicas than recorded.
"""

from __future__ import annotations

from dataclasses import replace

from clustersim.hardware_specs import SpecError
from clustersim.workloads.trace import (
    CollectiveKind, CollectiveOp, GroupSet, RecvOp, SendOp, Trace, validate,
)

EXTRAPOLATION_LIMIT = 8
"""Replicas beyond this multiple of the recorded ranks warn."""
SHARDED = (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER)


def scale_data_parallel(trace: Trace, replicas: int, path: str = "workload.dp"
                        ) -> tuple[Trace, tuple[str, ...]]:
    """``trace`` with ``replicas`` data-parallel ranks; the warnings of rule 4."""
    n = trace.world_size
    if replicas < 1:
        raise SpecError(path, f"expected a whole number >= 1, got {replicas}")
    if replicas == n:
        return trace, ()
    collectives = 0
    sharded = False
    for prog in trace.programs:
        for op in prog.ops:
            if isinstance(op, (SendOp, RecvOp)):
                raise SpecError(path, f"op {op.id} ({op.name}) of {prog.name} is a send/recv: "
                                "only a pure data-parallel trace scales")
            if isinstance(op, CollectiveOp):
                collectives += 1
                sharded |= op.kind in SHARDED
                group = trace.group_of(op.group, prog.ranks[0])
                if len(group) != n:
                    raise SpecError(path, f"op {op.id} ({op.name}) of {prog.name} runs on a group "
                                    f"of {len(group)} of {n} ranks: only a pure data-parallel "
                                    "trace scales")
    if not collectives:
        raise SpecError(path, f"the trace ({n} rank(s)) has no collective: there is no "
                        "gradient synchronisation to scale; record at least 2 ranks")
    warnings = []
    if replicas > EXTRAPOLATION_LIMIT * n:
        warnings.append(f"extrapolating: {replicas} replicas from a trace of {n} ranks (over "
                        f"{EXTRAPOLATION_LIMIT}x); collectives are re-costed at the new scale "
                        "but nothing recorded checks their algorithm or network tiers")
    if sharded:
        warnings.append("all-gather/reduce-scatter (ZeRO-3/FSDP) in the trace: their shards and "
                        "the optimizer step are kept as recorded, not re-sharded for "
                        f"{replicas} replicas")
    if replicas < n:
        warnings.append(f"fewer replicas ({replicas}) than recorded ({n}): the programs of "
                        f"ranks {replicas}..{n - 1} are dropped")
    owner = {r: i for i, p in enumerate(trace.programs) for r in p.ranks}
    members: dict[int, list[int]] = {}
    for r in range(replicas):
        members.setdefault(owner[r % n], []).append(r)
    programs = tuple(replace(p, ranks=tuple(members[i])) for i, p in enumerate(trace.programs)
                     if i in members)
    everyone = (tuple(range(replicas)),)
    sets = {name: GroupSet(name, everyone) for name in trace.group_sets}
    scaled = replace(trace, world_size=replicas, programs=programs, group_sets=sets,
                     tokens=trace.tokens * replicas / n,
                     model_flops=trace.model_flops * replicas / n,
                     meta={**trace.meta, "scaled": {"recorded_ranks": n, "replicas": replicas}})
    return validate(scaled), tuple(warnings)


