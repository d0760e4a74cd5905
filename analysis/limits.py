"""Work budgets: a run that would take far longer than any ordinary one says so before it
starts (exit 2, naming the way past it), instead of running for minutes or exhausting memory.

The budgets are counts of the work the engine and the network model do, measured on a 2-core
machine: a layer pass (one micro-batch through one layer, forward or backward, of one rank
class) costs about 25 engine events and 0.1 ms; a collective row costs about 70 us per GPU.
"""

from __future__ import annotations

from clustersim.hardware_specs import SpecError
from clustersim.workloads import Job

LAYER_PASS_BUDGET = 500_000
"""About a minute of engine time. The Llama-3-70B example needs 10,240; GPT-3 175B on 1,024
A100 with 1,536 micro-batches 147,456."""
COLLECTIVE_ROW_BUDGET = 600_000
"""GPUs x sizes of ``clustersim collective``: about 40 s (16,384 GPUs x 31 sizes is 507,904)."""


def layer_passes(job: Job, per_rank: bool = False) -> float:
    """Layer passes the engine replays for ``job``: micro-batches x layers x context-parallel
    steps, twice for ZeRO-3's gathers; every data-parallel replica again when each rank is a
    class of its own (an expanded run with interference on; otherwise an expanded run follows
    the ranks as lanes of the collapsed run's classes)."""
    s = job.strategy
    passes = job.micro_batches * job.model.layers * s.cp * (2 if s.zero == 3 else 1)
    return passes * (s.world_size // s.pp if per_rank else 1)


def check_budget(work: float, budget: float, what: str, way_past: str) -> None:
    """Refuse ``work`` above ``budget``; ``way_past`` names the flag or field that allows it."""
    if work > budget:
        raise SpecError(way_past, f"{what} is {work:,.0f}, over the budget of {budget:,.0f} "
                                  f"(about a minute of work); set {way_past} to run it anyway")
