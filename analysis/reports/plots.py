"""The report's figures (matplotlib, no display needed): each function takes plain data and
returns a Figure, so a notebook can show it and the report can save it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)
from matplotlib.figure import Figure  # noqa: E402

from clustersim.simulator.result import AXES, BREAKDOWN_COLUMNS  # noqa: E402
from clustersim.workloads.memory import GIB  # noqa: E402

PART_LABELS = {"compute_s": "compute", "bubble_s": "pipeline bubble", "optimizer_s": "optimizer",
               "offload_s": "offload copies", "host_s": "host issue", "other_s": "other",
               **{f"exposed_{a}_s": f"exposed {a.upper()} comm" for a in AXES}}
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "comm_buffers", "fragmentation",
                "reserve")
COLORS = plt.get_cmap("tab10").colors


def breakdown_bars(rows: Sequence[Mapping], labels: Sequence[str]) -> Figure:
    """Stacked step-time breakdown of each strategy (``rows`` carry the ``*_s`` columns)."""
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.6), layout="constrained")
    y = list(range(len(rows)))[::-1]
    left = [0.0] * len(rows)
    for i, part in enumerate(BREAKDOWN_COLUMNS):
        widths = [float(r.get(part, 0.0)) for r in rows]    # offload_s, host_s: absent in old sweeps
        if not any(widths):
            continue
        ax.barh(y, widths, left=left, color=COLORS[i % len(COLORS)], label=PART_LABELS[part])
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel("step time (s)")
    ax.set_title("Where the step time goes (critical rank class)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def memory_per_stage(stages: Sequence[Mapping], capacity_bytes: float) -> Figure:
    """Stacked memory per GPU of each pipeline stage against HBM capacity."""
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(stages) + 3), 4), layout="constrained")
    x = [int(s["stage"]) for s in stages]
    bottom = [0.0] * len(stages)
    for i, part in enumerate(MEMORY_PARTS):
        heights = [float(s[part]) / GIB for s in stages]
        ax.bar(x, heights, bottom=bottom, color=COLORS[i], label=part.replace("_", " "))
        bottom = [a + b for a, b in zip(bottom, heights)]
    ax.axhline(capacity_bytes / GIB, color="black", linestyle="--", linewidth=1,
               label=f"HBM {capacity_bytes / GIB:.0f} GiB")
    ax.set_xticks(x)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per GPU")
    ax.set_title("Memory per GPU by pipeline stage")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def timeline(trace: Mapping, title: str) -> Figure:
    """A Gantt chart of a Chrome trace (``analysis.chrome_trace``): one row per rank class
    and stream that ran something, one colour per category, rows named as Perfetto names
    them (the class's program and its multiplicity, then the track)."""
    names, programs = {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "process_name":
            programs[e["pid"]] = e["args"]["name"].split(" (")[0]
    spans: dict[tuple[int, int], dict[str, list[tuple[float, float]]]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e["dur"] > 0:
            spans.setdefault((e["pid"], e["tid"]), {}).setdefault(e.get("cat", ""), []).append(
                (e["ts"] / 1e6, e["dur"] / 1e6))
    rows = sorted(spans)
    categories = sorted({c for r in rows for c in spans[r]})
    color = {c: COLORS[i % len(COLORS)] for i, c in enumerate(categories)}
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(rows) + 1.8), layout="constrained")
    for y, row in enumerate(rows):
        for cat, bars in spans[row].items():
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=color[cat], linewidth=0,
                           rasterized=True)
    ax.set_yticks(range(len(rows)), [f"{programs.get(p, p)}: {names.get((p, t), t)}"
                                     for p, t in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time in step (s)")
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[c]) for c in categories]
    ax.legend(handles, categories, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points (memory, throughput) no other point beats on both (less memory,
    more throughput), by increasing memory."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def throughput_vs_memory(memory_gib: Sequence[float], tokens_per_s: Sequence[float],
                         capacity_gib: float) -> Figure:
    """Every strategy, with the Pareto front's points numbered 1, 2, ... by increasing memory
    (the report lists them under the figure: strategy names would overlap)."""
    fig, ax = plt.subplots(figsize=(9, 5.5), layout="constrained")
    ax.scatter(memory_gib, tokens_per_s, s=12, color="0.6", label="strategies")
    front = pareto_front(list(zip(memory_gib, tokens_per_s)))
    ax.plot([memory_gib[i] for i in front], [tokens_per_s[i] for i in front], "o-",
            color=COLORS[3], label="Pareto front (numbered)")
    for number, i in enumerate(front, 1):
        # Alternate above and below the line, so that neighbours do not collide.
        ax.annotate(str(number), (memory_gib[i], tokens_per_s[i]), fontsize=8,
                    xytext=(0, 7 if number % 2 else -13), textcoords="offset points",
                    ha="center", color=COLORS[3], fontweight="bold")
    ax.axvline(capacity_gib, color="black", linestyle="--", linewidth=1, label="HBM")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens / s")
    ax.set_title("Throughput against memory")
    ax.legend(fontsize=8)
    return fig


def cost_and_energy(labels: Sequence[str], energy_j: Sequence[float],
                    cost: Sequence[float] | None, currency: str) -> Figure:
    """Energy per token of each strategy, and its cost beside it when there are prices. The
    layout engine sizes the margin to the longest strategy name."""
    panels = 2 if cost is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels + 4, 0.4 * len(labels) + 1.8),
                             squeeze=False, layout="constrained")
    y = list(range(len(labels)))[::-1]
    axes[0][0].barh(y, energy_j, color=COLORS[2])
    axes[0][0].set_yticks(y, labels, fontsize=7)
    axes[0][0].set_xlabel("energy per token (J)")
    if cost is not None:
        axes[0][1].barh(y, cost, color=COLORS[1])
        axes[0][1].set_yticks(y, [""] * len(y))
        axes[0][1].set_xlabel(f"cost per million tokens ({currency})")
    fig.suptitle("Energy and cost per token" if cost is not None else "Energy per token")
    return fig
