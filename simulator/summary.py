"""From a replay's records to the step's result: each class's breakdown, the critical class
(the one that finishes last; the lower index on a tie), and the step's metrics."""

from __future__ import annotations

from collections.abc import Sequence

from clustersim.hardware_specs import ClusterSpec
from clustersim.simulator.attribution import breakdown
from clustersim.simulator.metrics import step_metrics
from clustersim.simulator.records import ClassTimeline, OpRecord, Replay
from clustersim.simulator.result import ClassSummary, StepResult
from clustersim.workloads.trace import Trace


def drawn(timeline: ClassTimeline) -> tuple[OpRecord, ...]:
    """Records as a timeline shows them: a receive posted early (the pipeline posts them as
    soon as their deps are done) is drawn from when its data could start to arrive, the
    matching send's posting, not from when it was posted."""
    posted = timeline.send_posted_s
    return tuple(r._replace(start=max(r.start, posted[r.op_id])) if r.op_id in posted else r
                 for r in timeline.records)


def critical_position(finish_s: Sequence[float], indices: Sequence[int]) -> int:
    """Where the critical class is among classes finishing at ``finish_s`` with class indices
    ``indices``: the one that finishes last, the lower index on a tie."""
    return max(range(len(finish_s)), key=lambda i: (finish_s[i], -indices[i]))


def summarize(replay: Replay, trace: Trace, cluster: ClusterSpec, capacities: tuple[float, ...],
              keep_records: bool = True) -> StepResult:
    """``capacities``: device memory each program may use."""
    summaries = []
    for tl in replay.timelines:
        prog = trace.programs[tl.rank_class.program]
        summaries.append(ClassSummary(tl.rank_class.index, prog.name, tl.rank_class.multiplicity,
                                      tl.rank_class.representative, tl.finish_s,
                                      breakdown(prog.ops, tl)))
    critical = summaries[critical_position([s.finish_s for s in summaries],
                                           [s.index for s in summaries])]
    step = critical.finish_s
    m = step_metrics(step, trace, cluster, capacities)
    records = tuple(r for tl in replay.timelines for r in drawn(tl)) if keep_records else ()
    return StepResult(
        step_time_s=step,
        tokens_per_s=m.tokens_per_s,
        tflops_per_gpu=m.tflops_per_gpu,
        mfu=m.mfu,
        peak_memory_gb=m.peak_memory_bytes / 1e9,
        fits_in_memory=m.fits_in_memory,
        breakdown=critical.breakdown,
        critical_class=critical.index,
        classes=tuple(summaries),
        events=replay.events,
        wall_time_s=replay.wall_time_s,
        records=records,
        rank_finish_s=replay.rank_finish_s,
    )
