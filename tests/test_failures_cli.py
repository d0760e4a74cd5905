"""``clustersim failures`` end to end on a small job whose step the engine simulates, and the
in-step fault report."""

import csv
import json

import pytest

from clustersim.simulator import Faults
from clustersim.simulator.longrun.fault_impact import fault_impact
from clustersim.workloads import Strategy
from clustersim.workloads.builder import build_trace

from tests.conftest import tiny_job
from tests.test_cli import clustersim

CONFIG = """
name: tiny-failures
model: {name: tiny, layers: 8, hidden: 1024, heads: 16, vocab: 256}
training: {seq_len: 1024, global_batch: 32, micro_batch: 1}
strategy: {tp: 2, pp: 2, dp: 4}
cluster: {gpu: h100-sxm, num_gpus: 16, gpus_per_node: 2}
failures:
  days: 3
  model:
    base: llama3-405b-h100
    # 8 nodes would see one failure in 3 months; scale the rates up to see a few a day.
    rates_per_1000_node_days: {gpu: 150, software: 50}
    correlated: {gpu: {domain: rack, probability: 0.2}}
    stragglers:
      rate_per_1000_node_days: 300
      slowdown: {distribution: uniform, low: 1.2, high: 2.0}
      duration: {distribution: log_uniform, low: 30 s, high: 10 h}
    link_degradation:
      rate_per_1000_node_days: 100
      slowdown: {distribution: fixed, value: 3}
      duration: {distribution: exponential, mean: 1 h}
  checkpoint: {policy: in_memory, interval: 10 min, persist_every: 6}
  recovery: {policy: elastic, min_replicas: 2, spare_nodes: 1, repair_time: 6 h}
"""


@pytest.mark.slow
def test_failures_command_writes_table_json_events_and_plots(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(CONFIG)
    out, events, plots = tmp_path / "r.json", tmp_path / "events.csv", tmp_path / "plots"
    run = clustersim("failures", str(cfg), "--seeds", "4", "--workers", "2", "--json", str(out),
                     "--events-csv", str(events), "--plots", str(plots))
    assert run.returncode == 0, run.stderr
    for text in ("ETTR (goodput)", "Interruptions by cause", "In-step faults",
                 "slow gpu", "slow link", "elastic"):
        assert text in run.stdout
    data = json.loads(out.read_text())
    for key in ("interruptions_mean", "interruptions_by_cause", "ettr_mean", "ettr_ci95",
                "lost_work_hours_mean", "checkpoint_overhead_fraction",
                "downtime_hours_mean", "time_to_train_days_mean"):
        assert key in data, key
    assert 0 < data["ettr_mean"] < 1 and data["ettr_ci95"][0] <= data["ettr_mean"]
    assert data["interruptions_mean"] == pytest.approx(8 * 3 * 0.2, rel=0.5)
    assert data["slowdown_hours_mean"] > 0            # stragglers, links and fewer replicas
    assert {i["kind"] for i in data["fault_impacts"]} == {"slow gpu", "slow link"}
    with events.open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["kind"] for r in rows} >= {"failure", "straggler", "link"}
    assert set(rows[0]) == {"run", "time_h", "kind", "cause", "component", "downtime_h",
                            "lost_work_h"}
    assert {p.name for p in plots.iterdir()} == {"ettr_vs_interval.png", "timeline.png",
                                                 "lost_time_by_cause.png"}


@pytest.mark.slow
def test_same_seed_gives_the_same_json_whatever_the_workers(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(CONFIG)
    outputs = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}.json"
        run = clustersim("failures", str(cfg), "--seeds", "3", "--workers", workers,
                         "--json", str(out))
        assert run.returncode == 0, run.stderr
        outputs.append({k: v for k, v in json.loads(out.read_text()).items()
                        if k != "fault_impacts"})
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("edit, message", [
    ("interval: 10 min", "error: failures.checkpoint.interval: expected young, daly"),
    ("policy: elastic", "error: failures.recovery.policy: expected one of restart|hot_spare"),
    ("min_replicas: 2", "error: failures.recovery.min_replicas: 9 exceeds strategy.dp=4"),
])
@pytest.mark.slow
def test_bad_failures_section_exits_2_naming_the_field(tmp_path, edit, message):
    bad = {"interval: 10 min": "interval: sometimes", "policy: elastic": "policy: pray",
           "min_replicas: 2": "min_replicas: 9"}[edit]
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(CONFIG.replace(edit, bad))
    run = clustersim("failures", str(cfg), "--seeds", "1")
    assert run.returncode == 2
    assert run.stderr.startswith(message), run.stderr
    assert "Traceback" not in run.stderr


def test_slow_gpu_report_names_the_group_that_waits(catalog):
    """A 2x slow GPU in pipeline stage 0 of TP2 PP2 DP2: the step slows by most of its extra
    compute, and the report says which part of the critical rank's time grew."""
    job = tiny_job(Strategy(tp=2, pp=2, dp=2), global_batch=8)
    cluster = catalog.cluster(device="h100-sxm", num_devices=8)
    trace = build_trace(job)
    from clustersim.simulator import simulate
    healthy = simulate(trace, cluster)
    impact, slow = fault_impact(trace, cluster, healthy, Faults(compute_slowdown={0: 2.0}),
                                "slow gpu")
    assert 1.3 < impact.slowdown < 2.0
    assert impact.faulted_program == "stage0"
    assert impact.grown and impact.grown[0][1] > 0.2 * healthy.step_time_s
    if impact.critical_is_faulted:
        assert impact.grown[0][0] == "compute"
    else:
        assert impact.grown[0][0] in ("dp", "tp", "pp", "bubble")
    link, _ = fault_impact(trace, cluster, healthy, Faults(link_slowdown={0: 4.0}), "slow link")
    assert link.slowdown > 1.0 and link.grown[0][0] in ("tp", "dp", "pp", "bubble")
