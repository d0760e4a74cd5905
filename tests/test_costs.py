"""Cost, energy and failure exposure beside throughput, and the cluster comparison."""

from __future__ import annotations

import math

import pytest

from clustersim.analysis.config import config_from_mapping
from clustersim.analysis.sweeps.costs import (
    HOURS_PER_YEAR, cost_per_million_tokens, costs_from_mapping, energy_per_token_j,
)
from clustersim.analysis.sweeps.exposure import exposure
from clustersim.hardware_specs import SpecError
from tests.test_sweep import TINY, clustersim, write_config


def test_rental_cost_per_million_tokens_and_energy_per_token():
    cluster = config_from_mapping(TINY).cluster          # 8 x h100-sxm, TDP 700 W
    spec = costs_from_mapping({"gpu_hour": 2.5})
    # 8 GPUs x 2.5 per hour = 20 per hour; at 1e5 tokens/s an hour is 3.6e8 tokens
    assert cost_per_million_tokens(spec, cluster, 1e5) == pytest.approx(20 / 360)
    assert energy_per_token_j(spec, cluster, 1e5) == pytest.approx(8 * 700 / 1e5)


def test_capex_cost_adds_electricity_and_pue_scales_power():
    cluster = config_from_mapping(TINY).cluster
    spec = costs_from_mapping({"capex_per_gpu": 30000, "amortization_years": 4,
                               "electricity_per_kwh": 0.1, "pue": 1.25, "power_per_gpu": "600 W",
                               "power_per_node": "2 kW"})
    power = (8 * 600 + 1 * 2000) * 1.25
    hourly = 8 * 30000 / (4 * HOURS_PER_YEAR) + power / 1000 * 0.1
    assert cost_per_million_tokens(spec, cluster, 2e5) == pytest.approx(hourly / (2e5 * 3600) * 1e6)
    assert energy_per_token_j(spec, cluster, 2e5) == pytest.approx(power / 2e5)
    assert cost_per_million_tokens(costs_from_mapping({}), cluster, 1e5) is None


@pytest.mark.parametrize("section, message", [
    ({"gpu_hour": 2, "capex_per_gpu": 1}, "costs.capex_per_gpu: give gpu_hour"),
    ({"capex_per_gpu": 30000}, "costs.amortization_years: is required"),
    ({"pue": 0.9}, "costs.pue: expected a number >= 1"),
    ({"power_per_gpu": "700 V"}, "costs.power_per_gpu: expected 700 W"),
    ({"gpu_hours": 2}, "costs.gpu_hours: unknown field"),
])
def test_bad_costs_name_the_field(section, message):
    with pytest.raises(SpecError) as err:
        costs_from_mapping(section)
    assert str(err.value).startswith(message)


def test_failure_waste_is_youngs_optimum():
    """At Young's interval t = sqrt(2 d M) the waste d/t + t/(2M) equals sqrt(2 d / M)."""
    cfg = config_from_mapping({**TINY, "strategy": {"tp": 8, "dp": 512},
                               "training": {"seq_len": 1024, "global_batch": 1024},
                               "cluster": {"gpu": "h100-sxm", "num_gpus": 4096}})
    e = exposure(cfg.job, cfg.cluster, step_time_s=1.0)
    mtbf = 86400.0 / e.interruptions_per_day
    assert e.checkpoint_interval_s == pytest.approx(math.sqrt(2 * e.checkpoint_pause_s * mtbf))
    assert e.waste == pytest.approx(math.sqrt(2 * e.checkpoint_pause_s / mtbf))
    slow = exposure(cfg.job, cfg.cluster, step_time_s=10 * e.checkpoint_interval_s)
    assert slow.checkpoint_interval_s == 10 * e.checkpoint_interval_s and slow.waste > e.waste


@pytest.mark.slow
def test_compare_sets_clusters_side_by_side_and_reports_a_bad_variant(tmp_path):
    cfg = write_config(tmp_path, costs={"gpu_hour": 2.0})
    # A V100 has no BF16 units: a variant that cannot run is listed with why (a misspelt
    # device is an error before anything runs, tests/test_first_use.py).
    run = clustersim("compare", str(cfg), "--vary", "cluster.gpu=h100-sxm,b200,v100-32gb",
                     "--out", str(tmp_path / "cmp"))
    assert run.returncode == 0, run.stderr
    lines = {line.split()[1].rstrip("]").split("=")[-1]: line for line in run.stdout.splitlines()
             if line.startswith("tiny [")}
    assert set(lines) == {"h100-sxm", "b200", "v100-32gb"}
    assert "not run: training.precision: v100-32gb has no bf16 rate" in lines["v100-32gb"]
    import pandas as pd
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv").set_index("gpu")
    assert len(table) == 3 and table["problem"].isna().sum() == 2
    assert table.loc["b200", "tokens_per_s"] > table.loc["h100-sxm", "tokens_per_s"], \
        "B200 (2.25 PFLOP/s dense BF16) outruns H100 (0.99) on the same job"
    assert table.loc["b200", "cost_per_million_tokens"] > 0


@pytest.mark.slow
def test_report_of_a_comparison_folder(tmp_path):
    from clustersim.analysis.reports.sweep_report import build_report
    cfg = write_config(tmp_path, costs={"gpu_hour": 2.0})
    assert clustersim("compare", str(cfg), "--vary", "cluster.gpu=h100-sxm,b200",
                      "--out", str(tmp_path / "cmp")).returncode == 0
    files = build_report(tmp_path / "cmp", tmp_path / "cmp" / "report.html")
    html = files[0].read_text()
    assert "Cluster comparison" in html and "USD/Mtok" in html and "tiny [gpu=b200]" in html
    assert html.count("data:image/png;base64,") == 1
