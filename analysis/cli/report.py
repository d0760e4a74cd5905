"""``clustersim report RUN_DIR --out report.html``: render a sweep's or a comparison's stored
results as an HTML report with a Markdown twin and its figures."""

from __future__ import annotations

import gzip

from clustersim.hardware_specs import SpecError

from clustersim.analysis.cli.common import add_command, output_path
from clustersim.analysis.reports.sweep_report import build_report


def register(sub) -> None:
    p = add_command(sub, "report", help="write an HTML report (and Markdown twin) of a sweep or "
                                          "a comparison", examples=[
        ("clustersim report runs/llama8b --out runs/llama8b.html",
         "a sweep folder: ranking, breakdowns, memory, Pareto front, energy and cost"),
        ("clustersim report runs/fabric --out runs/fabric.html",
         "a `compare --out` folder: the clusters side by side"),
    ])
    p.add_argument("run_dir", help="folder written by `clustersim sweep --out` or "
                                   "`clustersim compare --out`")
    p.add_argument("--out", type=output_path, default="report.html", metavar="FILE.html",
                   help="HTML file to write (default: report.html); the Markdown twin and the "
                        "figures go beside it")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        files = build_report(args.run_dir, args.out)
    except SpecError:
        raise    # says itself what is wrong (a missing folder, a bad config inside it)
    except (ValueError, KeyError, TypeError, AttributeError, EOFError, gzip.BadGzipFile) as err:
        # A results file edited or cut short (JSON, CSV or the gzipped trace): say which folder.
        raise SpecError("RUN_DIR", f"{args.run_dir} holds a damaged results file "
                        f"({type(err).__name__}: {str(err)[:120]}); rerun or resume the sweep "
                        "into a fresh folder") from None
    print(f"wrote {files[0]}, {files[1]} and {len(files) - 2} figure files in {files[2].parent}")
    return 0
