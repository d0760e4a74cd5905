"""Communication as training pays for it: collectives between bursts of compute, and
collectives that run while the same ranks compute.

- ``collective`` records: the time a synchronous collective adds to a loop of compute bursts
  (a transformer block's GEMM, about 2 ms on a core), the loop with and without it timed in
  turns. That is what a tensor-parallel all-reduce costs a step: the transfer, and on a CPU
  the wake-up of the communication thread and the wait for the peer that is still computing
  (on two cores a gloo all-reduce of 512 KiB took 1.0 ms back to back but added 2-3 ms to a
  loop of 2-ms GEMMs).
- ``overlap`` records: an asynchronous collective started before a run of small GEMMs (as DDP
  starts a bucket's all-reduce and backward goes on), with when it completed and how much longer
  the GEMMs took than alone. On a CPU gloo's copies and reductions run on the cores that
  compute, so both slow down; ``fit`` turns this into the device's
  ``compute_slowdown_when_overlapped`` and ``comm_slowdown_when_overlapped``.

Every rank runs the same sequence (collectives must match); rank 0's timings are recorded.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from clustersim.analysis.calibration.launch import RankEnv, synchronize

LOOP_REPS = 4
"""Bursts per timed loop (with or without a collective after each)."""


def _loop_time(fn: Callable[[], object], env: RankEnv, reps: int) -> float:
    """Mean time of ``fn`` over ``reps`` calls, every rank starting together."""
    synchronize(env)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    synchronize(env)
    return (time.perf_counter() - start) / reps


def _compute_burst(device) -> Callable[[], object]:
    """About 0.2 GFLOP of GEMM (a QKV projection of 512 tokens at h = 256): ~2 ms on a core."""
    a, w = torch.randn(512, 256, device=device), torch.randn(768, 256, device=device)
    return lambda: torch.mm(a, w.t())


def _small_gemm(device) -> Callable[[], object]:
    """About 0.03 GFLOP: fine enough steps to see when an overlapped collective completes."""
    a, w = torch.randn(256, 256, device=device), torch.randn(256, 256, device=device)
    return lambda: torch.mm(a, w.t())


def _ping_pong(env: RankEnv, buf: torch.Tensor) -> Callable[[], None]:
    """Ranks 0 and 1 send ``buf`` there and back (others idle): twice the one-way time."""
    if env.rank >= 2:
        return lambda: None
    peer = 1 - env.rank

    def run() -> None:
        if env.rank == 0:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
    return run


def _collectives(env: RankEnv, nbytes: int, device) -> tuple[int, dict[str, Callable]]:
    """Elements per rank buffer and the operations on buffers of about ``nbytes`` (bytes as
    nccl-tests counts them: the all-reduce buffer, the gathered all-gather output, the
    reduce-scatter input)."""
    w = env.world
    n = max(w, nbytes // 4 // w * w)
    full, part = torch.ones(n, device=device), torch.ones(n // w, device=device)
    return n, {
        "all_reduce": lambda async_op=False: dist.all_reduce(full, async_op=async_op),
        "all_gather": lambda async_op=False: dist.all_gather_single(full, part,
                                                                   async_op=async_op),
        "reduce_scatter": lambda async_op=False: dist.reduce_scatter_single(part, full,
                                                                           async_op=async_op),
        "send_recv": _ping_pong(env, full),
    }


def comm_rank(env: RankEnv, message_bytes: tuple[int, ...], trials: int) -> list[dict]:
    """``collective`` records: what each operation adds to a loop of compute bursts (median
    over ``trials`` of the loop with it minus the loop without, the loops taken in turns so
    a slow spell of the host hits both); send/recv one way (half a ping-pong)."""
    device = env.torch_device()
    burst = _compute_burst(device)
    records = []
    for nbytes in message_bytes:
        n, ops = _collectives(env, nbytes, device)
        loops = {"burst": burst} | {op: (lambda fn=fn: (burst(), fn())) for op, fn in ops.items()}
        times: dict[str, list[float]] = {name: [] for name in loops}
        for _ in range(trials):
            for name, fn in loops.items():
                times[name].append(_loop_time(fn, env, LOOP_REPS))
        base = times["burst"]
        for op in ops:
            extra = statistics.median(x - c for x, c in zip(times[op], base))
            records.append({"kind": "collective", "op": op, "world": env.world, "bytes": 4 * n,
                            "time_s": extra / 2 if op == "send_recv" else extra,
                            "burst_s": statistics.median(base)})
    return records


def overlap_rank(env: RankEnv, message_bytes: tuple[int, ...], trials: int) -> list[dict]:
    """``overlap`` records: an asynchronous all-reduce started before a run of small GEMMs
    long enough to outlast it; when it completed (``transfer_s``), the GEMMs' time with it
    (``overlapped_s``, waiting for it included) and alone (``compute_s``)."""
    device = env.torch_device()
    gemm = _small_gemm(device)
    gemm_s = _loop_time(gemm, env, 50)
    records = []
    for nbytes in message_bytes:
        n, ops = _collectives(env, nbytes, device)
        start_op = ops["all_reduce"]
        alone = statistics.median(_loop_time(start_op, env, 1) for _ in range(trials))
        reps = math.ceil(3.0 * alone / gemm_s) + 1

        def compute() -> None:
            for _ in range(reps):
                gemm()

        def overlapped() -> float:
            """Seconds until the collective completed, seen between GEMMs."""
            start = time.perf_counter()
            work = start_op(async_op=True)
            done = None
            for _ in range(reps):
                gemm()
                if done is None and work.is_completed():
                    done = time.perf_counter() - start
            work.wait()
            return done if done is not None else time.perf_counter() - start

        rows = []
        for _ in range(trials):
            c = _loop_time(compute, env, 1)
            synchronize(env)
            dist.barrier()
            start = time.perf_counter()
            transfer = overlapped()
            synchronize(env)
            rows.append((c, time.perf_counter() - start, transfer))
        c, x, t = (statistics.median(col) for col in zip(*rows))
        records.append({"kind": "overlap", "op": "all_reduce", "world": env.world,
                        "bytes": 4 * n, "alone_s": alone, "compute_s": c, "overlapped_s": x,
                        "transfer_s": t,
                        "extra_s": statistics.median(x_ - c_ for c_, x_, _ in rows)})
    return records


def comm_and_overlap_rank(env: RankEnv, message_bytes: tuple[int, ...],
                          overlap_bytes: tuple[int, ...], trials: int) -> list[dict]:
    return comm_rank(env, message_bytes, trials) + overlap_rank(env, overlap_bytes, trials)
