"""The ranking of a sweep folder: every finished point, fastest first, with memory headroom,
failure exposure, goodput, energy and cost beside its throughput (a pandas DataFrame)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from clustersim.hardware_specs import SpecError

from clustersim.analysis.config import RunConfig, config_from_mapping, read_yaml
from clustersim.analysis.sweeps.costs import costs_for, cost_per_million_tokens, energy_per_token_j
from clustersim.analysis.sweeps.exposure import exposure
from clustersim.analysis.sweeps.run_store import CANDIDATES, CONFIG, POINTS, RANKING, RunStore, to_csv
from clustersim.analysis.sweeps.space import GIB

INT_COLUMNS = ("index", "tp", "pp", "dp", "cp", "micro_batch", "virtual_stages", "zero",
               "critical_class", "events")


def folder_config(run_dir: str | Path) -> RunConfig:
    """The config stored in a sweep folder."""
    root = Path(run_dir)
    if not (root / CONFIG).exists():
        raise SpecError("RUN_DIR", f"{root} is not a sweep folder (no {CONFIG}); run "
                        "`clustersim sweep CONFIG --out DIR` first")
    cfg = config_from_mapping(read_yaml(root / CONFIG), root)
    return cfg if cfg.name else replace(cfg, name=root.name)


def load_frame(path: Path, text: str | None = None):
    """A CSV file (or its ``text``) as a DataFrame; empty when there is nothing yet."""
    import io

    import pandas as pd
    if text is None:
        text = path.read_text() if path.exists() else ""
    if not text.strip():
        return pd.DataFrame()
    frame = pd.read_csv(io.StringIO(text))
    for col in ("error", "reason"):
        if col in frame:
            frame[col] = frame[col].astype("object").fillna("").astype(str)
    return frame


def ranking(run_dir: str | Path, config: RunConfig | None = None):
    """Simulated points of ``run_dir`` ranked by tokens/s (ties: enumeration order)."""
    from clustersim.analysis.sweeps.runner import job_of_row
    config = config or folder_config(run_dir)
    store = RunStore(run_dir)
    points = load_frame(store.path(POINTS), store.points_text())
    if points.empty:
        return points
    points = points[points["error"] == ""].copy()
    if points.empty:
        return points
    for col in INT_COLUMNS:
        if col in points:
            points[col] = points[col].astype(int)
    points = points.sort_values(["tokens_per_s", "index"], ascending=[False, True])
    points.insert(0, "rank", range(1, len(points) + 1))
    cluster = config.cluster
    capacity = cluster.device.memory_bytes / GIB
    points["memory_headroom_gib"] = capacity - points["peak_memory_gib"]
    costs = costs_for(config.sections.get("costs"), cluster, config.catalog)
    extra = {k: [] for k in ("interruptions_per_day", "checkpoint_pause_s", "failure_waste",
                             "goodput_tokens_per_s", "energy_per_token_j",
                             "cost_per_million_tokens")}
    for _, row in points.iterrows():
        e = exposure(job_of_row(config, row), cluster, row["step_time_s"])
        extra["interruptions_per_day"].append(e.interruptions_per_day)
        extra["checkpoint_pause_s"].append(e.checkpoint_pause_s)
        extra["failure_waste"].append(e.waste)
        extra["goodput_tokens_per_s"].append(row["tokens_per_s"] * (1.0 - e.waste))
        extra["energy_per_token_j"].append(energy_per_token_j(costs, cluster, row["tokens_per_s"]))
        extra["cost_per_million_tokens"].append(
            cost_per_million_tokens(costs, cluster, row["tokens_per_s"]))
    for name, values in extra.items():
        points[name] = values
    points.attrs["currency"] = costs.currency
    points.attrs["priced"] = costs.priced
    return points.reset_index(drop=True)


def candidates(run_dir: str | Path):
    return load_frame(Path(run_dir) / CANDIDATES)


def write_ranking(run_dir: str | Path, frame) -> Path:
    path = Path(run_dir) / RANKING
    path.write_text(to_csv(frame.to_dict("records")))
    return path


def strategy_label(row) -> str:
    """``TP8 PP2 DP4 mb1 1f1b selective ZeRO-1`` (CP with its variant, virtual stages, offload
    when used)."""
    parts = [f"TP{row['tp']}", f"PP{row['pp']}", f"DP{row['dp']}"]
    if int(row["cp"]) > 1:
        algorithm, a2a = row.get("cp_algorithm") or "ring", int(row.get("cp_a2a") or 0)
        parts.append(f"CP{row['cp']}" + ("" if algorithm == "ring" else f":{algorithm}")
                     + (f"({a2a})" if a2a else ""))
    parts.append(f"mb{row['micro_batch']}")
    sched = row["schedule"] + (f"x{row['virtual_stages']}" if int(row["virtual_stages"]) > 1 else "")
    parts += [sched, f"rc:{row['recompute']}", f"ZeRO-{row['zero']}"]
    if row["offload"] != "none":
        parts.append(f"offload:{row['offload']}")
    if int(row["tp"]) > 1 and str(row["sequence_parallel"]) != "True":
        parts.append("no-SP")
    return " ".join(parts)


def ranking_rows(frame, top: int) -> tuple[list[str], list[list]]:
    """Headers and the first ``top`` rows of the ranking as users read it."""
    priced = frame.attrs.get("priced", False)
    headers = ["#", "strategy", "tokens/s", "MFU", "step s", "peak GiB", "headroom GiB",
               "failure waste", "goodput tok/s", "J/token"]
    if priced:
        headers.append(f"{frame.attrs.get('currency', '')}/Mtok")
    rows = []
    for _, r in frame.head(top).iterrows():
        row = [r["rank"], strategy_label(r), f"{r['tokens_per_s']:,.0f}",
               f"{100 * r['mfu']:.1f}%", f"{r['step_time_s']:.4g}", f"{r['peak_memory_gib']:.1f}",
               f"{r['memory_headroom_gib']:.1f}", f"{100 * r['failure_waste']:.2f}%",
               f"{r['goodput_tokens_per_s']:,.0f}", f"{r['energy_per_token_j']:.3g}"]
        if priced:
            row.append(f"{r['cost_per_million_tokens']:.3g}")
        rows.append(row)
    return headers, rows
