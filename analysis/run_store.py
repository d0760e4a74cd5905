"""A sweep's folder on disk: a manifest, the candidates, and the points streamed as they finish.

    manifest.json    what the results depend on: config hash, space, seed, catalog and
                     calibration ids, package versions; a rerun with another one is refused
    config.yaml      the config as read (the report re-reads it)
    candidates.csv   every enumerated strategy with its status and memory (rewritten whole)
    points.csv       one line per simulated point, appended and flushed as each finishes

A line is written with one ``write`` and then flushed and synced, so a sweep killed at any
moment (SIGINT or SIGKILL) leaves every finished point on disk; a torn last line (killed while
writing) is ignored by readers, cut by the next sweep, and that point simulated again.
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

IDENTITY_KEYS = ("config_hash", "space", "catalog_id", "calibration_id", "versions")
"""Manifest entries that must match for a rerun to reuse the points already in a folder."""
WARN_KEYS = ("code_id",)
"""Entries that only warn: a source checkout changes its code between runs of one release."""

PACKAGES = ("clustersim", "simpy", "numpy", "pandas")


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
    base = Path(__file__).resolve().parents[1]
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
        """The complete lines of points.csv (a torn last line, left by a kill in the middle of
        a write, is not a point). Readers never modify the file: a sweep may be appending."""
        p = self.path(POINTS)
        text = p.read_text() if p.exists() else ""
        return text[: text.rfind("\n") + 1]

    def read_points(self) -> dict[str, dict]:
        """Finished points by key."""
        return {row["key"]: row for row in csv.DictReader(io.StringIO(self.points_text()))}

    def repair(self) -> None:
        """Cut a torn last line before appending (only the writer calls this)."""
        p = self.path(POINTS)
        if p.exists():
            text = self.points_text()
            if len(text) != p.stat().st_size:
                atomic_write(p, text)

    def append_point(self, row: dict) -> None:
        """One finished point: a single write of a whole line, then flush and fsync."""
        p = self.path(POINTS)
        new = not p.exists() or p.stat().st_size == 0
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(row), lineterminator="\n")
        if new:
            writer.writeheader()
        else:
            with p.open(newline="") as fh:
                header = next(csv.reader(fh))
            if header != list(row):
                raise SpecError("--out", f"{p} has columns {header}, expected {list(row)}")
        writer.writerow(row)
        with p.open("a", newline="") as fh:
            fh.write(buf.getvalue())
            fh.flush()
            os.fsync(fh.fileno())


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
