"""The human-readable summary of a step simulation."""

from __future__ import annotations

from clustersim.hardware_specs.units import format_bytes, format_rate, format_time

from clustersim.analysis.step import StepReport
from clustersim.analysis.tables import key_values, render

GIB = 2.0**30


def memory_table(report: StepReport) -> str:
    cap = report.config.cluster.device.memory_bytes
    rows = []
    for s in report.memory:
        mem = s.memory
        rows.append([s.stage, s.layers] + [f"{v / GIB:.1f}" for v in (
            mem.weights, mem.gradients, mem.optimizer, mem.activations, mem.comm_buffers,
            mem.reserve, mem.total)] + ["yes" if mem.total <= cap else "NO"])
    headers = ["stage", "layers", "weights", "grads", "optim", "activ", "buffers", "reserve",
               "total", "fits"]
    return render(headers, rows,
                  title=f"Memory per GPU (GiB; HBM {cap / GIB:.0f} GiB)")


def breakdown_table(report: StepReport) -> str:
    r = report.result
    b = r.breakdown
    step = r.step_time_s
    parts = [("compute", b.compute_s)]
    parts += [(f"exposed {axis.upper()} comm", t) for axis, t in b.exposed_comm_s.items() if t > 0]
    parts += [("pipeline bubble", b.bubble_s), ("optimizer", b.optimizer_s), ("other", b.other_s)]
    rows = [[name, f"{t:.4f}", f"{100 * t / step:.1f}%"] for name, t in parts if t > 0 or name == "compute"]
    return render(["where the time goes", "seconds", "share"], rows,
                  title=f"Step-time breakdown (critical rank class {r.critical_class}: "
                        f"{r.classes[r.critical_class].program})")


def summary(report: StepReport) -> str:
    cfg, r = report.config, report.result
    job, cluster = cfg.job, cfg.cluster
    s = job.strategy
    strategy = (f"TP{s.tp} PP{s.pp} DP{s.dp}" + (f" CP{s.cp}" if s.cp > 1 else "")
                + (f" EP{s.ep}" if s.ep > 1 else "")
                + f", {s.schedule.value}" + (f" v={s.virtual_stages}" if s.virtual_stages > 1 else "")
                + f", recompute {s.recompute.value}"
                + (f" (first {s.recompute_layers} layers of each chunk)"
                   if s.recompute_layers else "")
                + f", ZeRO-{s.zero}"
                + (", sequence parallel" if s.sequence_parallel else "")
                + (f", offload {s.offload.value}" if s.offload.value != "none" else ""))
    head = key_values([
        ("model", f"{job.model.name} ({job.model.parameters / 1e9:.2f}B parameters)"),
        ("cluster", f"{cluster.num_devices} x {cluster.device.name} in {cluster.num_nodes} "
                    f"{cluster.node.name} node{'s' if cluster.num_nodes > 1 else ''}, "
                    f"{cluster.fabric.name}"),
        ("strategy", strategy),
        ("batch", f"{job.training.global_batch} x {job.training.seq_len} tokens, micro-batch "
                  f"{job.training.micro_batch}, {job.micro_batches} micro-batches per pipeline, "
                  f"{job.training.precision.value}"),
        ("FLOPs per step", f"{job.model_flops_per_step:.4g} model, "
                           f"{job.hardware_flops_per_step:.4g} with recompute"),
        ("step time", format_time(r.step_time_s)),
        ("throughput", f"{r.tokens_per_s:,.0f} tokens/s, {r.tflops_per_gpu:.1f} TFLOP/s per GPU, "
                       f"MFU {100 * r.mfu:.1f}%"),
        ("peak memory", f"{format_bytes(r.peak_memory_gb * 1e9)} per GPU "
                        f"({'fits' if r.fits_in_memory else 'DOES NOT FIT'} in "
                        f"{format_bytes(cluster.device.memory_bytes)})"),
        ("simulated", f"{len(r.classes)} rank {'class' if len(r.classes) == 1 else 'classes'} "
                      f"for {cluster.num_devices} GPUs, {r.events:,} events in {r.wall_time_s:.2f} s"),
    ], title=f"clustersim: {cfg.name}")
    return "\n\n".join([head, breakdown_table(report), memory_table(report)])


def describe_rate(value: float) -> str:
    return format_rate(value, "FLOP/s")
