"""The report of a results folder, rendered from what the sweep (or ``compare --out``) stored:
one self-contained HTML file (figures embedded), a Markdown twin, and every figure as PNG and
SVG in ``<name>_figures/`` beside them.

Sections: summary, ranking, step-time breakdown, memory per stage and pipeline timeline of the
best strategy, throughput against memory (Pareto front), energy and cost per token, and, when
their result files are in the folder, the failure study (``failures.json``) and the
calibration (``calibration.json``).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from pathlib import Path

from clustersim.hardware_specs import SpecError

from clustersim.analysis.reports import plots
from clustersim.analysis.reports.comparison import table_rows as compare_rows
from clustersim.analysis.reports.document import Document, json_tables, write_document
from clustersim.analysis.sweeps.ranking import candidates, folder_config, ranking, ranking_rows, strategy_label
from clustersim.analysis.sweeps.run_store import COMPARE, CONFIG, RunStore
from clustersim.analysis.sweeps.runner import BEST, BEST_TRACE, write_best

TOP_TABLE = 25
TOP_BARS = 12
EXTRA_RESULTS = {"failures.json": "Failure study", "calibration.json": "Calibration"}
"""Result files of other commands that the report includes when present in the folder."""


def summary_section(doc: Document, config, manifest: Mapping, cands, frame) -> None:
    job, cluster = config.job, config.cluster
    counts = cands["status"].value_counts().to_dict() if not cands.empty else {}
    doc.heading("Summary")
    rows = [
        ("model", f"{job.model.name} ({job.model.parameters / 1e9:.2f}B parameters)"),
        ("cluster", f"{cluster.num_devices} x {cluster.device.name} in {cluster.num_nodes} "
                    f"{cluster.node.name} nodes, {cluster.fabric.name}"),
        ("batch", f"{job.training.global_batch} x {job.training.seq_len} tokens, "
                  f"{job.training.precision.value}"),
        ("strategies enumerated", f"{len(cands)}: {counts.get('invalid', 0)} do not divide, "
                                  f"{counts.get('does_not_fit', 0)} do not fit, "
                                  f"{counts.get('dominated', 0)} dominated, "
                                  f"{counts.get('simulate', 0)} to simulate"),
        ("ranked", f"{len(frame)} simulated points"),
    ]
    if not frame.empty:
        b = frame.iloc[0]
        rows.append(("best", f"{strategy_label(b)}: {b['tokens_per_s']:,.0f} tokens/s, "
                             f"MFU {100 * b['mfu']:.1f}%, {b['peak_memory_gib']:.1f} GiB"))
    rows += [("config hash", manifest.get("config_hash", "")),
             ("catalog / calibration / code ids",
              f"{manifest.get('catalog_id', '')} / {manifest.get('calibration_id', '')} / "
              f"{manifest.get('code_id', '')}"),
             ("versions", ", ".join(f"{k} {v}" for k, v in manifest.get("versions", {}).items()))]
    doc.table(["", "value"], rows)


def ranking_section(doc: Document, frame) -> None:
    doc.heading("Ranking")
    doc.paragraph(f"The {min(TOP_TABLE, len(frame))} fastest of {len(frame)} simulated "
                  "strategies by tokens per second; headroom is HBM left on the fullest GPU; "
                  "failure waste is the share of a long run lost to checkpoints and recomputed "
                  "work (Young's optimum interval); goodput = tokens/s x (1 - waste).")
    doc.paragraph(failure_waste_note(frame))
    doc.table(*ranking_rows(frame, TOP_TABLE))


def failure_waste_note(frame) -> str:
    """Why the failure-waste column is (nearly) constant, when it is: it depends on the
    cluster's failure rate and the checkpoint's size, which every strategy of one model on
    one cluster shares, and only weakly on the step time."""
    waste = frame["failure_waste"] if "failure_waste" in frame else None
    if waste is None or waste.empty:
        return ""
    low, high = float(waste.min()), float(waste.max())
    if high - low > 0.1 * max(high, 1e-12):
        return (f"Failure waste ranges from {100 * low:.2f}% to {100 * high:.2f}%: strategies "
                "differ in checkpoint time (how many GPUs write the shards) and step time.")
    return (f"Failure waste is about {100 * high:.2f}% for every strategy: it is set by the "
            "cluster's failure rate (its GPU count) and the checkpoint's size (the model's "
            "state), which all these strategies share; it differs between clusters and models, "
            "not between strategies of one job.")


def best_sections(doc: Document, best: Mapping, trace: Mapping | None) -> None:
    doc.heading("Best strategy: memory per stage")
    doc.figure("memory_per_stage", plots.memory_per_stage(best["memory"],
                                                          best["memory_capacity_bytes"]),
               "Memory per GPU of each pipeline stage of the best strategy")
    if trace is None:
        return
    if best["strategy"]["pp"] > 1:
        doc.heading("Best strategy: pipeline timeline")
        doc.figure("pipeline_timeline", plots.timeline(trace, "Pipeline timeline of the best "
                                                              "strategy"),
                   "One step of the best strategy: each pipeline stage's compute and "
                   "communication streams (one row per stream that ran something)")
    else:
        doc.heading("Best strategy: step timeline")
        doc.figure("step_timeline", plots.timeline(trace, "Step timeline of the best strategy "
                                                          "(no pipeline)"),
                   "One step of the best strategy, which has no pipeline: its compute and "
                   "communication streams")


def pareto_section(doc: Document, frame, capacity_gib: float) -> None:
    memory, tokens = frame["peak_memory_gib"].tolist(), frame["tokens_per_s"].tolist()
    doc.heading("Throughput against memory")
    doc.figure("pareto", plots.throughput_vs_memory(memory, tokens, capacity_gib),
               "Every simulated strategy; the Pareto front (numbered) has no strategy both "
               "faster and smaller")
    front = plots.pareto_front(list(zip(memory, tokens)))
    doc.table(["#", "Pareto front strategy", "peak GiB", "tokens/s"],
              [(n, strategy_label(frame.iloc[i]), f"{memory[i]:.1f}", f"{tokens[i]:,.0f}")
               for n, i in enumerate(front, 1)])


def extra_sections(doc: Document, root: Path) -> None:
    """Other commands' result files, rendered from their JSON whatever their schema."""
    for name, title in EXTRA_RESULTS.items():
        path = root / name
        if not path.exists():
            continue
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise SpecError(str(path), f"is not valid JSON: {err}") from None
        doc.heading(title)
        doc.paragraph(f"From {name}.")
        json_tables(doc, data)


def comparison_report(root: Path, out: Path) -> Document:
    """The report of a ``clustersim compare --out`` folder: the clusters side by side."""
    import pandas as pd
    frame = pd.read_csv(root / COMPARE)
    frame["problem"] = frame["problem"].astype("object").fillna("")
    doc = Document(f"clustersim compare: {root.name}", out.parent / f"{out.stem}_figures")
    doc.heading("Cluster comparison")
    doc.table(*compare_rows(frame.to_dict("records")))
    ok = frame[frame["problem"] == ""]
    if ok.empty:
        return doc
    priced = ok["currency"].astype(str).str.len().gt(0).any() if "currency" in ok else False
    doc.figure("compare_cost_energy", plots.cost_and_energy(
        ok["name"].tolist(), ok["energy_per_token_j"].tolist(),
        ok["cost_per_million_tokens"].tolist() if priced else None,
        str(ok["currency"].iloc[0]) if priced else ""), "Energy and cost per token by cluster")
    extra_sections(doc, root)
    return doc


def build_report(run_dir: str | Path, out: str | Path) -> list[Path]:
    """Write the report of a sweep (or compare) folder; returns the files written."""
    root, out = Path(run_dir), Path(out)
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "no such folder"
        raise SpecError("RUN_DIR", f"{root}: {what} (give the folder that `clustersim sweep "
                        "--out` or `clustersim compare --out` wrote)")
    if (root / COMPARE).exists() and not (root / CONFIG).exists():
        return write_document(comparison_report(root, out), out)
    config = folder_config(root)
    store = RunStore(root)
    frame = ranking(root, config)
    if frame.empty:
        raise SpecError("RUN_DIR", f"{root} has no simulated point yet; run or resume the sweep")
    write_best(store, config)
    best = json.loads(store.path(BEST).read_text())
    trace = None
    if store.path(BEST_TRACE).exists():
        with gzip.open(store.path(BEST_TRACE), "rt") as fh:
            trace = json.load(fh)
    doc = Document(f"clustersim sweep: {config.name}", out.parent / f"{out.stem}_figures")
    summary_section(doc, config, store.read_manifest() or {}, candidates(root), frame)
    ranking_section(doc, frame)
    top = frame.head(TOP_BARS)
    labels = [strategy_label(r) for _, r in top.iterrows()]
    doc.heading("Step-time breakdown")
    doc.figure("breakdown", plots.breakdown_bars(top.to_dict("records"), labels),
               f"Step-time breakdown of the {len(top)} fastest strategies")
    best_sections(doc, best, trace)
    pareto_section(doc, frame, config.cluster.smallest_memory_bytes / plots.GIB)
    doc.heading("Energy and cost per token")
    priced = frame.attrs.get("priced", False)
    doc.paragraph("Energy = cluster power (GPU TDP unless the config's costs section gives "
                  "power; x PUE) / tokens per second." + (" Cost from the costs section." if priced
                                                         else " Add prices in a costs: section "
                                                              "for cost per million tokens."))
    doc.figure("cost_energy", plots.cost_and_energy(
        labels, top["energy_per_token_j"].tolist(),
        top["cost_per_million_tokens"].tolist() if priced else None,
        frame.attrs.get("currency", "")), "Energy and cost per token of the fastest strategies")
    extra_sections(doc, root)
    return write_document(doc, out)
