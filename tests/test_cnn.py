"""3D CNNs: layer lists against their sources, the halo formula, spatial x data parallel traces
through the engine, and the errors a bad layer list or grid gets."""

from __future__ import annotations

import math

import pytest

from clustersim.analysis.cli.main import main
from clustersim.hardware_specs import SpecError
from clustersim.workloads.cnn.builder import build_cnn_trace
from clustersim.workloads.cnn.job import cnn_job_from_mapping
from clustersim.workloads.cnn.layers import LayerKind, Volume
from clustersim.workloads.cnn.memory import saved_elements_per_sample
from clustersim.workloads.cnn.network import cnn_from_mapping
from clustersim.workloads.cnn.presets import cnn_preset
from clustersim.workloads.cnn.spatial import SpatialGrid
from clustersim.workloads.trace import CollectiveKind, CollectiveOp, Stream


def job(model="cosmoflow", spatial=(2, 2, 2), dp=2, batch=4, micro=1):
    return cnn_job_from_mapping({"model": model, "training": {"global_batch": batch,
                                                              "micro_batch": micro},
                                 "strategy": {"dp": dp, "spatial": list(spatial)}})


# --- the presets against their sources ------------------------------------------------------
def test_unet3d_parameters_are_cicek_et_al_total():
    """Çiçek et al., "3D U-Net", MICCAI 2016, sec. 2: "The architecture has 19069955
    parameters in total"; input 132 x 132 x 116 x 3, output 44 x 44 x 28 x 3 (Fig. 1)."""
    unet = cnn_preset("unet3d")
    assert unet.parameters == 19_069_955
    assert unet.input == Volume(3, (116, 132, 132))
    assert unet.output == Volume(3, (28, 44, 44))


def test_cosmoflow_follows_the_mlperf_reference_hyperparameters():
    """mlcommons/hpc cosmoflow/models/cosmoflow.py with configs/cosmo.yaml: conv_size 32,
    kernel_size 2, 5 conv layers doubling the filters, each max-pooled by 2; Dense 128, 64, 4.
    Keras counts a Conv3D as k^3 C_in C_out + C_out and a Dense as n_in n_out + n_out."""
    flow = cnn_preset("cosmoflow")
    shapes = flow.shapes()
    convs = [s for s in shapes if s.layer.kind is LayerKind.CONV]
    assert [s.layer.out_channels for s in convs] == [32, 64, 128, 256, 512]
    assert [s.input.extent[0] for s in convs] == [128, 64, 32, 16, 8]
    keras = sum(8 * c_in * c_out + c_out for c_in, c_out in
                ((4, 32), (32, 64), (64, 128), (128, 256), (256, 512)))
    keras += (4 ** 3 * 512) * 128 + 128 + 128 * 64 + 64 + 64 * 4 + 4
    assert flow.parameters == keras == 5_597_604
    # Forward: one multiply-add per output voxel, filter and weight of the window.
    macs = sum(s.output.voxels * s.layer.out_channels * 8 * s.layer.in_channels for s in convs)
    macs += 32768 * 128 + 128 * 64 + 64 * 4
    assert flow.forward_flops_per_sample == 2 * macs
    assert flow.training_flops_per_sample == 3 * flow.forward_flops_per_sample


def test_unet3d_flops_count_every_convolution_window():
    unet = cnn_preset("unet3d")
    total = 0
    for s in unet.shapes():
        if s.layer.kind is LayerKind.CONV:
            total += s.output.voxels * s.layer.out_channels * s.layer.in_channels * 27 \
                if s.layer.kernel == 3 else s.output.voxels * 64 * 3
        elif s.layer.kind is LayerKind.UPCONV:
            total += s.input.voxels * s.layer.in_channels * s.layer.out_channels * 8
    assert unet.forward_flops_per_sample == 2 * total


# --- halo exchange and memory ------------------------------------------------------------------
@pytest.mark.parametrize("split", [(2, 2, 2), (4, 4, 4), (1, 2, 4), (8, 1, 1)])
def test_halo_is_the_extended_block_minus_the_block(split):
    """Exchanging dimension by dimension carries exactly the halo region, edges and corners
    included: prod(b + w) - prod(b) elements per channel, w the planes received per split
    dimension (the wider side with 2 ranks, both sides with more)."""
    grid, volume, lo, hi = SpatialGrid(split), Volume(16, (64, 64, 64)), 1, 1
    block = grid.block(volume).extent
    width = [0 if p == 1 else (max(lo, hi) if p == 2 else lo + hi) for p in split]
    expected = 16 * (math.prod(b + w for b, w in zip(block, width)) - math.prod(block))
    assert sum(grid.halo_elements(volume, lo, hi).values()) == expected


def test_pools_and_strided_kernels_need_no_halo():
    flow = cnn_preset("cosmoflow")
    pools = [s.layer for s in flow.shapes() if s.layer.is_pool]
    assert all(layer.halo() == (0, 0) for layer in pools)
    conv = flow.layers[0]                   # kernel 2, 'same': TensorFlow pads after
    assert conv.pads() == (0, 1) and conv.halo() == (0, 1)


def test_activation_memory_divides_by_the_grid():
    one, eight = job(spatial=(1, 1, 1), dp=8, batch=8), job(spatial=(2, 2, 2), dp=1, batch=8)
    per_sample = saved_elements_per_sample(one.model) * 2
    assert one.memory().activations == per_sample
    halo = eight.memory().activations - per_sample / 8
    assert 0 < halo < 0.05 * per_sample / 8


# --- trace through the engine -------------------------------------------------------------------
def test_halo_exchanges_are_on_the_spatial_stream_and_only_with_a_grid():
    flat = build_cnn_trace(job(spatial=(1, 1, 1), dp=8, batch=8).checked(8))
    split = build_cnn_trace(job(spatial=(2, 2, 2), dp=1, batch=2).checked(8))
    def halos(trace):
        return [op for op in trace.programs[0].ops if isinstance(op, CollectiveOp)
                and op.kind is CollectiveKind.RING_EXCHANGE]
    assert halos(flat) == []
    assert halos(split) and all(op.stream is Stream.SPATIAL for op in halos(split))
    # conv1 forward: 1 plane (kernel 2, 'same') per split dimension of the 64^3 x 4 block
    first = [op for op in halos(split) if op.name.startswith("fwd0.conv1.")]
    assert [op.bytes for op in first] == [4 * 64 * 64 * 2, 4 * 65 * 64 * 2, 4 * 65 * 65 * 2]


def test_cosmoflow_example_runs_from_the_cli(capsys, tmp_path):
    out = tmp_path / "step.json"
    assert main(["simulate", "examples/cosmoflow_a100.yaml", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "samples/s" in text and "exposed SPATIAL comm" in text
    import json
    data = json.loads(out.read_text())
    assert data["samples_per_s"] == data["tokens_per_s"] > 0
    assert data["breakdown"]["exposed_comm_s"]["spatial"] > 0
    assert data["parameters"] == cnn_preset("cosmoflow-512").parameters


def test_a_bigger_grid_trains_faster():
    """Strong scaling: the same samples over more GPUs per sample."""
    from clustersim.analysis.step import run_cnn_step
    from clustersim.analysis.config import RunConfig
    from clustersim.hardware_specs import load_catalog
    catalog = load_catalog()
    times = []
    for split in ((1, 1, 1), (2, 2, 2)):
        j = job("cosmoflow-256", spatial=split, dp=1, batch=2).checked()
        cluster = catalog.cluster(device="a100-40gb", num_devices=j.world_size)
        times.append(run_cnn_step(RunConfig(job=j, cluster=cluster,
                                               catalog=catalog)).result.step_time_s)
    assert times[1] < times[0] / 4


# --- errors name the field ----------------------------------------------------------------------
def test_a_grid_that_does_not_divide_the_volume_is_an_error():
    with pytest.raises(SpecError, match=r"strategy\.spatial.*3 ranks along depth do not divide "
                                        r"layer conv1's input depth of 128"):
        job(spatial=(3, 1, 1)).checked()


def test_wrong_channels_in_a_layer_list_name_the_layer():
    bad = {"input": {"channels": 4, "extent": [32, 32, 32]}, "layers": [
        {"name": "c1", "kind": "conv3d", "in_channels": 4, "out_channels": 8, "kernel": 3,
         "padding": "same"},
        {"name": "c2", "kind": "conv3d", "in_channels": 16, "out_channels": 8, "kernel": 3}]}
    with pytest.raises(SpecError, match=r"model\.layers\[1\]\.in_channels: expected 8"):
        cnn_from_mapping(bad)
    bad["layers"][1] = {"name": "c2", "kind": "conv4d", "in_channels": 8, "out_channels": 8}
    with pytest.raises(SpecError, match=r"model\.layers\[1\]\.kind"):
        cnn_from_mapping(bad)


def test_gpus_must_match_the_grid_and_replicas():
    with pytest.raises(SpecError, match=r"cluster\.num_gpus: expected dp x spatial = 2 x 8"):
        job().checked(8)


def test_a_bad_cnn_config_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("model: cosmoflow\ntraining: {global_batch: 8}\n"
                    "strategy: {dp: 1, spatial: [2, 2]}\ncluster: {gpu: a100-40gb, num_gpus: 4}\n")
    assert main(["simulate", str(path)]) == 2
    assert "strategy.spatial" in capsys.readouterr().err


def test_other_commands_say_a_cnn_config_is_for_simulate(capsys, tmp_path):
    assert main(["sweep", "examples/cosmoflow_a100.yaml", "--out", str(tmp_path / "s")]) == 2
    assert "is a 3D CNN; only `clustersim simulate`" in capsys.readouterr().err


def test_unet_runs_its_skip_connections_and_up_convolutions(tmp_path, capsys):
    """A layer list from YAML, with a skip connection and an up-convolution, through the CLI."""
    path = tmp_path / "unet.yaml"
    path.write_text("""
model:
  name: tiny-unet
  input: {channels: 1, extent: [32, 32, 32]}
  layers:
    - {name: enc, kind: conv3d, in_channels: 1, out_channels: 8, kernel: 3, padding: same}
    - {name: pool, kind: maxpool3d}
    - {name: mid, kind: conv3d, in_channels: 8, out_channels: 16, kernel: 3, padding: same}
    - {name: up, kind: upconv3d, in_channels: 16, out_channels: 8, kernel: 2, bias: false}
    - {name: dec, kind: conv3d, in_channels: 16, out_channels: 8, kernel: 3, padding: same,
       concat: enc}
    - {name: head, kind: conv3d, in_channels: 8, out_channels: 2, kernel: 1, activation: false}
training: {global_batch: 4, micro_batch: 2}
strategy: {dp: 2, spatial: [2, 2, 1]}
cluster: {gpu: h100-sxm, num_gpus: 8}
""")
    out = tmp_path / "out.json"
    assert main(["simulate", str(path), "--json", str(out)]) == 0
    import json
    data = json.loads(out.read_text())
    assert data["parameters"] == (27 * 8 + 8) + (27 * 8 * 16 + 16) + 8 * 16 * 8 + (
        27 * 16 * 8 + 8) + (8 * 2 + 2)
    assert data["micro_batches_per_grid"] == 1
    assert data["breakdown"]["exposed_comm_s"]["spatial"] > 0


def test_the_cicek_unet_cannot_split_its_odd_bottom_extents():
    """Its valid convolutions leave 22 x 26 x 26 voxels at the third pool, 11 x 13 x 13 after
    it: no grid of 2 along any axis divides the bottom of the U."""
    with pytest.raises(SpecError, match=r"strategy\.spatial"):
        job("unet3d", spatial=(1, 1, 2), dp=1, batch=1).checked()


def test_a_transformer_mapping_with_a_layer_count_is_not_a_cnn():
    from clustersim.workloads.cnn.job import is_cnn_model
    assert not is_cnn_model({"layers": 32, "hidden": 4096})
    assert is_cnn_model({"layers": [{"name": "c", "kind": "conv3d"}]}) and is_cnn_model("unet3d")
    assert not is_cnn_model("llama3-8b")
