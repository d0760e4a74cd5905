"""``clustersim simulate CONFIG``: one training step, its breakdown and memory."""

from __future__ import annotations

import argparse
from pathlib import Path

from hardware_specs import SpecError

from analysis.cli_common import add_catalog_option, output_path, write_json

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EXAMPLE = "examples/llama3_70b_h100.yaml"


def default_config() -> Path:
    for base in (Path.cwd(), REPO_ROOT):
        candidate = base / DEFAULT_EXAMPLE
        if candidate.exists():
            return candidate
    raise SpecError("CONFIG", f"no config given and {DEFAULT_EXAMPLE} not found")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate one training step of a config")
    p.add_argument("config", nargs="?", help=f"run config YAML (default: {DEFAULT_EXAMPLE})")
    p.add_argument("--json", type=output_path, metavar="OUT", help="write the result as JSON")
    p.add_argument("--trace", type=output_path, metavar="OUT",
                   help="write a Chrome/Perfetto trace JSON")
    add_catalog_option(p)
    p.set_defaults(func=run)


def check_other_sections(config) -> None:
    """A typo in the costs, sweep or failures section is an error here too, not only when the
    command that reads it runs."""
    from analysis.costs import costs_from_mapping
    from analysis.failures_config import failure_spec
    from analysis.space import space_from_mapping

    sections = config.sections
    if "costs" in sections:
        costs_from_mapping(sections["costs"])
    if "sweep" in sections:
        space_from_mapping(sections["sweep"])
    if "failures" in sections:
        failure_spec(config)


def run(args: argparse.Namespace) -> int:
    from analysis.chrome_trace import write_chrome_trace
    from analysis.config import load_config
    from analysis.step import run_step
    from analysis.summary import summary

    config = load_config(args.config or default_config(), args.catalog)
    check_other_sections(config)
    report = run_step(config)
    print(summary(report))
    if args.json:
        write_json(report.to_dict(), args.json)
        print(f"\nwrote {args.json}")
    if args.trace:
        write_chrome_trace(report.result, Path(args.trace))
        print(f"wrote {args.trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    return 0
