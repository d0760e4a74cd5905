"""The MoE and long-context published runs (analysis/data/published_runs_moe.csv and
published_runs_long_context.csv): provenance, and how a row becomes a run."""

import csv
from dataclasses import replace

import pytest

from clustersim.analysis.validation.published import row_config
from clustersim.hardware_specs import SpecError
from clustersim.workloads.dispatch import Dispatcher
from clustersim.workloads.routing import RouterBalance
from clustersim.workloads.strategy import CudaGraphs

from tests.conftest import REPO

MOE = REPO / "analysis/data/published_runs_moe.csv"
LONG = REPO / "analysis/data/published_runs_long_context.csv"


@pytest.mark.parametrize("path", [MOE, LONG], ids=lambda p: p.stem)
def test_every_row_has_a_source_a_positive_step_time_and_a_unique_id(path):
    rows = list(csv.DictReader(path.open()))
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["source"] and r["notes"] and float(r["measured_step_time_s"]) > 0, r["id"]
        assert int(r["tp"]) * int(r["pp"]) * int(r["dp"]) * int(r["cp"]) == int(r["num_gpus"]), r["id"]


def _row(row_id: str) -> dict:
    return next(r for r in csv.DictReader(MOE.open()) if r["id"] == row_id)


def test_a_model_column_names_the_preset_and_the_dispatcher_column_the_strategy(catalog):
    config = row_config(_row("mz_qwen3_235b_h100_deepep_tp4_ep8_pp8"), catalog)
    model, strategy = config.job.model, config.job.strategy
    assert (model.num_experts, model.top_k, model.layers) == (128, 8, 94)
    assert strategy.ep_dispatcher is Dispatcher.DEEPEP and strategy.ep == 8


def test_an_unknown_dispatcher_in_a_row_names_the_field(catalog):
    with pytest.raises(SpecError, match=r"strategy\.ep_dispatcher: expected one of"):
        row_config(dict(_row("mz_qwen3_235b_h100_deepep_tp4_ep8_pp8"), ep_dispatcher="nccl"), catalog)


def test_a_capacity_factor_row_runs_the_token_drop_recipe_and_its_dropless_twin_does_not(catalog):
    """Megatron-Bridge's ``apply_moe_token_drop``: capacity factor 1.0, every expert padded to
    its capacity; the 25.11 twin of the same layout is dropless, and graphs only its router
    (25.09's per-layer graphs hold whole layers)."""
    drop = row_config(_row("mb2509_qwen3_30b_a3b_b200_8gpu_fp8_tokendrop"), catalog).job
    dropless = row_config(_row("mb2511_qwen3_30b_a3b_b200_8gpu_mxfp8"), catalog).job
    assert (drop.training.moe.capacity_factor, drop.training.moe.pad_to_capacity) == (1.0, True)
    assert dropless.training.moe.capacity_factor == 0.0
    assert (drop.strategy.cuda_graphs, dropless.strategy.cuda_graphs) == (
        CudaGraphs.FULL, CudaGraphs.MOE_ROUTER)
    assert (replace(drop.strategy, cuda_graphs=CudaGraphs.MOE_ROUTER),
            drop.training.micro_batch) == (dropless.strategy, 1)


@pytest.mark.parametrize("bad", ["0", "-1", "one"])
def test_a_bad_capacity_factor_names_the_column(catalog, bad):
    row = dict(_row("mb2509_qwen3_30b_a3b_b200_8gpu_fp8_tokendrop"), capacity_factor=bad)
    with pytest.raises(SpecError, match=r"^capacity_factor: expected a positive number"):
        row_config(row, catalog)


def test_natural_routing_rows_run_the_aux_loss_balance_and_forced_rows_uniform(catalog):
    """The card's natural-routing runs (``moe_router_force_load_balancing=false``, the recipe's
    auxiliary loss) against its forced-balance twin of the same layout."""
    natural = row_config(_row("mbcard_qwen3_30b_a3b_h100_16gpu_bf16_natural_routing"), catalog).job
    forced = row_config(_row("mbcard_qwen3_30b_a3b_h100_16gpu_bf16_hybridep_no_a2a_overlap"),
                        catalog).job
    assert natural.training.moe.balance is RouterBalance.AUX_LOSS
    assert forced.training.moe.balance is RouterBalance.UNIFORM
    assert natural.strategy == forced.strategy
    balanced = [r["id"] for r in csv.DictReader(MOE.open()) if r["router_balance"] == "aux_loss"]
    assert all(i.endswith("natural_routing") for i in balanced) and len(balanced) == 2


def test_an_unknown_router_balance_names_the_field(catalog):
    with pytest.raises(SpecError, match=r"training\.moe\.balance: expected one of"):
        row_config(dict(_row("mbcard_qwen3_30b_a3b_h100_16gpu_bf16_natural_routing"),
                        router_balance="natural"), catalog)


def test_a_run_without_mtp_drops_the_module_its_preset_config_has(catalog):
    """Megatron-Bridge prints DeepSeek-V3 runs "w/ MTP" and "w/o MTP" (25.11 table): the
    ``mtp_layers`` column sets Megatron-Core's mtp_num_layers over the config's one module."""
    row = _row("mb2511_deepseek_v3_b200_256gpu_mxfp8")          # printed "w/ MTP"
    with_mtp = row_config(dict(row, mtp_layers=""), catalog).job.model
    without = row_config(dict(row, mtp_layers="0"), catalog).job.model
    assert (with_mtp.mtp_layers, without.mtp_layers) == (1, 0)
    assert without.mtp_params == 0 < with_mtp.mtp_params
    assert replace(without, mtp_layers=1) == with_mtp
    with pytest.raises(SpecError, match="mtp_layers: expected 0 or more"):
        row_config(dict(row, mtp_layers="-1"), catalog)
