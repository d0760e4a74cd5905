"""What a failure study prints and writes: the summary table and the events CSV."""

from __future__ import annotations

import csv
from pathlib import Path

from clustersim.hardware_specs.units import format_bytes

from clustersim.analysis.failures.study import HOUR, Stat, StudyResult
from clustersim.analysis.tables import key_values, render


def format_time(seconds: float) -> str:
    """A policy-sized duration: seconds, minutes, hours or days."""
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 90:
        return f"{seconds:.3g} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.3g} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} d"


def _ci(stat: Stat, scale: float = 1.0, digits: int = 1, unit: str = "") -> str:
    lo, hi = stat.ci95
    return (f"{stat.mean * scale:.{digits}f}{unit}  (95% CI {lo * scale:.{digits}f} to "
            f"{hi * scale:.{digits}f}{unit})")


def inputs_table(result: StudyResult) -> str:
    p = result.prepared
    plan, spec, cost = p.plan, p.spec, p.cost
    job, cluster = p.config.job, p.config.cluster
    source = "measured, failures.step_time" if spec.step_time_s else "simulated"
    levels = "; ".join(
        f"{'storage' if lv.durable else 'peer memory'} every {lv.every}: ready "
        f"{format_time(lv.background_s) if lv.background_s else 'at once'}, "
        f"load {format_time(lv.load_s)}" for lv in cost.levels)
    rec = spec.recovery
    return key_values([
        ("job", f"{job.model.name} on {cluster.num_devices} x {cluster.device.name} "
                f"({plan.nodes} nodes), DP {job.strategy.dp}"),
        ("step time", f"{format_time(plan.step_time_s)} ({source})"),
        ("failure model", f"{spec.model.name}: {spec.model.unexpected_per_1000_node_days:.3f} "
                          f"unexpected per 1000 node-days, job MTBF {p.mtbf_s / HOUR:.2f} h"),
        ("checkpoint", f"{cost.policy.value}, {format_bytes(cost.state_bytes)}, pause "
                       f"{format_time(cost.blocking_s)}; {levels}"),
        ("interval", f"{format_time(plan.interval_s)} ({spec.interval_rule.value}; "
                     f"Young/Daly {format_time(p.young_interval_s)})"),
        ("recovery", f"{rec.kind.value}: detect {format_time(rec.detection_s)}, drain "
                     f"{format_time(rec.drain_s)}, replace {format_time(rec.provision_s())} "
                     f"(spares {rec.spare_nodes}, repair {format_time(rec.repair_time_s)}), "
                     f"restart {format_time(rec.process_restart_s)}, warm-up "
                     f"{format_time(rec.warmup_s)}"),
        ("horizon", f"{spec.days:g} days, {len(result.runs)} seeded runs (seed {spec.seed})"),
    ], title=f"clustersim failures: {p.config.name}")


def results_table(result: StudyResult) -> str:
    s = result.stats
    ttt = s["time_to_train_days"]
    return key_values([
        ("interruptions", _ci(s["interruptions"]) + (
            f", plus {s['planned'].mean:.1f} planned" if s["planned"].mean else "")),
        ("ETTR (goodput)", _ci(s["ettr"], 100.0, 2, "%")
         + f", runs p5-p95 {100 * s['ettr'].p5:.1f}-{100 * s['ettr'].p95:.1f}%"),
        ("lost work", _ci(s["lost_work_hours"], unit=" h")),
        ("downtime", _ci(s["downtime_hours"], unit=" h")),
        ("checkpoint overhead", _ci(s["checkpoint_overhead_fraction"], 100.0, 2, "%")),
        ("slowdown", _ci(s["slowdown_hours"], unit=" h")),
        ("time to train", _ci(ttt, digits=2, unit=" d") if ttt.mean != float("inf")
         else "not reached"),
    ], title=f"Over {result.prepared.spec.days:g} days (mean of runs, 95% CI of the mean, "
             f"Student's t over {len(result.runs)} runs)")


def cause_table(result: StudyResult) -> str:
    if not result.by_cause:
        return (f"Interruptions by cause: none in {len(result.runs)} runs of "
                f"{result.prepared.spec.days:g} days")
    total = sum(v for c, v in result.by_cause.items() if c != "maintenance") or 1.0
    rows = [[cause, f"{count:.1f}",
             "-" if cause == "maintenance" else f"{100 * count / total:.1f}%",
             f"{result.lost_hours_by_cause.get(cause, 0.0):.1f}"]
            for cause, count in sorted(result.by_cause.items(), key=lambda kv: -kv[1])]
    return render(["cause", "interruptions", "share", "lost + down (h)"], rows,
                  title="Interruptions by cause (mean per run)")


def impact_table(result: StudyResult) -> str:
    rows = [[i.kind, i.rank, f"x{i.factor:.2f}", f"{i.step_s:.3f}", f"{i.slowdown:.3f}x",
             i.explanation()] for i in result.prepared.impacts]
    return render(["fault", "rank", "factor", "step (s)", "slowdown", "critical path"], rows,
                  title="In-step faults at their largest size (one rank)")


def sweep_table(sweep: dict) -> str:
    rows = []
    for policy, r in sweep.items():
        fitted = r["fitted_optimum_s"]
        rows.append([policy, format_time(r["blocking_s"]), format_time(r["young_daly_interval_s"]),
                     format_time(r["best_interval_s"]), f"{100 * r['best_ettr']:.2f}%",
                     format_time(fitted) if fitted else "-"])
    return render(["checkpoint", "pause", "Young/Daly", "best interval", "ETTR", "fitted optimum"],
                  rows, title="Best checkpoint interval per policy "
                              f"({next(iter(sweep.values()))['seeds']} seeds per point)")


def report(result: StudyResult) -> str:
    parts = [inputs_table(result), results_table(result), cause_table(result)]
    if result.prepared.impacts:
        parts.append(impact_table(result))
    if result.sweep:
        parts.append(sweep_table(result.sweep))
    return "\n\n".join(parts)


EVENT_FIELDS = ("run", "time_h", "kind", "cause", "component", "downtime_h", "lost_work_h")


def write_events_csv(result: StudyResult, path: str | Path) -> int:
    """Every event of every run; returns the number of rows."""
    rows = 0
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(EVENT_FIELDS)
        for run in result.runs:
            for e in run.events:
                writer.writerow([run.index, f"{e.time_s / HOUR:.4f}", e.kind, e.cause, e.component,
                                 f"{e.downtime_s / HOUR:.4f}", f"{e.lost_work_s / HOUR:.4f}"])
                rows += 1
    return rows

