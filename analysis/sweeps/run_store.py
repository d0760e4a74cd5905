"""A sweep's folder on disk: a manifest, the candidates, and the points streamed as they finish.

    manifest.json    what the results depend on: config hash, space, seed, catalog and
                     calibration ids, package versions; a rerun with another one is refused
    config.yaml      the config as read (the report re-reads it)
    candidates.csv   every enumerated strategy with its status and memory (rewritten whole)
    points.csv       one line per simulated point, appended and flushed as each finishes

A line is written with one ``write`` and then flushed and synced, so a sweep killed at any
moment (SIGINT or SIGKILL) leaves every finished point on disk. Each line ends with a checksum
of its fields: a torn, damaged or repeated line is ignored by readers, dropped (and reported)
by the next sweep, and that point simulated again; no strategy is ever ranked twice.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import platform
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from clustersim.hardware_specs import SpecError

from clustersim.analysis.config import RunConfig

MANIFEST = "manifest.json"
CONFIG = "config.yaml"
CANDIDATES = "candidates.csv"
POINTS = "points.csv"
RANKING = "ranking.csv"
COMPARE = "compare.csv"
"""What ``clustersim compare --out`` writes: the clusters side by side."""

IDENTITY_KEYS = ("config_hash", "space", "catalog_id", "calibration_id", "versions")
"""Manifest entries that must match for a rerun to reuse the points already in a folder."""
WARN_KEYS = ("code_id",)
"""Entries that only warn: a source checkout changes its code between runs of one release."""

PACKAGES = ("clustersim", "simpy", "numpy", "pandas")

CHECK = "check"
"""The last column of points.csv: a hash of the line's other fields."""
MAX_LINE = 64 * 1024
"""No point's line comes near it (an error message is cut to a line); a longer one is damage."""


def digest(data: Any) -> str:
    """A short, stable hash of JSON-able data (keys sorted)."""
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def catalog_id(config: RunConfig) -> str:
    """Hash of every catalog file the config's catalog was read from."""
    h = hashlib.sha256()
    for path in sorted(set(config.catalog.origin.values())):
        h.update(Path(path).name.encode())
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


def calibration_id(config: RunConfig) -> str:
    """Hash of the device's efficiency entry: calibration changes exactly this."""
    return digest(repr(config.cluster.device.efficiency))


SIMULATION_PACKAGES = ("hardware_specs", "workloads", "simulator")


def code_id() -> str:
    """Hash of the simulation code (an engine change makes old points stale)."""
    h = hashlib.sha256()
    base = Path(__file__).resolve().parents[2]   # the clustersim package root
    for package in SIMULATION_PACKAGES:
        for path in sorted((base / package).rglob("*.py")):
            h.update(str(path.relative_to(base)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def manifest(config: RunConfig, raw_config: Mapping, space: dict, seed: int) -> dict:
    """What the points of a sweep depend on; ``costs`` and ``failures`` are applied after the
    sweep, so changing them reuses the points."""
    simulated = {k: v for k, v in raw_config.items()
                 if k not in ("name", "description", "costs", "failures")}
    return {
        "name": config.name,
        "config_hash": digest(simulated),
        "space": space,
        "seed": seed,
        "catalog_id": catalog_id(config),
        "calibration_id": calibration_id(config),
        "code_id": code_id(),
        "catalog_dirs": sorted({str(Path(p).parent) for p in config.catalog.origin.values()}),
        "versions": versions(),
    }


class RunStore:
    """Reads and writes one sweep folder."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, name: str) -> Path:
        return self.root / name

    def open(self, fresh_manifest: dict, raw_config: Mapping) -> None:
        """Create the folder, or check that it holds the same sweep (else refuse)."""
        self.root.mkdir(parents=True, exist_ok=True)
        old = self.read_manifest()
        if old is not None:
            for key in IDENTITY_KEYS:
                if old.get(key) != fresh_manifest.get(key):
                    raise SpecError("--out", f"{self.root} holds a sweep with another {key} "
                                    f"({_short(old.get(key))} here, {_short(fresh_manifest.get(key))} "
                                    "now); use another folder or delete it")
            for key in WARN_KEYS:
                if old.get(key) != fresh_manifest.get(key):
                    print(f"warning: {self.root}: points so far came from simulation code "
                          f"{old.get(key)}, this run is {fresh_manifest.get(key)}",
                          file=sys.stderr)
        atomic_write(self.path(MANIFEST), json.dumps(fresh_manifest, indent=2) + "\n")
        atomic_write(self.path(CONFIG), yaml.safe_dump(dict(raw_config), sort_keys=False))

    def read_manifest(self) -> dict | None:
        p = self.path(MANIFEST)
        return json.loads(p.read_text()) if p.exists() else None

    def write_candidates(self, rows: list[dict]) -> None:
        atomic_write(self.path(CANDIDATES), to_csv(rows))

    def points_text(self) -> str:
        """The points as CSV text without the checksum column: the header, then every intact
        line, each key once (the first). Readers never modify the file: a sweep may be
        appending."""
        return _points(self._raw_points())[0]

    def read_points(self) -> dict[str, dict]:
        """Finished points by key."""
        return {row["key"]: row for row in csv.DictReader(io.StringIO(self.points_text()))}

    def repair(self) -> list[str]:
        """Drop torn, damaged and repeated lines before appending (only the writer calls this);
        what was dropped is reported on stderr and returned, and those points run again."""
        p = self.path(POINTS)
        raw = self._raw_points()
        text, dropped = _points(raw)
        if dropped:
            print(f"warning: {p}: dropped {len(dropped)} line(s) that will be simulated again: "
                  + "; ".join(dropped[:5]) + (" ..." if len(dropped) > 5 else ""), file=sys.stderr)
        rows = list(csv.reader(io.StringIO(text)))
        fresh = "".join(_line(r, header=(i == 0)) for i, r in enumerate(rows))
        if fresh != raw:
            atomic_write(p, fresh)
        return dropped

    def _raw_points(self) -> str:
        p = self.path(POINTS)
        return p.read_text(errors="replace") if p.exists() else ""

    def append_point(self, row: dict) -> None:
        """One finished point: a single write of a whole line, then flush and fsync."""
        p = self.path(POINTS)
        text = _line(list(row), header=True) if not p.exists() or p.stat().st_size == 0 else ""
        if not text:
            with p.open(newline="", errors="replace") as fh:
                header = next(csv.reader(fh))
            if header != [*row, CHECK]:
                raise SpecError("--out", f"{p} has columns {header}, expected {[*row, CHECK]}")
        text += _line(["" if v is None else str(v) for v in row.values()])
        with p.open("a", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())


def _checksum(fields: list[str]) -> str:
    return hashlib.sha256("\x1f".join(fields).encode()).hexdigest()[:12]


def _line(fields: list[str], header: bool = False) -> str:
    """One CSV line of ``fields`` and their checksum (or the checksum column's name); values
    are kept to one line, so that a line is a record."""
    fields = [" ".join(f.splitlines()) for f in fields]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([*fields, CHECK if header else _checksum(fields)])
    return buf.getvalue()


def _points(raw: str) -> tuple[str, list[str]]:
    """(CSV text of the intact, first-seen points without the checksum; why each other line
    was dropped). A folder written before checksums existed is read by field count alone."""
    lines = raw.split("\n")
    header = _fields(lines[0])
    if not header or "key" not in header:
        return "", (["line 1: not a points header"] if raw.strip() else [])
    checked = header[-1] == CHECK
    names = header[:-1] if checked else header
    rows, seen, dropped = [], set(), []
    complete = lines[1:-1]                     # the text after the last newline is torn
    if lines[-1]:
        dropped.append(f"line {len(lines)}: torn (no end of line)")
    for number, line in enumerate(complete, start=2):
        fields = _fields(line)
        if fields is None or len(fields) != len(header):
            dropped.append(f"line {number}: damaged")
            continue
        values = fields[:-1] if checked else fields
        if checked and fields[-1] != _checksum(values):
            dropped.append(f"line {number}: checksum mismatch")
            continue
        key = values[names.index("key")]
        if key in seen:
            dropped.append(f"line {number}: {key} again")
            continue
        seen.add(key)
        rows.append(values)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(names)
    writer.writerows(rows)
    return buf.getvalue(), dropped


def _fields(line: str) -> list[str] | None:
    if not line or len(line) > MAX_LINE:
        return None
    try:
        return next(csv.reader([line]))
    except (csv.Error, StopIteration):
        return None


def to_csv(rows: Iterable[dict]) -> str:
    rows = list(rows)
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue()


def atomic_write(path: Path, text: str) -> None:
    """Write to a temporary file and rename it over ``path`` (never a half-written file)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."
