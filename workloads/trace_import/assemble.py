"""Ranks' recordings -> a Trace: streams, the dependencies the timeline implies, host gaps, and
the checks that every collective and send has its partners.

- Compute items run in recorded order on the compute stream. Idle time between two of them
  that no communication explains is a *host gap* op (framework overhead, launch latency): it
  keeps its measured length on any device.
- A collective runs on the dp stream after the compute op that posted it; the first compute
  op that started after it completed (in the recording) depends on it: that is where the rank
  waited for it. Send/recv run on the pp stream the same way. Copies run on the copy stream.
- Each rank is its own program (its own measured times); one rank's file can stand for a
  symmetric job of ``world_size`` ranks (``symmetric``): every rank runs that program, and each
  process group of the file becomes the partition of the world into groups of its size and
  stride.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from clustersim.hardware_specs import SpecError
from clustersim.workloads.trace import (
    CollectiveOp, ComputeOp, CopyOp, GroupSet, Op, Phase, Program, RecvOp, SendOp, Stream, Trace,
    validate,
)
from clustersim.workloads.trace_import.recording import (
    CollectiveItem, ComputeItem, CopyItem, PointToPointItem, RankRecording,
)

MIN_GAP_S = 1e-6
"""Idle time shorter than this between two recorded ops is clock rounding, not a gap."""
WORLD_SET = "world"
"""Group set of send/recv: peers are named by global rank."""


def _partition(ranks: tuple[int, ...], world: int, where: str) -> tuple[tuple[int, ...], ...]:
    """The groups of a symmetric job that ``ranks`` is one of: same size, same stride."""
    size = len(ranks)
    if size == world:
        return (tuple(range(world)),)
    stride = ranks[1] - ranks[0] if size > 1 else 1
    if world % size or any(b - a != stride for a, b in zip(ranks, ranks[1:])) or stride < 1:
        raise SpecError(where, f"process group {list(ranks)} is not a regular block or stride of "
                        f"{world} ranks: give every rank's file instead of one")
    groups, seen = [], set()
    for r in range(world):
        if r in seen:
            continue
        g = tuple(r + stride * j for j in range(size))
        if g[-1] >= world or seen & set(g):
            raise SpecError(where, f"process groups of size {size} and stride {stride} do not "
                            f"tile {world} ranks")
        seen.update(g)
        groups.append(g)
    return tuple(groups)


class _Groups:
    """Process groups -> group sets (one set per distinct group shape)."""

    def __init__(self, world: int, symmetric: bool):
        self.world, self.symmetric = world, symmetric
        self.sets: dict[str, tuple[tuple[int, ...], ...]] = {}
        self.of_ranks: dict[tuple[int, ...], str] = {}

    def name(self, item: CollectiveItem, where: str) -> str:
        if item.ranks in self.of_ranks:
            return self.of_ranks[item.ranks]
        if any(not 0 <= r < self.world for r in item.ranks):
            raise SpecError(where, f"process group {list(item.ranks)} names ranks outside the "
                            f"world of {self.world}")
        groups = (_partition(item.ranks, self.world, where) if self.symmetric
                  else (item.ranks,))
        name = "dp" if len(item.ranks) == self.world else f"pg{len(self.sets)}"
        if name in self.sets:
            name = f"pg{len(self.sets)}"
        self.sets[name] = groups
        for g in groups:
            self.of_ranks[g] = name
        return name


def _program(rec: RankRecording, groups: _Groups, ranks: tuple[int, ...],
             p2p_seq: dict) -> Program:
    ops: list[Op] = []
    last_compute: int | None = None
    pending: list[tuple[float, int]] = []       # (completion time, op id) of communication
    prev_end = None
    for idx, item in enumerate(rec.items):
        where = f"{rec.file}: item {idx} ({item.name})"
        after = () if last_compute is None else (last_compute,)
        if isinstance(item, ComputeItem):
            ready = [(t, i) for t, i in pending if t <= item.start_s + MIN_GAP_S]
            pending = [p for p in pending if p not in ready]
            deps = tuple(sorted(i for _, i in ready))
            waited = max([prev_end or item.start_s] + [t for t, _ in ready])
            gap = item.start_s - waited
            if prev_end is not None and gap > MIN_GAP_S:
                ops.append(ComputeOp(len(ops), "host gap", item.phase, (), deps,
                                     measured_s=gap))
                deps = ()
            ops.append(ComputeOp(len(ops), item.name, item.phase, item.kernels, deps,
                                 measured_s=max(0.0, item.end_s - item.start_s)))
            last_compute = len(ops) - 1
            prev_end = item.end_s if prev_end is None else max(prev_end, item.end_s)
        elif isinstance(item, CollectiveItem):
            if rec.rank not in item.ranks:
                raise SpecError(where, f"rank {rec.rank} posts a collective of process group "
                                f"{list(item.ranks)}, which does not contain it")
            ops.append(CollectiveOp(len(ops), item.name, item.kind, item.bytes,
                                    groups.name(item, where), Stream.DP, after))
            pending.append((item.end_s if item.end_s is not None else item.start_s, len(ops) - 1))
        elif isinstance(item, PointToPointItem):
            src, dst = (rec.rank, item.peer) if item.send else (item.peer, rec.rank)
            seq = p2p_seq[(src, dst, item.send)]
            p2p_seq[(src, dst, item.send)] += 1
            cls = SendOp if item.send else RecvOp
            ops.append(cls(len(ops), item.name, WORLD_SET, item.peer, item.bytes, seq,
                           Stream.PP, after))
            if item.end_s is not None:
                # Without a completion time (an isend whose wait the trace does not show), no
                # op is known to wait for it.
                pending.append((item.end_s, len(ops) - 1))
        elif isinstance(item, CopyItem):
            ops.append(CopyOp(len(ops), item.name, item.kind, item.bytes, Stream.COPY, after))
            pending.append((item.end_s, len(ops) - 1))
    return Program(f"rank{rec.rank}", ranks, tuple(ops))


def _check_partners(programs: Sequence[Program], trace_sets: dict, files: dict[int, str]) -> None:
    """Every member of a group posts the same collectives in the same order; every send has
    its recv. Otherwise the error names the first event that has no partner."""
    posted: dict[tuple[str, tuple[int, ...]], dict[int, list[CollectiveOp]]] = defaultdict(dict)
    for prog in programs:
        for r in prog.ranks:
            for op in prog.ops:
                if isinstance(op, CollectiveOp):
                    gs = trace_sets[op.group]
                    posted[(op.group, gs.group_of(r))].setdefault(r, []).append(op)
    for (set_name, group), by_rank in posted.items():
        longest = max(by_rank.items(), key=lambda kv: (len(kv[1]), -kv[0]))
        for r in group:
            mine = by_rank.get(r, [])
            for i, op in enumerate(longest[1]):
                other = mine[i] if i < len(mine) else None
                if other is None or other.kind is not op.kind or other.bytes != op.bytes:
                    did = ("never posts it" if other is None else
                           f"posts {other.kind.value} of {other.bytes:.0f} B there instead")
                    raise SpecError(
                        f"{files.get(longest[0], 'rank %d' % longest[0])}: collective #{i} of "
                        f"process group {list(group)} ({op.kind.value} of {op.bytes:.0f} B, "
                        f"'{op.name}')", f"rank {r} {did}: the ranks' traces do not match "
                        "(a different step, a truncated file, or a rank that hung)")
    sends: dict = defaultdict(int)
    recvs: dict = defaultdict(int)
    for prog in programs:
        r = prog.ranks[0]
        for op in prog.ops:
            if isinstance(op, SendOp):
                sends[(r, op.peer)] += 1
            elif isinstance(op, RecvOp):
                recvs[(op.peer, r)] += 1
    for pair in sorted(set(sends) | set(recvs)):
        if sends[pair] != recvs[pair]:
            src, dst = pair
            raise SpecError(f"{files.get(src, 'rank %d' % src)}: send to rank {dst}",
                            f"rank {src} sends {sends[pair]} messages to rank {dst}, which "
                            f"receives {recvs[pair]}")


def assemble(recordings: Sequence[RankRecording], *, world_size: int | None = None,
             meta: dict | None = None) -> Trace:
    """The Trace of ``recordings`` (one per rank; or one standing for ``world_size`` ranks)."""
    if not recordings:
        raise SpecError("trace", "no files to import")
    stated = max(r.world_size for r in recordings)
    by_rank: dict[int, RankRecording] = {}
    for rec in recordings:
        if rec.rank in by_rank:
            raise SpecError(rec.file, f"rank {rec.rank} again (also {by_rank[rec.rank].file})")
        by_rank[rec.rank] = rec
    symmetric = world_size is not None
    if symmetric:
        if len(recordings) != 1:
            raise SpecError("--world-size", "stands for a symmetric job recorded in ONE rank's "
                            f"file; got {len(recordings)} files")
        world = world_size
    else:
        world = max(stated, len(recordings))
        missing = sorted(set(range(world)) - set(by_rank))
        if missing:
            raise SpecError(recordings[0].file, f"the job had {world} ranks but the files cover "
                            f"ranks {sorted(by_rank)}; rank {missing[0]} is missing (give every "
                            "rank's file, or --world-size N to let one rank's file stand for a "
                            "symmetric job)")
    groups = _Groups(world, symmetric)
    seq: dict = defaultdict(int)
    if symmetric:
        rec = recordings[0]
        programs = [_program(rec, groups, tuple(range(world)), seq)]
        if any(isinstance(o, (SendOp, RecvOp)) for o in programs[0].ops):
            raise SpecError(rec.file, "one rank's file cannot stand for a job with send/recv "
                            "(pipeline stages differ): give every rank's file")
    else:
        programs = [_program(by_rank[r], groups, (r,), seq) for r in range(world)]
    sets = {n: GroupSet(n, g) for n, g in groups.sets.items()}
    sets[WORLD_SET] = GroupSet(WORLD_SET, (tuple(range(world)),))
    _check_partners(programs, sets, {r: rec.file for r, rec in by_rank.items()})
    flops = sum(op.flops for p in programs for op in p.ops if isinstance(op, ComputeOp)
                and op.phase is not Phase.OPTIMIZER for _ in p.ranks)
    meta = {**(meta or {}), "peak_dtype": _main_dtype(programs)}
    return validate(Trace(world_size=world, programs=tuple(programs), group_sets=sets,
                          model_flops=flops, meta=meta))


def _main_dtype(programs: Sequence[Program]) -> str:
    """The arithmetic format of most GEMM FLOPs (MFU's peak); fp32 with none recorded."""
    flops: dict[str, float] = defaultdict(float)
    for op in programs[0].ops:
        if isinstance(op, ComputeOp):
            for k in op.kernels:
                if k.flops:
                    flops[k.dtype.value] += k.flops
    return max(flops, key=lambda d: (flops[d], d)) if flops else "fp32"
