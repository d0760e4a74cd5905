"""Bring your own workload: profiler and Chakra traces in, Chakra traces out.

``import_files`` reads PyTorch profiler (Kineto) JSON or Chakra JSON, one file per rank (or one
rank's file standing for a symmetric job) and returns a Trace whose compute ops keep their
measured durations (``ComputeOp.measured_s``) and whose communication is left to the target
cluster's network model; ``meta["source"]`` records the files' hashes and what the recording says
about its device, framework, host and date. ``chakra_export.export_chakra`` writes a Trace as
Chakra JSON. Modules: ``kineto`` and ``chakra`` (formats), ``recording`` and ``assemble`` (a
rank's timeline -> the Trace), ``op_work`` (an operator's kernels from its shapes), ``scale``
(more data-parallel replicas), ``provenance``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.textfile import MAX_BYTES, read_text
from clustersim.workloads.trace import Trace
from clustersim.workloads.trace_import.assemble import assemble
from clustersim.workloads.trace_import.chakra import trace_from_chakra
from clustersim.workloads.trace_import.kineto import read_rank
from clustersim.workloads.trace_import.provenance import file_facts, provenance

FORMATS = ("kineto", "chakra")


@dataclass(frozen=True, slots=True)
class Imported:
    trace: Trace
    warnings: tuple[str, ...]


def _text(path: Path) -> str:
    if path.suffix != ".gz":
        return read_text(path, str(path))
    try:
        with gzip.open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except (OSError, EOFError) as err:
        raise SpecError(str(path), f"cannot read gzip data: {err}") from None
    if len(data) > MAX_BYTES:
        raise SpecError(str(path), f"over {MAX_BYTES // 2**20} MiB once decompressed")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(str(path), "not UTF-8 text once decompressed") from None


def detect(text: str, file: str) -> str:
    head = text[:4096]
    if '"traceEvents"' in head or '"traceEvents"' in text[:2_000_000]:
        return "kineto"
    if '"workload_graph"' in head or '"NodeType"' in head or '"COMP_NODE"' in text[:2_000_000] \
            or '"type"' in head:
        return "chakra"
    raise SpecError(file, "neither a PyTorch profiler trace (traceEvents) nor a Chakra JSON trace "
                    "(workload_graph, or nodes with id and type)")


def _guarded(read, data, name: str):
    """A value of an unexpected type deep in a file (a string where a shape should be) is a
    one-line error naming the file, not a traceback."""
    try:
        return read(data, name)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise SpecError(name, f"malformed trace: {type(err).__name__}: {err}"[:300]) from None


def _is_trace(text: str) -> bool:
    try:
        detect(text, "")
        return True
    except SpecError:
        return False


def _expand(paths: Sequence[Path]) -> list[Path]:
    """Folders stand for their *.json / *.json.gz files, sorted by the rank in the name."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(list(p.glob("*.json")) + list(p.glob("*.json.gz")), key=_rank_key)
            if not found:
                raise SpecError(str(p), "a folder with no .json or .json.gz trace files")
            out += found
        else:
            out.append(p)
    return out


def _rank_key(p: Path) -> tuple:
    digits = "".join(c if c.isdigit() else " " for c in p.name).split()
    return (int(digits[-1]) if digits else -1, p.name)


def import_files(paths: Sequence[Path | str], *, world_size: int | None = None,
                 recorded_on: str | None = None, tokens: float = 0.0) -> Imported:
    """Read trace files of one step into a Trace (see the module docstring)."""
    given = [Path(p) for p in paths]
    files = _expand(given)
    if world_size is not None and world_size < 1:
        raise SpecError("--world-size", f"expected a whole number >= 1, got {world_size}")
    texts = [(str(p), _text(p)) for p in files]
    if any(p.is_dir() for p in given):
        # A folder may hold other JSON too (measurements, notes): keep the traces.
        kept = [(p, nt) for p, nt in zip(files, texts) if p in given or _is_trace(nt[1])]
        files, texts = [p for p, _ in kept], [nt for _, nt in kept]
        if not files:
            raise SpecError(str(given[0]), "no trace files in the folder")
    formats = {detect(t, n) for n, t in texts}
    if len(formats) > 1:
        raise SpecError("FILES", f"mixes formats: {', '.join(sorted(formats))}")
    fmt = formats.pop()
    warnings: list[str] = []
    if fmt == "kineto":
        recordings = []
        for name, text in texts:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                raise SpecError(name, f"not valid JSON: {err.msg} (line {err.lineno}; a "
                                "truncated trace?)") from None
            except (ValueError, RecursionError) as err:
                raise SpecError(name, f"cannot be read: {err}") from None
            recordings.append(_guarded(read_rank, data, name))
        meta = {"source": provenance(fmt, files, recordings, recorded_on)}
        trace = assemble(recordings, world_size=world_size, meta=meta)
    else:
        source = {"format": fmt, "files": [file_facts(p) for p in files]}
        if recorded_on:
            source["recorded_on"] = recorded_on
        trace = _guarded(lambda t, _: trace_from_chakra(t, world_size=world_size,
                                                        warnings=warnings), texts, str(files[0]))
        meta = dict(trace.meta)
        meta["source"] = {**meta.get("source", {}), **source} if "source" in meta else source
        from dataclasses import replace
        trace = replace(trace, meta=meta)
    if tokens:
        from dataclasses import replace
        trace = replace(trace, tokens=float(tokens))
    return Imported(trace, tuple(warnings))
