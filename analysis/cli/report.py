"""``clustersim report RUN_DIR --out report.html``: render a sweep's or a comparison's stored
results as an HTML report with a Markdown twin and its figures."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from clustersim.hardware_specs import SpecError

from clustersim.analysis.cli.common import add_command, output_path
from clustersim.analysis.reports.sweep_report import build_report


def register(sub) -> None:
    p = add_command(sub, "report", help="write an HTML report (and Markdown twin) of a sweep or "
                                          "a comparison", examples=[
        ("clustersim report runs/llama8b",
         "a sweep folder: ranking, breakdowns, memory, Pareto front, energy and cost, written "
         "to runs/llama8b_report.html"),
        ("clustersim report runs/fabric --out runs/fabric.html",
         "a `compare --out` folder: the clusters side by side"),
    ])
    p.add_argument("run_dir", help="folder written by `clustersim sweep --out` or "
                                   "`clustersim compare --out`")
    p.add_argument("--out", type=output_path, default=None, metavar="FILE.html",
                   help="HTML file to write (default: RUN_DIR_report.html beside the folder, "
                        "which the report leaves as it was); the Markdown twin and the figures "
                        "go beside it")
    p.set_defaults(func=run)


def default_out(run_dir: str) -> Path:
    """``runs/llama70b`` -> ``runs/llama70b_report.html``: beside the results, not in them,
    and named after them, so that reports of two folders do not overwrite each other."""
    root = Path(run_dir).resolve()
    return Path(os.path.relpath(root.with_name(f"{root.name}_report.html")))


def run(args) -> int:
    try:
        files = build_report(args.run_dir, args.out or default_out(args.run_dir))
    except SpecError:
        raise    # says itself what is wrong (a missing folder, a bad config inside it)
    except (ValueError, KeyError, TypeError, AttributeError, EOFError, gzip.BadGzipFile) as err:
        # A results file edited or cut short (JSON, CSV or the gzipped trace): say which folder.
        raise SpecError("RUN_DIR", f"{args.run_dir} holds a damaged results file "
                        f"({type(err).__name__}: {str(err)[:120]}); rerun or resume the sweep "
                        "into a fresh folder") from None
    print(f"wrote {files[0]}, {files[1]} and {len(files) - 2} figure files in {files[2].parent}")
    return 0
