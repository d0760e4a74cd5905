"""Figures of a failure study (PNG, no display needed): ETTR against the checkpoint interval,
one run's timeline, and lost time by cause."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)
from matplotlib.figure import Figure  # noqa: E402

from clustersim.analysis.failures.study import DAY, HOUR, StudyResult  # noqa: E402

COLORS = plt.get_cmap("tab10").colors
STATE_COLORS = {"save": "#f2a900", "down": "#c0392b"}


def ettr_vs_interval(sweep: dict) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    longest = max(max(r["intervals_s"]) for r in sweep.values())
    unit, scale = ("hours", HOUR) if longest >= 2 * HOUR else ("minutes", 60.0)
    for i, (policy, r) in enumerate(sweep.items()):
        color = COLORS[i % len(COLORS)]
        hours = [t / scale for t in r["intervals_s"]]
        ax.errorbar(hours, [100 * e for e in r["ettr_mean"]],
                    yerr=[100 * c for c in r["ettr_ci95_half"]], color=color, marker="o",
                    ms=3, capsize=2, label=policy)
        ax.axvline(r["young_daly_interval_s"] / scale, color=color, ls="--", lw=1)
        ax.plot([r["best_interval_s"] / scale], [100 * r["best_ettr"]], marker="*", ms=12,
                color=color)
    ax.set_xscale("log")
    ax.set_xlabel(f"checkpoint interval ({unit}, log scale)")
    ax.set_ylabel("ETTR (%)")
    ax.set_title("ETTR against checkpoint interval (dashed: Young/Daly optimum, star: best)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def timeline(result: StudyResult) -> Figure:
    run = result.runs[0]
    fig, ax = plt.subplots(figsize=(11, 2.8))
    cmap = plt.get_cmap("Greens")
    for seg in run.timeline:
        start, width = seg.start_s / DAY, (seg.end_s - seg.start_s) / DAY
        color = (cmap(0.35 + 0.6 * seg.speed) if seg.state == "train"
                 else STATE_COLORS.get(seg.state, "grey"))
        ax.broken_barh([(start, width)], (0, 1), color=color, linewidth=0)
    for e in run.events:
        if e.kind in ("failure", "planned"):
            ax.plot([e.time_s / DAY], [1.15], marker="v", ms=3,
                    color="black" if e.kind == "failure" else "blue")
    horizon = result.prepared.plan.horizon_s / DAY
    ax.axvline(horizon, color="black", lw=1, ls=":")
    ax.set_ylim(0, 1.3)
    ax.set_yticks([])
    ax.set_xlabel("days")
    ax.set_title(f"Run 0: training (green, darker = faster), checkpoint pauses (amber), "
                 f"downtime (red), failures (triangles); dotted: {horizon:g}-day horizon",
                 fontsize=9)
    fig.tight_layout()
    return fig


def lost_by_cause(result: StudyResult) -> Figure:
    items = list(result.lost_hours_by_cause.items())
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(items) + 1.5))
    y = list(range(len(items)))[::-1]
    ax.barh(y, [v for _, v in items], color=COLORS[3])
    ax.set_yticks(y, [c for c, _ in items])
    ax.set_xlabel("hours per run (lost work + downtime)")
    ax.set_title(f"Lost time by cause over {result.prepared.spec.days:g} days")
    fig.tight_layout()
    return fig


def write_plots(result: StudyResult, directory: str | Path, sweep: dict) -> list[Path]:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    figures = {"ettr_vs_interval.png": ettr_vs_interval(sweep) if sweep else None,
               "timeline.png": timeline(result) if result.runs[0].timeline else None,
               "lost_time_by_cause.png": (lost_by_cause(result) if result.lost_hours_by_cause
                                          else None)}
    written = []
    for name, fig in figures.items():
        if fig is None:
            continue
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        written.append(out / name)
    return written
