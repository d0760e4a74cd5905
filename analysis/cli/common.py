"""Helpers shared by the command modules."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path


def add_command(sub: argparse._SubParsersAction, name: str, *, help: str,
                examples: Sequence[tuple[str, str]], description: str = "") -> argparse.ArgumentParser:
    """A command's parser whose ``--help`` ends with worked examples: (command line, what it
    does). ``tests/test_cli_help.py`` parses every example, so none can drift from the flags."""
    lines = ["examples:"]
    for command, what in examples:
        lines += [f"  {command}", f"      {what}"]
    return sub.add_parser(name, help=help, description=description or help,
                          epilog="\n".join(lines),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def int_at_least(minimum: int):
    """argparse type for a whole number >= ``minimum``: counts, seeds, warm-up steps."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, "
                                             f"got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {value}")
        return value
    return parse


positive_int = int_at_least(1)
"""argparse type for counts (workers, rows): a whole number >= 1."""
non_negative_int = int_at_least(0)


def output_path(text: str) -> str:
    """argparse type for a file or folder to write: not empty (``--json ''`` wrote nothing)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path to write, got an empty string")
    return text


def output_file(text: str) -> str:
    """argparse type for a file the command writes once it has computed it: checked before the
    computation (a failures study or a replayed table can run for minutes), since the command
    does not create the file's folder."""
    path = Path(output_path(text))
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file to write, got the folder {text}")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"cannot write {text}: its folder {folder} {what}")
    return text


def add_catalog_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", action="append", default=[], metavar="DIR",
                   help="extra hardware catalog directory or YAML file (repeatable)")


def add_progress_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress on stderr: a bar on a terminal, a line every few seconds "
                        "otherwise (default: on)")


def add_parallel_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=positive_int, default=os.cpu_count() or 1, metavar="N",
                   help="local worker processes (default: one per CPU)")
    p.add_argument("--dask", metavar="SCHEDULER_ADDRESS",
                   help="run on an existing Dask distributed cluster instead")
    add_progress_option(p)


def _strict(value):
    """NaN and infinity are not JSON: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def write_json(data, path: str | Path) -> None:
    """Write ``data`` as indented JSON (keys in insertion order, stable across runs)."""
    Path(path).write_text(json.dumps(_strict(data), indent=2, allow_nan=False) + "\n")


def check_sections(config) -> None:
    """A typo in the costs, sweep, failures or faults section is an error for every command
    that reads the config, not only for the command that uses the section."""
    from clustersim.analysis.failures.config import failure_spec
    from clustersim.analysis.step import step_faults
    from clustersim.analysis.sweeps.costs import costs_for
    from clustersim.analysis.sweeps.space import space_from_mapping

    sections = config.sections
    if "costs" in sections:
        costs_for(sections["costs"], config.cluster, config.catalog)
    if "sweep" in sections:
        space_from_mapping(sections["sweep"])
    if "failures" in sections:
        failure_spec(config)
    step_faults(config)


def load_checked_config(path, catalog_dirs=()):
    """``analysis.config.load_config`` with every optional section checked."""
    from clustersim.analysis.config import load_config
    config = load_config(path, catalog_dirs)
    check_sections(config)
    return config
