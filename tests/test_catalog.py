import pytest

from clustersim.hardware_specs import Dtype, SpecError, load_catalog

DEVICES = ["v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h100-96gb", "h200",
           "b200", "gb200", "gb300", "mi300x"]
NODES = ["dgx-2", "dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "mi300x-node"]


@pytest.mark.parametrize("name", DEVICES)
def test_every_issue_device_is_in_the_catalog_with_a_source(catalog, name):
    dev = catalog.devices[name]
    assert dev.source, "every spec carries its source"
    assert dev.flops(Dtype.FP32) > 0 and dev.memory_bytes > 0 and dev.memory_bandwidth > 0
    assert dev.default_node in catalog.nodes
    assert 0 < dev.efficiency.matmul <= 1


@pytest.mark.parametrize("name", NODES)
def test_every_issue_node_resolves_its_tiers(catalog, name):
    node = catalog.nodes[name]
    assert node.host_memory in catalog.memory_tiers
    assert node.local_storage in catalog.memory_tiers
    assert node.devices_per_node >= 1 and node.source


def test_published_datasheet_numbers(catalog):
    h100 = catalog.devices["h100-sxm"]
    assert h100.flops(Dtype.BF16) == pytest.approx(989.5e12)
    assert h100.memory_bandwidth == pytest.approx(3.35e12)
    assert catalog.nodes["dgx-h100"].nic_bandwidth == pytest.approx(50e9)   # 400 Gb/s NDR
    a100 = catalog.devices["a100-80gb"]
    assert a100.flops(Dtype.BF16) == pytest.approx(312e12)
    with pytest.raises(SpecError, match="no fp8 rate"):
        a100.flops(Dtype.FP8)


def test_grand_teton_h100_is_the_hbm2e_part_the_torchtitan_benchmarks_ran_on(catalog):
    """torchtitan's H100 benchmarks: '96GB HBM2e with 2.4 TB/sec peak memory bandwidth', '500W
    power limit', 8 per host with 400 Gb/s RDMA per GPU; no source gives its sustained clock at
    500 W, so it keeps H100 SXM's tensor rates and differs from it only where sources say."""
    gt, sxm = catalog.devices["h100-hbm2e-500w"], catalog.devices["h100-sxm"]
    assert gt.memory_bandwidth == pytest.approx(2.4e12) and gt.tdp_w == 500
    assert gt.memory_bytes == 94 * 2**30            # HBM2e H100 as measured, arXiv 2604.11391
    assert gt.flops(Dtype.BF16) == sxm.flops(Dtype.BF16)
    assert gt.efficiency == sxm.efficiency
    cluster = catalog.cluster(device="h100-hbm2e-500w", num_devices=256)
    assert (cluster.node.name, cluster.num_nodes) == ("grand-teton-h100", 32)
    assert cluster.node.nic_count * cluster.node.nic_bandwidth * 8 == pytest.approx(8 * 400e9)


def test_llama3_failure_rates_reproduce_the_paper_count(catalog):
    model = catalog.failure_models["llama3-405b-h100"]
    node_days = 2048 * 54
    unexpected = sum(r for c, r in model.rates_per_1000_node_days.items()
                     if c.value != "maintenance") * node_days / 1000
    assert unexpected == pytest.approx(419, rel=0.005)


def test_cluster_defaults_to_usual_node_and_nonblocking_fabric(catalog):
    cluster = catalog.cluster(device="h100-sxm", num_devices=64)
    assert cluster.node.name == "dgx-h100" and cluster.num_nodes == 8
    assert all(t.oversubscription == 1 for t in cluster.fabric.tiers)


def test_user_catalog_overrides_and_extends(tmp_path):
    (tmp_path / "mine.yaml").write_text("""
devices:
  my-gpu:
    vendor: acme
    peak_flops: {bf16: 500 TFLOPS, fp32: 50 TFLOPS}
    memory: 96 GiB
    memory_bandwidth: 4 TB/s
    l2_cache: 60 MB
    compute_units: 120
    tdp: 600 W
    default_node: dgx-h100
    efficiency: {matmul: 0.8, attention: 0.5, memory: 0.9}
""")
    catalog = load_catalog([tmp_path])
    assert catalog.devices["my-gpu"].memory_bytes == 96 * 2**30
    assert "h100-sxm" in catalog.devices


def test_bad_catalog_entry_names_file_and_field(tmp_path):
    (tmp_path / "bad.yaml").write_text("devices:\n  x:\n    vendor: acme\n    memory: lots\n")
    with pytest.raises(SpecError, match="bad.yaml: devices.x"):
        load_catalog([tmp_path])
