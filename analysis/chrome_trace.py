"""Chrome/Perfetto trace export: a process per rank class, a thread per stream.

Format: the Trace Event Format's JSON object form (``{"traceEvents": [...]}``) with complete
events (``ph: "X"``, ``ts``/``dur`` in microseconds) and metadata events naming processes and
threads, as chrome://tracing and Perfetto's JSON importer read it.
"""

from __future__ import annotations

import json
from pathlib import Path

from clustersim.simulator.result import StepResult
from clustersim.workloads.trace import Stream

STREAM_ORDER = tuple(s.value for s in Stream)
"""Threads of a rank class: compute, one per parallel axis, host copies."""


def chrome_trace(result: StepResult) -> dict:
    events: list[dict] = []
    for c in result.classes:
        events.append({"ph": "M", "name": "process_name", "pid": c.index, "tid": 0,
                       "args": {"name": f"class {c.index}: {c.program} x{c.ranks} "
                                        f"(rank {c.representative})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": c.index, "tid": 0,
                       "args": {"sort_index": c.index}})
        for tid, stream in enumerate(STREAM_ORDER):
            events.append({"ph": "M", "name": "thread_name", "pid": c.index, "tid": tid,
                           "args": {"name": stream}})
    tids = {s: i for i, s in enumerate(STREAM_ORDER)}
    for r in result.records:
        events.append({"ph": "X", "name": r.name, "cat": r.category, "pid": r.rank_class,
                       "tid": tids.get(r.stream, len(STREAM_ORDER)),
                       "ts": r.start * 1e6, "dur": max(0.0, (r.end - r.start) * 1e6)})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"step_time_s": result.step_time_s}}


def write_chrome_trace(result: StepResult, path: Path) -> None:
    path.write_text(json.dumps(chrome_trace(result)))
