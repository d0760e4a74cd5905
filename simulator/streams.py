"""How a class's ops become SimPy processes: one per stream, run in order (CUDA-stream semantics),
except the pp stream, whose sends and recvs are each posted on their own as soon as their deps are
done (NCCL's non-blocking isend/irecv), so neighbouring stages never deadlock."""

from __future__ import annotations

from clustersim.workloads.trace import Op, Stream


def stream_runs(ops: tuple[Op, ...], previous: list[int]) -> list[list[Op]]:
    """The op lists to run as one process each, in a fixed order; fills ``previous`` (op id ->
    the op before it on its stream, -1 for the first and for pp ops)."""
    by_stream: dict[Stream, list[Op]] = {}
    for op in ops:
        by_stream.setdefault(op.stream, []).append(op)
    runs: list[list[Op]] = []
    for stream, members in by_stream.items():
        if stream is Stream.PP:
            runs.extend([op] for op in members)
        else:
            for before, after in zip(members, members[1:]):
                previous[after.id] = before.id
            runs.append(members)
    return runs
