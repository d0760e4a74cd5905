"""Where an imported trace came from: each file's name, size and SHA-256, and what the
recording says about its device, framework, host and date."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from clustersim.workloads.trace_import.recording import RankRecording


def file_facts(path: Path) -> dict:
    data = path.read_bytes()
    return {"name": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def provenance(fmt: str, paths: Sequence[Path], recordings: Sequence[RankRecording],
               recorded_on: str | None) -> dict:
    """The ``meta["source"]`` of an imported trace."""
    facts = recordings[0].facts if recordings else {}
    out = {"format": fmt, "files": [file_facts(p) for p in paths]}
    for key in ("device", "framework", "host", "recorded", "backend"):
        values = sorted({str(r.facts.get(key)) for r in recordings if r.facts.get(key)})
        if values:
            out[key] = values[0] if len(values) == 1 else values
    out.update({k: v for k, v in facts.items() if k not in out})
    if recorded_on:
        out["recorded_on"] = recorded_on
    return out
