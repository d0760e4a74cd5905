"""Run independent tasks where the user wants them: in this process, in local worker
processes, or on an existing Dask distributed cluster. Results come back as each task finishes
(in any order), so the caller can save each one at once.

Every backend runs the same pure function on the same inputs, so the results do not depend on
the backend or on the number of workers; only their arrival order does.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from clustersim.hardware_specs import SpecError


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent, which stops them and keeps what has finished."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_serial(fn: Callable[[Any], Any], tasks: Sequence[Any]) -> Iterator[Any]:
    for task in tasks:
        yield fn(task)


def run_processes(fn: Callable[[Any], Any], tasks: Sequence[Any], workers: int) -> Iterator[Any]:
    """A pool of ``workers`` fresh processes (spawned: nothing inherited but the task)."""
    context = multiprocessing.get_context("spawn")
    pool = context.Pool(workers, initializer=_ignore_sigint)
    try:
        yield from pool.imap_unordered(fn, tasks, chunksize=1)
        pool.close()
    finally:
        pool.terminate()
        pool.join()


def run_dask(fn: Callable[[Any], Any], tasks: Sequence[Any], address: str) -> Iterator[Any]:
    """The tasks on the Dask scheduler at ``address``; its workers need clustersim installed."""
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise SpecError("--dask", "needs dask.distributed: pip install 'clustersim[sweep]'") \
            from None
    try:
        client = Client(address, timeout=30)
    except (OSError, TimeoutError) as err:
        raise SpecError("--dask", f"cannot reach a Dask scheduler at {address}: {err}") from None
    futures = client.map(fn, list(tasks), pure=False)
    try:
        for future in as_completed(futures):
            yield future.result()
    finally:
        client.cancel(futures)
        client.close()


def run_tasks(fn: Callable[[Any], Any], tasks: Sequence[Any], workers: int = 1,
              dask_address: str | None = None) -> Iterator[Any]:
    """``fn(task)`` for every task, yielded as each finishes."""
    if dask_address:
        return run_dask(fn, tasks, dask_address)
    if workers < 1:
        raise SpecError("--workers", f"expected at least 1, got {workers}")
    if workers == 1 or len(tasks) <= 1:
        return run_serial(fn, tasks)
    return run_processes(fn, tasks, min(workers, len(tasks)))
