"""Offload over several memory tiers (``strategy.offload_split``): copies at each tier's
bandwidth, and each tier's capacity checked per node."""

from __future__ import annotations

import pytest

from clustersim.analysis.config import config_from_mapping
from clustersim.analysis.step import run_step
from clustersim.hardware_specs import SpecError
from clustersim.simulator.cost.memory import COPY_LAUNCH_S, MemoryModel
from clustersim.workloads.trace import CopyKind

DRAM, CXL, PMEM = "dgx-h100-ddr5", "cxl-cz120-x4", "optane-pmem-200-8x512gb"


def _config(model="llama3-8b", zero=1, **strategy):
    return config_from_mapping({
        "model": model,
        "training": {"seq_len": 8192, "global_batch": 64, "micro_batch": 1, "precision": "bf16"},
        "strategy": {"dp": 8, "zero": zero, "recompute": "full", "offload": "optimizer"} | strategy,
        "cluster": {"gpu": "h100-sxm", "num_gpus": 8}})


def test_copy_time_is_each_tiers_bytes_over_its_bandwidth():
    # One DGX H100 (8 GPUs, PCIe Gen5 x16 = 64 GB/s each). Every GPU streams at once, so each gets
    # 1/8 of a node-scope tier: DDR5 563.2 / 8 = 70.4 GB/s (capped by PCIe at 64), the four CZ120
    # CXL modules 144 / 8 = 18 GB/s, the PMem 200 write bandwidth 21.3 / 8 = 2.6625 GB/s.
    model = MemoryModel(_config(offload_split={DRAM: 0.6, CXL: 0.4}).cluster)
    expected = (COPY_LAUNCH_S + 0.6e9 / 64e9) + (COPY_LAUNCH_S + 0.4e9 / 18e9)
    assert model.copy_time(CopyKind.DEVICE_TO_HOST, 1e9) == pytest.approx(expected, rel=1e-12)
    # The host-side Adam step streams each share through host DRAM and its own tier.
    assert model.copy_time(CopyKind.HOST_COMPUTE, 1e9) == pytest.approx(
        0.6e9 / 70.4e9 + 0.4e9 / 18e9, rel=1e-12)
    pmem = MemoryModel(_config(offload_split={DRAM: 0.6, PMEM: 0.4}).cluster)
    assert pmem.copy_time(CopyKind.DEVICE_TO_HOST, 1e9) == pytest.approx(
        2 * COPY_LAUNCH_S + 0.6e9 / 64e9 + 0.4e9 / 2.6625e9, rel=1e-12)
    # All in one tier: the single-tier copy, unchanged.
    whole = MemoryModel(_config(offload_split={DRAM: 1.0}).cluster)
    assert whole.copy_time(CopyKind.DEVICE_TO_HOST, 1e9) == pytest.approx(
        MemoryModel(_config().cluster).copy_time(CopyKind.DEVICE_TO_HOST, 1e9), rel=1e-15)


def test_a_slower_tier_shows_in_offload_time():
    offload = [run_step(_config(offload_split=split)).result.breakdown.offload_s
               for split in ({DRAM: 1.0}, {DRAM: 0.6, CXL: 0.4}, {DRAM: 0.6, PMEM: 0.4})]
    assert offload[0] < offload[1] < offload[2]


def test_a_split_that_overflows_dram_is_refused_naming_the_tier():
    # Llama 3 405B's FP32 Adam state (12 bytes x 405.9e9 / 8 per GPU, x 8 GPUs = 4.9 TB a node)
    # does not fit the DGX H100's 2 TB of DDR5, nor does 60% of it; 40% does, with 60% (2.9 TB)
    # in the 4 TB of persistent memory.
    with pytest.raises(SpecError) as err:
        _config(model="llama3-405b", zero=3)
    assert err.value.field == "strategy.offload" and DRAM in err.value.message
    with pytest.raises(SpecError) as err:
        _config(model="llama3-405b", zero=3, offload_split={DRAM: 0.6, PMEM: 0.4})
    assert err.value.field == f"strategy.offload_split.{DRAM}" and DRAM in err.value.message
    fits = _config(model="llama3-405b", zero=3, offload_split={DRAM: 0.4, PMEM: 0.6})
    assert [(t.name, share) for t, share in fits.cluster.offload_placement] == [
        (DRAM, 0.4), (PMEM, 0.6)]


@pytest.mark.parametrize(("strategy", "field"), [
    ({"offload_split": {DRAM: 0.6, CXL: 0.3}}, "strategy.offload_split"),
    ({"offload_split": {DRAM: 0.5, "parallel-fs": 0.5}}, "strategy.offload_split.parallel-fs"),
    ({"offload_split": {DRAM: 1.0}, "offload": "none"}, "strategy.offload_split"),
    ({"offload_split": {DRAM: 1.0}, "offload_tier": CXL}, "strategy.offload_split"),
])
def test_bad_splits_name_the_field(strategy, field):
    with pytest.raises(SpecError) as err:
        _config(**strategy)
    assert err.value.field == field
