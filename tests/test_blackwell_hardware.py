"""Blackwell and H800 catalog entries against their datasheets, NVL72 racks used partly, and
Blackwell's attention kernels."""

import pytest

from clustersim.hardware_specs import Dtype, OpClass, SpecError
from clustersim.hardware_specs.topology import Topology
from clustersim.simulator.cost.compute import ComputeModel
from clustersim.workloads.layer_ops import Kernel

T = 1e12

# Dense per-GPU rates (TFLOPS), HBM (GB, TB/s), NVLink both directions (TB/s): the datasheets
# and tables cited in hardware_specs/catalog/devices_nvidia_blackwell.yaml.
DATASHEET = {
    #          bf16  fp8   mxfp8 nvfp4  memory bw   nvlink
    "b200":   (2250, 4500, 4500, 10000, 180, 8.0, 1.8),
    "b300":   (2250, 4500, 4500, 15000, 288, 8.0, 1.8),
    "gb200":  (2500, 5000, 5000, 10000, 186, 8.0, 1.8),
    "gb300":  (2500, 5000, 5000, 15000, 288, 8.0, 1.8),
}


@pytest.mark.parametrize("name", DATASHEET)
def test_blackwell_rates_memory_and_nvlink_match_the_datasheets(catalog, name):
    bf16, fp8, mxfp8, nvfp4, mem_gb, bw_tbs, nvlink_tbs = DATASHEET[name]
    dev = catalog.devices[name]
    assert dev.flops(Dtype.BF16) == pytest.approx(bf16 * T)
    assert dev.flops(Dtype.FP8) == pytest.approx(fp8 * T)
    assert dev.flops(Dtype.MXFP8) == pytest.approx(mxfp8 * T)
    assert dev.flops(Dtype.NVFP4) == pytest.approx(nvfp4 * T)
    assert dev.memory_bytes == pytest.approx(mem_gb * 2**30)
    assert dev.memory_bandwidth == pytest.approx(bw_tbs * T)
    assert dev.scale_up_bandwidth == pytest.approx(nvlink_tbs * T)
    assert dev.source and dev.default_node in catalog.nodes


@pytest.mark.parametrize("node, device, nic_gbps", [
    ("dgx-b200", "b200", 400), ("hgx-b200", "b200", 400), ("dgx-b300", "b300", 800),
    ("hgx-b300", "b300", 800), ("gb200-nvl72", "gb200", 400), ("gb300-nvl72", "gb300", 800)])
def test_blackwell_nodes_have_one_nic_per_gpu_at_their_connectx_rate(catalog, node, device,
                                                                    nic_gbps):
    """ConnectX-7 at 400 Gb/s on B200 and GB200, ConnectX-8 at 800 Gb/s on B300 and GB300."""
    spec = catalog.nodes[node]
    assert spec.device == device and spec.source
    assert spec.nic_count == spec.devices_per_node
    assert spec.nic_bandwidth == pytest.approx(nic_gbps * 1e9 / 8)
    assert spec.scale_up_bandwidth == pytest.approx(900e9)    # 1.8 TB/s both directions


def test_hopper_has_no_microscaling_rates(catalog):
    with pytest.raises(SpecError, match="no mxfp8 rate"):
        catalog.devices["h100-sxm"].flops(Dtype.MXFP8)


def test_block_scaled_formats_carry_their_scales():
    """MXFP8: one E8M0 scale per 32 elements; NVFP4: one E4M3 scale per 16."""
    assert Dtype.MXFP8.bytes == pytest.approx(1 + 1 / 32)
    assert Dtype.NVFP4.bytes == pytest.approx(0.5 + 1 / 16)


def test_h800_is_an_h100_with_400_gbs_nvlink_and_eight_400g_nics(catalog):
    """DeepSeek arXiv 2505.09343: NVLink "reduced from 900 GB/s to 400 GB/s", "eight 400G
    Infiniband (IB) CX7 NICs" per node."""
    h800, h100 = catalog.devices["h800"], catalog.devices["h100-sxm"]
    assert h800.flops(Dtype.FP8) == h100.flops(Dtype.FP8)
    assert h800.scale_up_bandwidth == pytest.approx(400e9)
    node = catalog.nodes[h800.default_node]
    assert node.scale_up_bandwidth == pytest.approx(200e9)    # per direction
    assert node.nic_count == 8 and node.nic_bandwidth == pytest.approx(50e9)
    cluster = catalog.cluster(device="h800", num_devices=2048, fabric="multi-plane-fat-tree")
    assert cluster.num_nodes == 256


def test_256_gpus_on_nvl72_racks_use_64_of_each_72_as_the_recipes_do(catalog):
    cluster = catalog.cluster(device="gb200", num_devices=256, keep_together=8)
    assert cluster.devices_per_node == 64 and cluster.num_nodes == 4
    assert cluster.node.nic_count == 64                 # one ConnectX per GPU used
    top = Topology(cluster)
    assert top.path(0, 63) == ()                        # inside one rack: NVLink only
    assert top.path(63, 64) != ()                       # next rack: over the NICs


@pytest.mark.parametrize("gpus, keep, per_rack", [
    (8, 8, 8), (72, 1, 72), (128, 4, 64), (144, 8, 72), (2048, 16, 64), (96, 16, 48)])
def test_a_job_spreads_evenly_over_the_fewest_racks_in_whole_trays(catalog, gpus, keep, per_rack):
    cluster = catalog.cluster(device="gb300", num_devices=gpus, keep_together=keep)
    used = cluster.devices_per_node
    assert used == per_rack and used % keep == 0 and gpus % used == 0
    assert used % 4 == 0 or gpus <= 72                  # whole compute trays of 4 GPUs


def test_a_gpu_count_that_cannot_be_spread_evenly_is_an_error_naming_num_gpus(catalog):
    with pytest.raises(SpecError, match="cluster.num_gpus: 258 GPUs cannot be spread evenly"):
        catalog.cluster(device="gb200", num_devices=258)
    with pytest.raises(SpecError, match="12 is not a whole number of dgx-b200 nodes"):
        catalog.cluster(device="b200", num_devices=12)
    cluster = catalog.cluster(device="gb200", num_devices=256, devices_per_node=32)
    assert cluster.num_nodes == 8                       # an explicit gpus_per_node wins


def _attention(op):   # 16 sequences x 32 heads of 8K tokens, head dim 128
    return Kernel("flash_attn", op, 1e14, 1e9, 8192, 8192, 128, 512, Dtype.BF16)


@pytest.mark.parametrize("name", ["b200", "b300", "gb200", "gb300"])
def test_fa3_class_software_runs_blackwells_fa4_kernels_at_their_in_step_figure(catalog, name):
    """FlashAttention-4 measured inside a Llama-3.1-8B step on B200: 834 of 2250 TFLOPS = 0.37,
    with no in-training factor on top (ml-engineering insights/when-to-upgrade-gpus)."""
    model = ComputeModel(catalog.device(name))
    assert model.efficiency(_attention(OpClass.ATTENTION_FA3)) == pytest.approx(0.37, rel=0.02)
    assert model.efficiency(_attention(OpClass.ATTENTION_FA4)) == pytest.approx(0.37, rel=0.02)


def test_fa4_kernels_do_not_exist_before_blackwell(catalog):
    h100 = ComputeModel(catalog.device("h100-sxm"))
    assert h100.kernel_time(_attention(OpClass.ATTENTION_FA4)) == h100.kernel_time(
        _attention(OpClass.ATTENTION))
