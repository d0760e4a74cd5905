"""Which ops of a program can meet a collective whose kernels hold SMs (DeepEP's and HybridEP's
dispatch and combine, ``interference.sm_share_slowdown``).

Such a collective slows the compute that runs beside it, so the compute ops it can overlap and
the collective itself must run as SimPy events, where each sees the device's activity as it is
(``DeviceActivity``). Every other op can be folded: a compute op that the collective waits for
(through deps or stream order) has ended before it starts, and one that waits for it starts
after it has ended, so neither ever sees it in flight. Compute ops run in order on one stream,
so the ones a collective can overlap are those strictly between the last one it waits for and
the first one that waits for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from clustersim.workloads.trace import CollectiveOp, ComputeOp, Op, Stream, Trace


def holds_sms(op: Op) -> bool:
    """Whether ``op`` is a collective whose kernels hold SMs while it runs."""
    return isinstance(op, CollectiveOp) and op.routing is not None and bool(op.routing.sms)


def ops_beside_held(ops: tuple[Op, ...]) -> frozenset[int]:
    """Ids of the ops of a program (``op.id`` is its position) that run as events when some of
    its collectives hold SMs: those collectives and every compute op that is neither before
    nor after one of them in the program's order; empty when none holds SMs. If compute ops
    run on more than one stream, every compute op (the device's one compute activity cannot
    tell them apart)."""
    held = [op.id for op in ops if holds_sms(op)]
    if not held:
        return frozenset()
    computes = [op.id for op in ops if isinstance(op, ComputeOp)]
    if any(ops[i].stream is not Stream.COMPUTE for i in computes):
        return frozenset(held) | frozenset(computes)
    position = {op_id: k for k, op_id in enumerate(computes)}
    before, after = _chain_bounds(ops, position)
    beside = set(held)
    for h in held:
        lo, hi = before[h] + 1, after[h]
        beside.update(computes[lo:len(computes) if math.isinf(hi) else int(hi)])
    return frozenset(beside)


def folding_pays(trace: Trace, beside: Mapping[int, frozenset[int]]) -> bool:
    """Whether a folded replay of ``trace`` is worth it: at most half its compute ops run as
    events beside collectives that hold SMs (``beside``: program -> ops, from
    :func:`ops_beside_held`). Beyond that the folded replay, which starts a SimPy process each
    time a stream resumes after a wait, costs more than the replay with one process per stream:
    measured on the DeepEP rows of ``analysis/data/published_runs_moe.csv`` (2-core machine),
    rows with no compute beside a held collective fold to 0.42-0.60x the events at 0.9-1.1x the
    CPU, rows with 64-90% of it beside take 1.0-1.5x the CPU folded."""
    computes = besides = 0
    for p, program in enumerate(trace.programs):
        ids = beside.get(p, frozenset())
        for op in program.ops:
            if isinstance(op, ComputeOp):
                computes += 1
                besides += op.id in ids
    return 2 * besides <= computes


def _chain_bounds(ops: tuple[Op, ...], position: dict[int, int]) -> tuple[list[int], list[float]]:
    """Per op: the latest compute position among it and what it waits for (-1: none), and the
    earliest among it and what waits for it (inf: none). An op waits for its deps and for the
    op before it on its stream (pp ops are posted on their own: only deps)."""
    n = len(ops)
    previous = [-1] * n
    last_on: dict[Stream, int] = {}
    for op in ops:
        if op.stream is not Stream.PP:
            previous[op.id] = last_on.get(op.stream, -1)
            last_on[op.stream] = op.id
    before = [-1] * n
    for op in ops:
        b = position.get(op.id, -1)
        for d in op.deps:
            if before[d] > b:
                b = before[d]
        p = previous[op.id]
        if p >= 0 and before[p] > b:
            b = before[p]
        before[op.id] = b
    after: list[float] = [math.inf] * n
    for op in reversed(ops):
        own = position.get(op.id)
        a = after[op.id]
        if own is not None and own < a:
            a = after[op.id] = own
        for d in op.deps:
            if a < after[d]:
                after[d] = a
        p = previous[op.id]
        if p >= 0 and a < after[p]:
            after[p] = a
    return before, after
