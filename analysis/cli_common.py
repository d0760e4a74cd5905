"""Helpers shared by the command modules."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_catalog_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", action="append", default=[], metavar="DIR",
                   help="extra hardware catalog directory or YAML file (repeatable)")


def write_json(data, path: str | Path) -> None:
    """Write ``data`` as indented JSON (keys in insertion order, stable across runs)."""
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
