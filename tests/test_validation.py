"""Accuracy on the bundled published runs (analysis/data/published_runs_dev.csv)."""

import csv

import pytest

from clustersim.analysis.validation.published import publication_date, software_of, summarize, validate_rows

from tests.conftest import REPO

RUNS = REPO / "analysis/data/published_runs_dev.csv"


def test_bundled_runs_keep_their_provenance():
    rows = list(csv.DictReader(RUNS.open()))
    assert len(rows) == 77
    assert all(r["source"] and r["measured_step_time_s"] for r in rows)


@pytest.mark.parametrize("source, date", [
    ("Narayanan et al. (SC'21, arXiv 2104.04473)", (2021, 4, 4473)),
    ("Korthikanti et al. 2022, arXiv 2205.05198", (2022, 5, 5198)),
    ("mosaicml/llm-foundry benchmarking README", None),
    ("BLOOM, 2022", (2022, 1, 0)),
])
def test_publication_dates(source, date):
    assert publication_date(source) == date


def test_software_era_follows_the_source_date():
    old = software_of({"source": "arXiv 2104.04473"})
    assert old == {"attention": "standard", "zero3_granularity": "tensor", "zero3_prefetch": "none"}
    assert software_of({"source": "mosaicml/llm-foundry, 2023"}) == {}
    # After FlashAttention-3 (2407.08608): FA3-class kernels (cuDNN SDPA, TE, FA3).
    assert software_of({"source": "arXiv 2407.21783"}) == {"attention": "flash3"}
    # Same month as FlashAttention (2205.14135), but before it.
    assert software_of({"source": "arXiv 2205.05198"})["attention"] == "standard"
    assert software_of({"source": "arXiv 2104.04473", "attention": "flash"})["attention"] == "flash"


@pytest.mark.slow
def test_dev_set_mape_is_at_most_ten_percent(catalog):
    outcomes = validate_rows(RUNS, catalog)
    summary = summarize(outcomes)
    assert summary.unmapped == 0
    assert summary.compared >= 70
    assert summary.mape <= 0.10


def test_torchtitan_fsdp2_runs_outside_the_dev_set_within_ten_percent(catalog):
    """torchtitan's published FSDP2 throughput on 64 A100 (Llama 2 13B without recompute,
    Llama 2 and 3 70B with full recompute, Llama 3 8B recomputing every other layer), never
    used to develop the model."""
    outcomes = validate_rows(REPO / "analysis/data/published_runs_torchtitan.csv", catalog)
    a100 = [o for o in outcomes if "_h100_" not in o.id]
    assert len(a100) == 4
    for o in a100:
        assert abs(o.error) <= 0.10, o


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="torchtitan's H100 benchmarks ran on Grand Teton H100 96GB "
                   "HBM2e at a 500 W power limit, whose sustained clocks are not published (the "
                   "source: 'the actual peak TFLOPs number is between SXM and NVL, and we don't "
                   "know its exact value'); on the 700 W h100-sxm they come out 14-44% fast")
def test_torchtitan_h100_runs_within_ten_percent(catalog):
    """torchtitan's 2024-12 and 2025-06 H100 benchmarks: 70B FSDP 32 x TP 8 (BF16 and float8,
    vanilla and async TP) and 405B FSDP 8 x TP 8 x PP 8 (1F1B, interleaved); all runnable."""
    outcomes = validate_rows(REPO / "analysis/data/published_runs_torchtitan.csv", catalog)
    h100 = [o for o in outcomes if "_h100_" in o.id]
    assert len(h100) == 8 and all(o.predicted_s is not None for o in h100)
    for o in h100:
        assert abs(o.error) <= 0.10, o


def test_a_flag_column_that_is_not_true_or_false_names_the_field(catalog):
    from clustersim.hardware_specs import SpecError
    from clustersim.analysis.validation.published import row_config
    row = next(csv.DictReader(open(RUNS)))
    with pytest.raises(SpecError, match="strategy.tp_comm_overlap: expected true or false"):
        row_config(dict(row, tp_comm_overlap="yes"), catalog)
