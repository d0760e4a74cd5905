"""Calibration without torch: fitting curves and alpha-beta from measurements, the profile file,
the CPU catalog entry, and measured-vs-predicted bookkeeping."""

import json
import math
import subprocess
import sys

import pytest
import yaml

from clustersim.hardware_specs import DeviceKind, OpClass, SpecError, load_catalog
from clustersim.hardware_specs.efficiency import MEASURED_AS
from clustersim.hardware_specs.measured_comm import AlphaBeta, CommOp
from clustersim.hardware_specs.node import NicKind, ScaleUpKind
from clustersim.simulator.cost.measured import MeasuredNetwork, measured_time
from clustersim.workloads import Strategy
from clustersim.workloads.trace import CollectiveKind

from clustersim.analysis.calibration.compare import (
    Comparison, calibration_config, compare, parse_strategy, predict, time_shared,
    time_shared_comm,
)
from clustersim.analysis.calibration.fit import (
    ADAM_BYTES_PER_PARAM, ELEMENTWISE_PASSES, attention_flops, comm_fits, compute_points,
    fit_alpha_beta, fit_profile, pooled_rates, profile_yaml,
)
from tests.conftest import REPO

PEAK = 78.4e9


def matmul_fraction(flops: float) -> float:
    """A made-up truth: small GEMMs slower, flat from 1 GFLOP on."""
    return 0.3 if flops < 1e8 else (0.8 if flops < 1e9 else 1.1)


def synthetic_records(alpha=200e-6, beta=1e9) -> list[dict]:
    """Measurements as the microbenchmarks would write them, generated from known rates."""
    recs = []
    for m, n, k in ((64, 64, 64), (128, 256, 128), (512, 768, 256), (1024, 1024, 1024),
                    (2048, 4096, 1024)):
        flops = 2.0 * m * n * k
        recs.append({"kind": "matmul", "layout": "fwd", "m": m, "n": n, "k": k,
                     "time_s": flops / (PEAK * matmul_fraction(flops))})
    for s in (128, 512, 1024):
        for p in ("fwd", "bwd"):
            flops = attention_flops(4, 4, s, 64, p == "bwd")
            recs.append({"kind": "attention", "pass": p, "batch": 4, "heads": 4, "seq": s,
                         "head_dim": 64, "time_s": flops / (PEAK * 0.4)})
    for e in (1 << 14, 1 << 18, 1 << 22):
        recs.append({"kind": "elementwise", "op": "residual.fwd", "elements": e,
                     "time_s": 12.0 * e / 10e9})
    for params in (1 << 18, 1 << 20):
        recs.append({"kind": "optimizer", "op": "adam", "params": params,
                     "time_s": ADAM_BYTES_PER_PARAM * params / 5e9})
    for world in (2, 4):
        for nbytes in (1 << 12, 1 << 16, 1 << 20, 1 << 24):
            for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
                fit = AlphaBeta(latency_s=alpha, bandwidth=beta if op != "all_gather" else beta / 3)
                recs.append({"kind": "collective", "op": op, "world": world, "bytes": nbytes,
                             "time_s": measured_time(fit, CommOp(op), world, nbytes)})
    return recs


def document(records=None) -> dict:
    return {"version": 1, "setup": {"device": "cpu"},
            "provenance": {"device": "AMD EPYC 7763", "driver": "kernel 6.1", "torch": "2.13.0",
                           "gloo": "bundled", "date": "2026-01-02T03:04:05Z"},
            "records": records if records is not None else synthetic_records()}


@pytest.fixture(scope="module")
def profile(catalog):
    return fit_profile(document(), catalog.device("cpu-core"), catalog.nodes["cpu-host"], "lab-cpu")


def test_cpu_catalog_entry_is_a_device_like_any_other(catalog):
    core = catalog.device("cpu-core")
    assert core.kind is DeviceKind.CPU and core.compute_units == 1
    # Zen 3: 2 FMA pipes x 8 FP32 lanes x 2 FLOP x 2.45 GHz base clock.
    assert core.peak_flops[next(iter(core.peak_flops))] == pytest.approx(2 * 8 * 2 * 2.45e9)
    node = catalog.nodes[core.default_node]
    assert node.scale_up_kind is ScaleUpKind.SHARED_MEMORY and node.nic_kind is NicKind.LOOPBACK
    cluster = catalog.cluster(device="cpu-core", num_devices=4)
    assert cluster.num_nodes == 1


def test_matmul_curve_reproduces_the_measured_fractions(profile):
    c = profile.device.efficiency.curves[OpClass.MATMUL]
    for flops in (2.0 * 64**3, 2.0 * 1024**3, 2.0 * 2048 * 4096 * 1024):
        assert c(flops) == pytest.approx(matmul_fraction(flops), rel=1e-4)
    assert profile.device.efficiency.curves[OpClass.ATTENTION](1e9) == pytest.approx(0.4, rel=1e-4)


def test_elementwise_curve_counts_bytes_as_the_simulator_does(profile):
    """A residual add moves 3 tensors (layer_ops residual1); the bandwidth of the profile is the
    best pooled rate and fractions are relative to it."""
    dev = profile.device
    assert dev.memory_bandwidth == pytest.approx(10e9, rel=1e-6)
    c = dev.efficiency.curves[OpClass.ELEMENTWISE]
    assert c(12.0 * (1 << 18)) == pytest.approx(1.0, rel=1e-4)
    adam = dev.efficiency.curves[OpClass.OPTIMIZER]
    assert adam(ADAM_BYTES_PER_PARAM * (1 << 20)) == pytest.approx(0.5, rel=1e-4)
    assert ELEMENTWISE_PASSES["residual.fwd"] == 3.0


def test_pooling_is_total_work_over_total_time():
    pts = compute_points([
        {"kind": "elementwise", "op": "layernorm.fwd", "elements": 1000, "time_s": 1e-6},
        {"kind": "elementwise", "op": "layernorm.fwd", "elements": 1001, "time_s": 3e-6}])
    [(size, rate)] = pooled_rates(pts[OpClass.ELEMENTWISE])
    assert size == pytest.approx(8 * math.sqrt(1000 * 1001))
    assert rate == pytest.approx(8 * 2001 / 4e-6)


def test_fast_measurements_raise_the_peak_instead_of_overflowing_the_curve(catalog):
    recs = [r for r in synthetic_records() if r["kind"] != "matmul"]
    recs += [{"kind": "matmul", "layout": "fwd", "m": n, "n": n, "k": n,
              "time_s": 2.0 * n**3 / (3.0 * PEAK)} for n in (256, 1024)]
    p = fit_profile(document(recs), catalog.device("cpu-core"), catalog.nodes["cpu-host"], "x")
    peak = next(iter(p.device.peak_flops.values()))
    assert peak == pytest.approx(3.0 * PEAK)
    assert max(p.device.efficiency.curves[OpClass.MATMUL].fractions) == pytest.approx(1.0)


@pytest.mark.parametrize("op", list(CommOp)[:3] + [CommOp.SEND_RECV])
def test_alpha_beta_recovered_from_ring_timings_even_with_an_outlier(op):
    truth = AlphaBeta(latency_s=150e-6, bandwidth=2e9)
    pts = [(w, b, measured_time(truth, op, w, b)) for w in (2, 4) for b in (1e3, 1e5, 1e7)]
    pts.append((2, 1e4, 10 * measured_time(truth, op, 2, 1e4)))  # a descheduled rank
    fit = fit_alpha_beta(pts, op)
    assert fit.latency_s == pytest.approx(truth.latency_s, rel=1e-6)
    assert fit.bandwidth == pytest.approx(truth.bandwidth, rel=1e-6)


def test_alpha_beta_needs_time_to_grow_with_size():
    with pytest.raises(SpecError, match="measure larger messages"):
        fit_alpha_beta([(2, 1e3, 1e-3), (2, 1e6, 5e-4)], CommOp.ALL_REDUCE)


def test_profile_file_loads_in_the_catalog_with_provenance(profile, tmp_path):
    path = tmp_path / "lab-cpu.yaml"
    path.write_text(profile_yaml(profile))
    cat = load_catalog([path])
    dev, node = cat.device("lab-cpu"), cat.nodes["lab-cpu"]
    for key in ("device", "driver", "torch", "gloo", "date"):
        assert dev.provenance[key]
    assert dev.provenance["base"] == "cpu-core" and dev.default_node == "lab-cpu"
    assert OpClass.TRANSCENDENTAL not in dev.efficiency.curves  # none measured: falls back
    for op in profile.device.efficiency.curves:
        assert dev.efficiency.curves[op](1e9) == pytest.approx(
            profile.device.efficiency.curves[op](1e9), rel=1e-5)
    fits = comm_fits(synthetic_records())
    for op, fit in fits.items():
        assert node.measured_comm[op].bandwidth == pytest.approx(fit.bandwidth, rel=1e-5)
    assert node.collective_latency_s == pytest.approx(fits[CommOp.ALL_REDUCE].latency_s, rel=1e-5)


def test_measured_network_times_collectives_with_the_fits(profile, tmp_path):
    path = tmp_path / "lab-cpu.yaml"
    path.write_text(profile_yaml(profile))
    cluster = load_catalog([path]).cluster(device="lab-cpu", num_devices=4)
    net = MeasuredNetwork(cluster)
    fit = cluster.node.measured_comm[CommOp.ALL_GATHER]
    t = net.collective_time(CollectiveKind.ALL_GATHER, 8e6, ((0, 1, 2, 3),))
    assert t == pytest.approx(3 * fit.latency_s + 0.75 * 8e6 / fit.bandwidth)
    p2p = cluster.node.measured_comm[CommOp.SEND_RECV]
    assert net.p2p_time(1e6, 0, 1) == pytest.approx(p2p.latency_s + 1e6 / p2p.bandwidth)


def test_fit_rejects_documents_without_measurements(catalog):
    with pytest.raises(SpecError, match="no measurements"):
        fit_profile(document([]), catalog.device("cpu-core"), catalog.nodes["cpu-host"], "x")
    only_gemms = [r for r in synthetic_records() if r["kind"] == "matmul"]
    with pytest.raises(SpecError, match="too few attention, elementwise"):
        fit_profile(document(only_gemms), catalog.device("cpu-core"), catalog.nodes["cpu-host"], "x")


@pytest.mark.parametrize("text, expected", [
    ("dp2", Strategy(dp=2)), ("fsdp2", Strategy(dp=2, zero=3)), ("tp2", Strategy(tp=2)),
    ("pp2xdp2", Strategy(pp=2, dp=2)), ("DP2xTP2", Strategy(dp=2, tp=2))])
def test_strategy_names(text, expected):
    assert parse_strategy(text) == expected


@pytest.mark.parametrize("text", ["dp", "zp2", "dp2xdp2", "tp2xfsdp2xdp2"])
def test_bad_strategy_names_are_rejected(text):
    with pytest.raises(SpecError, match="--strategies"):
        parse_strategy(text)


def test_time_shared_core_divides_the_rates(catalog):
    core = catalog.device("cpu-core")
    half = time_shared(core, 2.0)
    assert half.memory_bandwidth == core.memory_bandwidth / 2
    assert list(half.peak_flops.values()) == [v / 2 for v in core.peak_flops.values()]
    assert time_shared(catalog.device("h100-sxm"), 2.0) is catalog.device("h100-sxm")


def test_oversubscribed_host_predicts_a_slower_step(catalog):
    """4 ranks on 2 cores: each rank's core is shared, so a step takes longer than with 4 cores."""
    config = calibration_config(parse_strategy("pp2xdp2"), "cpu-core")
    assert predict(config, cores=2).step_time_s > 1.5 * predict(config, cores=4).step_time_s


def test_compare_reports_signed_errors_and_the_baseline(profile, tmp_path):
    path = tmp_path / "lab-cpu.yaml"
    path.write_text(profile_yaml(profile))

    class Fake:
        step_time_s = 0.5
        phases_s = {"forward": 0.1}
        losses = (7.6,)

    rows = compare(["dp2", "tp2"], device="lab-cpu", catalog=[path], repeats=3,
                   baseline="cpu-core", cores=2, measure=lambda job: Fake())
    for row in rows:
        assert row.measured_step_time_s == 0.5
        assert row.error == pytest.approx(row.predicted_step_time_s / 0.5 - 1)
        assert row.baseline_error == pytest.approx(row.baseline_step_time_s / 0.5 - 1)
        d = row.to_dict()
        assert {"strategy", "measured_step_time_s", "predicted_step_time_s", "error"} <= set(d)
    assert Comparison(strategy="x", measured_runs_s=(1.0, 3.0, 2.0),
                      predicted_step_time_s=1.5).error == pytest.approx(-0.25)


def clustersim(*args):
    return subprocess.run([sys.executable, "-m", "clustersim", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_fit_writes_a_loadable_profile(tmp_path):
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "microbench.json").write_text(json.dumps(document()))
    out = tmp_path / "my-cluster.yaml"
    run = clustersim("calibrate", "fit", str(prof), "--out", str(out))
    assert run.returncode == 0, run.stderr
    data = yaml.safe_load(out.read_text())
    assert list(data["devices"]) == ["my-cluster"] and list(data["nodes"]) == ["my-cluster"]
    shown = clustersim("hardware", "show", "my-cluster", "--catalog", str(out), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["provenance"]["date"] == "2026-01-02T03:04:05Z"


@pytest.mark.slow
def test_cli_fit_without_measurements_exits_2(tmp_path):
    run = clustersim("calibrate", "fit", str(tmp_path), "--out", str(tmp_path / "x.yaml"))
    assert run.returncode == 2
    assert run.stderr.startswith("error: DIR: no microbench.json in")


def test_optimizer_kernels_use_their_own_curve_or_else_the_elementwise_one(profile):
    from dataclasses import replace

    from clustersim.simulator.cost.compute import ComputeModel
    from clustersim.workloads.layer_ops import Kernel
    adam = Kernel("adam", OpClass.OPTIMIZER, 12e6, 28e6)
    eff = profile.device.efficiency
    assert ComputeModel(profile.device).efficiency(adam) == eff.curves[OpClass.OPTIMIZER](28e6)
    older = replace(profile.device, efficiency=replace(eff, curves={
        op: c for op, c in eff.curves.items() if op is not OpClass.OPTIMIZER}))
    assert ComputeModel(older).efficiency(adam) == eff.curves[OpClass.ELEMENTWISE](28e6)


def test_in_training_factor_is_predicted_over_measured_reference_step(catalog, tmp_path):
    from clustersim.analysis.calibration.fit import reference_prediction
    base = fit_profile(document(), catalog.device("cpu-core"), catalog.nodes["cpu-host"], "x")
    assert base.device.efficiency.in_training == {}
    reference = {"kind": "reference_step", "time_s": 1.0, "training": {
        "seq_len": 64, "global_batch": 2, "micro_batch": 1, "precision": "fp32"},
        "model": {"name": "ref", "layers": 2, "hidden": 128, "heads": 2, "vocab": 256,
                  "position": "learned", "max_positions": 64}}
    predicted = reference_prediction(reference, base.device)
    slower = dict(reference, time_s=predicted / 0.8)
    p = fit_profile(document(synthetic_records() + [slower]), catalog.device("cpu-core"),
                    catalog.nodes["cpu-host"], "x")
    assert p.device.efficiency.in_training == {op: pytest.approx(0.8) for op in OpClass
                                               if op not in MEASURED_AS}
    path = tmp_path / "x.yaml"
    path.write_text(profile_yaml(p))
    loaded = load_catalog([path]).device("x").efficiency.in_training
    assert loaded[OpClass.MATMUL] == pytest.approx(0.8, rel=1e-5)


def test_collectives_slow_down_in_training_as_the_tensor_parallel_reference_step_shows(catalog,
                                                                                      tmp_path):
    """The TP reference step, less its predicted compute, over its all-reduces' fitted time
    scales every collective fit (latency and bandwidth alike)."""
    from clustersim.analysis.calibration.fit import _reference_ops, reference_prediction
    from clustersim.workloads.trace import CollectiveOp
    base = fit_profile(document(), catalog.device("cpu-core"), catalog.nodes["cpu-host"], "x")
    reference = {"kind": "reference_step", "tp": 2, "training": {
        "seq_len": 64, "global_batch": 2, "micro_batch": 1, "precision": "fp32"},
        "model": {"name": "ref", "layers": 2, "hidden": 128, "heads": 2, "vocab": 256,
                  "position": "learned", "max_positions": 64}}
    fit = base.node.measured_comm[CommOp.ALL_REDUCE]
    comm = sum(measured_time(fit, CommOp.ALL_REDUCE, 2, op.bytes)
               for op in _reference_ops(reference) if isinstance(op, CollectiveOp))
    assert comm > 0
    measured = reference_prediction(reference, base.device) + 1.5 * comm
    p = fit_profile(document(synthetic_records() + [dict(reference, time_s=measured)]),
                    catalog.device("cpu-core"), catalog.nodes["cpu-host"], "x")
    assert p.device.efficiency.in_training == {}    # the TP step does not set the compute factor
    assert p.node.measured_comm == base.node.measured_comm
    assert p.node.comm_in_training == pytest.approx(1.5)
    path = tmp_path / "x.yaml"
    path.write_text(profile_yaml(p))
    cluster = load_catalog([path]).cluster(device="x", num_devices=2)
    assert cluster.node.comm_in_training == pytest.approx(1.5, rel=1e-5)
    from clustersim.simulator.cost.measured import MeasuredNetwork
    from clustersim.workloads.trace import CollectiveKind
    plan = MeasuredNetwork(cluster).plan(CollectiveKind.ALL_REDUCE, 2**20, ((0, 1),))
    assert plan.time(None) == pytest.approx(1.5 * measured_time(fit, CommOp.ALL_REDUCE, 2, 2**20),
                                            rel=1e-4)
    # Two ranks per core: the fit's CPU work doubles, the in-step waiting hides behind it.
    shared = time_shared_comm(cluster.node, 2.0)
    assert shared.comm_in_training == 1.0
    assert shared.measured_comm[CommOp.ALL_REDUCE].latency_s == pytest.approx(2 * fit.latency_s,
                                                                              rel=1e-4)


MEASURED = REPO / "analysis" / "data" / "calibration" / "2026-11-30-amd-epyc-2-cores"


def test_committed_profile_is_what_fit_makes_of_the_committed_measurements(catalog, tmp_path):
    """The data folder is reproducible: refitting its microbench.json gives its profile.yaml,
    which loads like any catalog file and carries the measurement's provenance."""
    doc = json.loads((MEASURED / "microbench.json").read_text())
    refit = fit_profile(doc, catalog.device("cpu-core"), catalog.nodes["cpu-host"], "profile")
    path = tmp_path / "profile.yaml"
    path.write_text(profile_yaml(refit))
    assert path.read_text() == (MEASURED / "profile.yaml").read_text()
    device = load_catalog([MEASURED / "profile.yaml"]).device("profile")
    assert device.provenance["date"].startswith("2026-11-30")
    assert device.provenance["torch"].startswith("2.13.0")


def test_committed_validation_beats_the_uncalibrated_entry_on_average():
    rows = json.loads((MEASURED / "validate.json").read_text())
    assert {r["strategy"] for r in rows} == {"dp2", "fsdp2", "tp2", "pp2", "dp2xtp2"}
    calibrated = sum(abs(r["error"]) for r in rows) / len(rows)
    uncalibrated = sum(abs(r["baseline_error"]) for r in rows) / len(rows)
    assert calibrated < 0.2 < uncalibrated


def test_activations_and_the_loss_get_their_own_measured_curve(catalog):
    """On a CPU an erf GeLU streams far slower than a residual add; measured GeLU and
    cross-entropy kernels make a transcendental curve, and the activation and loss kernels of
    the layer model are timed by it, the norms and adds by the element-wise one."""
    from clustersim.simulator.cost.compute import ComputeModel
    from clustersim.workloads.layer_ops import LayerOps
    from clustersim.workloads.model_sources import resolve
    from clustersim.workloads.training import training_from_mapping
    slow = [{"kind": "elementwise", "op": "gelu.fwd", "elements": e, "time_s": 8.0 * e / 2.5e9}
            for e in (1 << 16, 1 << 20, 1 << 22)]
    p = fit_profile(document(synthetic_records() + slow), catalog.device("cpu-core"),
                    catalog.nodes["cpu-host"], "x")
    curves = p.device.efficiency.curves
    assert curves[OpClass.TRANSCENDENTAL](1e7) < curves[OpClass.ELEMENTWISE](1e7) / 3
    ops = LayerOps(resolve("llama2-7b"), training_from_mapping(
        {"seq_len": 512, "global_batch": 4, "micro_batch": 1}), Strategy())
    kernels = {k.name: k for k in ops.forward().mlp + ops.head_forward()}
    assert kernels["activation"].op_class is OpClass.TRANSCENDENTAL
    assert kernels["cross_entropy"].op_class is OpClass.TRANSCENDENTAL
    assert kernels["norm2"].op_class is OpClass.ELEMENTWISE
    cpu, gpu = ComputeModel(p.device), ComputeModel(catalog.device("h100-sxm"))
    act, norm = kernels["activation"], kernels["norm2"]
    assert cpu.kernel_time(act) / act.bytes > 3 * cpu.kernel_time(norm) / norm.bytes
    # Without a curve of its own (the catalog GPUs) it streams like element-wise work.
    assert gpu.efficiency(act) == gpu.efficiency(norm)
