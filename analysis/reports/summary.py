"""The human-readable summary of a step simulation."""

from __future__ import annotations

from clustersim.hardware_specs.units import format_bytes, format_time
from clustersim.workloads.strategy import Recompute, replica_micro_batches
from clustersim.workloads.training import AttentionKernel

from clustersim.analysis.reports import mixed
from clustersim.analysis.step import CnnStepReport, StepReport
from clustersim.analysis.tables import key_values, render
from clustersim.workloads.memory import GIB


def memory_table(report: StepReport) -> str:
    cluster = report.config.cluster
    cap = cluster.smallest_memory_bytes
    rows = []
    for s in report.memory:
        mem = s.memory
        rows.append([s.stage, s.layers] + [f"{v / GIB:.1f}" for v in (
            mem.weights, mem.gradients, mem.optimizer, mem.activations, mem.comm_buffers,
            mem.fragmentation, mem.reserve, mem.total, mem.required)]
            + ["yes" if mem.required <= cap else "NO"])
    headers = ["stage", "layers", "weights", "grads", "optim", "activ", "buffers", "frag",
               "reserve", "total", "required", "fits"]
    hbm = " / ".join(f"{g.device.memory_bytes / GIB:.0f}" for g in cluster.device_groups)
    table = render(headers, rows, title=f"Memory per GPU (GiB; HBM {hbm} GiB)")
    if not cluster.groups:
        return table
    by_group = [[m.program, m.device, f"{m.peak_bytes / GIB:.1f}", f"{m.capacity_bytes / GIB:.0f}",
                 "yes" if m.fits else "NO"]
                for m in mixed.group_memory(cluster, report.trace)]
    return table + "\n\n" + render(["program", "device", "peak", "HBM", "fits"], by_group,
                                    title="Memory by device group (GiB)")


def simulated_line(r, gpus: int) -> str:
    """What the engine ran: rank classes, or (expanded) every rank's clock and how they spread."""
    classes = f"{len(r.classes)} rank {'class' if len(r.classes) == 1 else 'classes'}"
    work = f"{r.events:,} events in {r.wall_time_s:.2f} s"
    f = r.rank_finish_s
    if f is None:
        return f"{classes} for {gpus} GPUs, {work}"
    slowest = int(f.argmax())
    return (f"{len(f)} ranks on their own clocks as lanes of {classes}, {work}; ranks finish "
            f"from {format_time(float(f.min()))} to {format_time(float(f.max()))} "
            f"(slowest: rank {slowest})")


def breakdown_table(report: StepReport) -> str:
    r = report.result
    b = r.breakdown
    step = r.step_time_s
    parts = [("compute", b.compute_s)]
    parts += [(f"exposed {axis.upper()} comm", t) for axis, t in b.exposed_comm_s.items() if t > 0]
    parts += [("pipeline bubble", b.bubble_s), ("optimizer", b.optimizer_s),
              ("offload copies", b.offload_s), ("host issue", b.host_s), ("other", b.other_s)]
    rows = [[name, f"{t:.4f}", f"{100 * t / step:.1f}%"] for name, t in parts if t > 0 or name == "compute"]
    return render(["where the time goes", "seconds", "share"], rows,
                  title=f"Step-time breakdown (critical rank class {r.critical_class}: "
                        f"{r.classes[r.critical_class].program})")


def memory_banner(report: StepReport) -> str:
    """A banner when a stage does not fit in HBM (empty when all fit): the step time assumes
    memory that the GPU does not have."""
    if report.result.fits_in_memory:
        return ""
    cluster = report.config.cluster
    if cluster.groups:
        line = (f"DOES NOT FIT IN MEMORY: {mixed.overflow(cluster, report.trace)}; the step "
                "time below assumes memory those GPUs do not have")
        bar = "!" * min(len(line), 100)
        return f"{bar}\n{line}\n{bar}"
    cap = cluster.device.memory_bytes
    over = [s for s in report.memory if s.memory.required > cap] or list(report.memory)
    worst = max(over, key=lambda s: s.memory.required)
    stages = ", ".join(str(s.stage) for s in over)
    line = (f"DOES NOT FIT IN MEMORY: stage{'s' if len(over) > 1 else ''} {stages} "
            f"need{'' if len(over) > 1 else 's'} up to "
            f"{worst.memory.required / GIB:.1f} GiB per GPU of {cap / GIB:.1f} GiB; the step time "
            "below assumes memory the GPU does not have (try recompute, ZeRO, more pipeline "
            "stages or `clustersim sweep`)")
    bar = "!" * min(len(line), 100)
    return f"{bar}\n{line}\n{bar}"


def throughput_flops(report: StepReport) -> str:
    """TFLOP/s per GPU, saying which FLOPs: the model's (MFU's numerator, no recompute), and,
    when recompute adds work, the hardware's (what Megatron-LM's papers quote)."""
    job, r = report.config.job, report.result
    text = f"{r.tflops_per_gpu:.1f} TFLOP/s per GPU of model FLOPs"
    if job.hardware_flops_per_step > job.model_flops_per_step:
        hardware = r.tflops_per_gpu * job.hardware_flops_per_step / job.model_flops_per_step
        text += f" ({hardware:.1f} counting recomputation, as Megatron-LM's papers do)"
    return text


def recompute_note(report: StepReport) -> str:
    """Selective recomputation drops and recomputes the attention scores; a fused (flash)
    kernel never stores them, so with one it recomputes nothing and saves nothing."""
    job = report.config.job
    if job.strategy.recompute is not Recompute.SELECTIVE or \
            job.hardware_flops_per_step > job.model_flops_per_step:
        return ""
    return (f"recompute: selective changes nothing here: {job.training.attention.value} "
            "attention keeps no score matrix to drop (full recompute, of every layer or of "
            "recompute_layers, saves activation memory)")


def attention_note(report: StepReport) -> str:
    """``attention: flash`` is FlashAttention-2, whose rate on Blackwell (a part with
    FlashAttention-4-class kernels) is Hopper's placeholder: no published Blackwell run uses it."""
    cluster = report.config.cluster
    devices = [g.device for g in cluster.groups] if cluster.groups else [cluster.device]
    if report.config.job.training.attention is not AttentionKernel.FLASH or \
            not any(d.efficiency.attention_fa4 for d in devices):
        return ""
    return ("attention: flash runs FlashAttention-2, unmeasured on Blackwell (Hopper's rate "
            "stands in); Blackwell stacks run FlashAttention-4 / cuDNN kernels: attention: flash3")


def summary(report: StepReport) -> str:
    cfg, r = report.config, report.result
    job, cluster = cfg.job, cfg.cluster
    s = job.strategy
    cp_variant = ("" if s.cp_algorithm.value == "ring" else f" {s.cp_algorithm.value}"
                  + (f"({s.cp_a2a})" if s.cp_a2a else ""))
    strategy = (f"TP{s.tp} PP{s.pp} DP{s.dp}" + (f" CP{s.cp}{cp_variant}" if s.cp > 1 else "")
                + (f" EP{s.ep}" if s.ep > 1 else "")
                + (f" ETP{s.etp}" if s.ep > 1 and s.etp and s.etp != s.tp else "")
                + (f" ({s.ep_dispatcher.value})" if s.ep > 1 and s.ep_dispatcher.value != "alltoall"
                   else "")
                + f", {s.schedule.value}" + (f" v={s.virtual_stages}" if s.virtual_stages > 1 else "")
                + f", recompute {s.recompute.value}"
                + (f" (first {s.recompute_layers} layers of each chunk)"
                   if s.recompute_layers else "")
                + f", ZeRO-{s.zero}"
                + (f" HSDP ({s.dp_replicate} replicas x {s.zero_shards} shards)"
                   if s.dp_replicate > 1 else "")
                + (", sequence parallel" if s.sequence_parallel else "")
                + (f", offload {s.offload.value}" if s.offload.value != "none" else "")
                + (f", {s.subnetworks.count} subnetworks of {s.subnetworks.layers}/"
                   f"{job.model.layers} blocks" if s.subnetworks else ""))
    head = key_values([
        ("model", f"{job.model.name} ({job.model.parameters / 1e9:.2f}B parameters)"),
        ("cluster", mixed.cluster_line(cluster) if cluster.groups else
                    f"{cluster.num_devices} x {cluster.device.name} in {cluster.num_nodes} "
                    f"{cluster.node.name} node{'s' if cluster.num_nodes > 1 else ''}, "
                    f"{cluster.fabric.name}"),
        ("strategy", strategy),
        ("batch", f"{job.training.global_batch} x {job.training.seq_len} tokens, micro-batch "
                  f"{job.training.micro_batch}, {_micro_batches(job)} per pipeline, "
                  f"{job.training.precision.value}"),
        ("FLOPs per step", f"{job.model_flops_per_step:.4g} model, "
                           f"{job.hardware_flops_per_step:.4g} with recompute"),
        ("step time", format_time(r.step_time_s)),
        ("throughput", f"{r.tokens_per_s:,.0f} tokens/s, {throughput_flops(report)}, "
                       f"MFU {100 * r.mfu:.1f}%"),
        ("peak memory", f"{format_bytes(r.peak_memory_gb * 1e9)} per GPU "
                        f"({'fits' if r.fits_in_memory else 'DOES NOT FIT'} in "
                        + (" / ".join(format_bytes(g.device.memory_bytes) for g in cluster.groups)
                           if cluster.groups else format_bytes(cluster.device.memory_bytes))
                        + ")"),
        ("DP traffic", f"{format_bytes(report.dp_bytes_per_gpu)} per GPU per step"),
        ("simulated", simulated_line(r, cluster.num_devices)),
        *[("note", note) for note in (recompute_note(report), attention_note(report)) if note],
    ], title=f"clustersim: {cfg.name}")
    parts = [head, breakdown_table(report), memory_table(report)]
    banner = memory_banner(report)
    return "\n\n".join([banner, *parts] if banner else parts)


def _micro_batches(job) -> str:
    """``16 micro-batches``, or each replica's count under uneven data parallelism."""
    counts = replica_micro_batches(job.training, job.strategy)
    if len(set(counts)) == 1:
        return f"{counts[0]} micro-batches"
    return f"{'/'.join(str(c) for c in counts)} micro-batches (by replica)"


def cnn_summary(report: CnnStepReport) -> str:
    cfg, r = report.config, report.result
    job, cluster = cfg.job, cfg.cluster
    grid = "x".join(map(str, job.grid.split))
    head = key_values([
        ("model", f"{job.model.name} ({job.model.parameters / 1e6:.2f}M parameters, "
                  f"{job.model.training_flops_per_sample / 1e9:.1f} GFLOP per sample trained; "
                  f"{job.model.source})"),
        ("cluster", f"{cluster.num_devices} x {cluster.device.name} in {cluster.num_nodes} "
                    f"{cluster.node.name} node{'s' if cluster.num_nodes > 1 else ''}, "
                    f"{cluster.fabric.name}"),
        ("strategy", f"spatial {grid} ({job.grid.size} GPUs per sample) x DP{job.dp}"),
        ("batch", f"{job.global_batch} samples, micro-batch {job.micro_batch} per grid, "
                  f"{job.micro_batches} micro-batches, {job.precision.value}, "
                  f"{job.optimizer.value}"),
        ("step time", format_time(r.step_time_s)),
        ("throughput", f"{r.tokens_per_s:,.1f} samples/s, {r.tflops_per_gpu:.1f} TFLOP/s per "
                       f"GPU, MFU {100 * r.mfu:.1f}%"),
        ("peak memory", f"{format_bytes(r.peak_memory_gb * 1e9)} per GPU "
                        f"({'fits' if r.fits_in_memory else 'DOES NOT FIT'} in "
                        f"{format_bytes(cluster.device.memory_bytes)})"),
        ("DP traffic", f"{format_bytes(report.dp_bytes_per_gpu)} per GPU per step"),
        ("simulated", simulated_line(r, cluster.num_devices)),
        ("note", "exposed SPATIAL comm is the halo exchange (and the gather before the dense "
                 "layers) the step waits for"),
    ], title=f"clustersim: {cfg.name}")
    return "\n\n".join([head, breakdown_table(report), memory_table(report)])
