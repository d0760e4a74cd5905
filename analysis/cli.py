"""The ``clustersim`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hardware_specs import SpecError, load_catalog

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EXAMPLE = "examples/llama3_70b_h100.yaml"


def _default_config() -> Path:
    for base in (Path.cwd(), REPO_ROOT):
        candidate = base / DEFAULT_EXAMPLE
        if candidate.exists():
            return candidate
    raise SpecError("CONFIG", f"no config given and {DEFAULT_EXAMPLE} not found")


def _write_json(data, path: str) -> None:
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def cmd_simulate(args: argparse.Namespace) -> int:
    from analysis.chrome_trace import write_chrome_trace
    from analysis.config import load_config
    from analysis.step import run_step
    from analysis.summary import summary

    config = load_config(args.config or _default_config(), args.catalog)
    report = run_step(config)
    print(summary(report))
    if args.json:
        _write_json(report.to_dict(), args.json)
        print(f"\nwrote {args.json}")
    if args.trace:
        write_chrome_trace(report.result, Path(args.trace))
        print(f"wrote {args.trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from analysis.hardware_cmd import list_catalog, show

    catalog = load_catalog(args.catalog)
    if args.action == "list":
        print(list_catalog(catalog))
    else:
        if not args.name:
            raise SpecError("NAME", "`clustersim hardware show NAME` needs a name")
        text, data = show(catalog, args.name)
        print(json.dumps(data, indent=2) if args.json_out else text)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from analysis.validate import render_outcomes, summarize, validate_rows

    path = Path(args.runs)
    if not path.exists():
        raise SpecError("--runs", f"no such file: {path}")
    outcomes = validate_rows(path, load_catalog(args.catalog))
    print(render_outcomes(outcomes))
    if args.json:
        _write_json({"summary": summarize(outcomes).to_dict(),
                     "rows": [o.to_dict() for o in outcomes]}, args.json)
        print(f"\nwrote {args.json}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clustersim",
        description="Discrete-event simulator of GPU training clusters: step time, memory, "
                    "failures and strategy comparisons.")
    sub = parser.add_subparsers(dest="command", required=True)

    def catalog_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--catalog", action="append", default=[], metavar="DIR",
                       help="extra hardware catalog directory or YAML file (repeatable)")

    p = sub.add_parser("simulate", help="simulate one training step of a config")
    p.add_argument("config", nargs="?", help=f"run config YAML (default: {DEFAULT_EXAMPLE})")
    p.add_argument("--json", metavar="OUT", help="write the result as JSON")
    p.add_argument("--trace", metavar="OUT", help="write a Chrome/Perfetto trace JSON")
    catalog_option(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("hardware", help="list or show the hardware catalog")
    p.add_argument("action", choices=["list", "show"])
    p.add_argument("name", nargs="?", help="device, node, fabric, tier or failure model")
    p.add_argument("--json", dest="json_out", action="store_true", help="print JSON")
    catalog_option(p)
    p.set_defaults(func=cmd_hardware)

    p = sub.add_parser("validate", help="compare predictions with published runs")
    p.add_argument("--runs", required=True, metavar="FILE.csv", help="published-runs table")
    p.add_argument("--json", metavar="OUT", help="write rows and summary as JSON")
    catalog_option(p)
    p.set_defaults(func=cmd_validate)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
