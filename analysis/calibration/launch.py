"""Start a function on N ranks with torch.distributed (gloo on CPUs, NCCL on GPUs) and collect
what each rank returns.

Ranks are spawned processes (``multiprocessing`` spawn), so the parent never imports CUDA state
into its children. A rank that fails takes the others down: the parent terminates the rest
and raises with the failed rank's traceback, instead of waiting on a collective that will
never complete.
"""

from __future__ import annotations

import datetime
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clustersim.hardware_specs import SpecError

COLLECTIVE_TIMEOUT_S = 300
"""How long a rank waits in one collective before torch.distributed gives up."""
POLL_S = 0.5
"""How often the parent looks for ranks that died without reporting."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankEnv:
    """Where a rank runs: its rank, the world, the device and its thread budget."""

    rank: int
    world: int
    device: str
    """``cpu`` or ``cuda``."""
    threads: int
    """Intra-op threads of this rank (CPU: cores it may use)."""

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def torch_device(self):
        import torch
        return torch.device("cuda", self.rank % torch.cuda.device_count()) \
            if self.device == "cuda" else torch.device("cpu")


def synchronize(env: RankEnv) -> None:
    """Wait for queued device work (CUDA kernels run asynchronously; CPU ops do not)."""
    if env.device == "cuda":
        import torch
        torch.cuda.synchronize()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, device: str, threads: int, port: int,
               fn: Callable[..., Any], args: tuple, results) -> None:
    import torch
    import torch.distributed as dist
    env = RankEnv(rank=rank, world=world, device=device, threads=threads)
    try:
        torch.set_num_threads(threads)
        if device == "cuda":
            torch.cuda.set_device(env.torch_device())
        dist.init_process_group(env.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        try:
            out = fn(env, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, out))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        results.put((rank, False, traceback.format_exc()))


def run_ranks(fn: Callable[..., Any], world: int, args: tuple = (), *, device: str = "cpu",
              threads: int = 1, timeout_s: float = 1800.0) -> list[Any]:
    """``fn(env, *args)`` on ``world`` ranks; returns each rank's result, rank 0 first.

    ``fn`` must be importable (a module-level function): spawned ranks import it afresh."""
    import torch.multiprocessing as mp
    if world < 1:
        raise SpecError("world", f"expected at least 1 rank, got {world}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = []
    for rank in range(world):
        p = ctx.Process(target=_rank_main, daemon=True,
                        args=(rank, world, device, threads, port, fn, args, results))
        p.start()
        procs.append(p)
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < world:
            try:
                rank, ok, value = results.get(timeout=POLL_S)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode is not None]
                if dead:
                    raise RuntimeError(f"rank {dead[0]} of {world} exited with code "
                                       f"{procs[dead[0]].exitcode} and no result") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ranks {sorted(set(range(world)) - set(out))} gave no "
                                       f"result within {timeout_s:.0f} s") from None
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} of {world} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10 if len(out) == world else 0.1)
            if p.is_alive():
                p.terminate()
                p.join()
    return [out[r] for r in range(world)]
