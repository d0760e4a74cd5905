"""The validation table, its JSON rows, and a Markdown report with a bar plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from clustersim.analysis.calibration.compare import Comparison
from clustersim.analysis.tables import render


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _cores(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(rows: Sequence[Comparison], baseline: str | None = None) -> str:
    headers = ["strategy", "measured ms", "predicted ms", "error"]
    if baseline:
        headers += [f"{baseline} ms", f"{baseline} error"]
    headers.append("other load (cores)")
    body = []
    for r in rows:
        line = [r.strategy, _ms(r.measured_step_time_s), _ms(r.predicted_step_time_s),
                _pct(r.error)]
        if baseline:
            line += [_ms(r.baseline_step_time_s), _pct(r.baseline_error)]
        line.append(_cores(r.foreign_cores))
        body.append(line)
    return render(headers, body, title="Measured vs predicted step time (median of the "
                                       "timed steps; median over repeats)")


def summary_lines(rows: Sequence[Comparison], baseline: str | None = None) -> list[str]:
    errors = [abs(r.error) for r in rows]
    out = [f"max |error| {max(errors) * 100:.1f}%, mean |error| "
           f"{sum(errors) / len(errors) * 100:.1f}% over {len(rows)} strategies"]
    base = [abs(r.baseline_error) for r in rows if r.baseline_error is not None]
    if baseline and base:
        out.append(f"uncalibrated {baseline}: max |error| {max(base) * 100:.1f}%, mean |error| "
                   f"{sum(base) / len(base) * 100:.1f}%")
    return out


def write_plot(rows: Sequence[Comparison], path: Path, profile: str,
               baseline: str | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r.strategy for r in rows]
    series = [("measured", [r.measured_step_time_s for r in rows]),
              (f"predicted ({profile})", [r.predicted_step_time_s for r in rows])]
    if baseline:
        series.append((f"predicted ({baseline})", [r.baseline_step_time_s or 0.0 for r in rows]))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(rows), 3.6))
    for i, (label, values) in enumerate(series):
        ax.bar([x + (i - (len(series) - 1) / 2) * width for x in range(len(rows))],
               [v * 1e3 for v in values], width, label=label)
    ax.set_xticks(range(len(rows)), names)
    ax.set_ylabel("step time (ms)")
    ax.legend(fontsize=8)
    ax.set_title("Calibration GPT: measured vs predicted step time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(rows: Sequence[Comparison], path: Path, *, profile: str,
                 provenance: Mapping[str, str], setup: Mapping[str, object],
                 baseline: str | None = None) -> Path:
    """``path`` (Markdown) and, beside it, the plot it shows (``<stem>.png``)."""
    plot = path.with_suffix(".png")
    write_plot(rows, plot, profile, baseline)
    lines = [f"# Calibration: measured vs predicted ({profile})", ""]
    lines += [f"- {k}: {v}" for k, v in provenance.items()]
    lines += [f"- {k}: {v}" for k, v in setup.items()]
    lines += ["", "```", table(rows, baseline), "```", ""]
    lines += [f"{s}." for s in summary_lines(rows, baseline)]
    lines += ["", f"![measured vs predicted]({plot.name})", "", "## Phases of the real job (rank 0, "
              "median per step, ms)", ""]
    for r in rows:
        phases = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in (r.phases_s or {}).items())
        lines.append(f"- {r.strategy}: {phases}")
    path.write_text("\n".join(lines) + "\n")
    return path
