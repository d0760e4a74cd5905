"""What an accelerator (or a CPU used as one) is: peak rates, memory, links, power."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from clustersim.hardware_specs.dtypes import Dtype
from clustersim.hardware_specs.efficiency import MEASURED_AS, EfficiencyCurve, OpClass
from clustersim.hardware_specs.errors import SpecError
from clustersim.hardware_specs.fields import Fields
from clustersim.hardware_specs.units import Quantity


class DeviceKind(enum.Enum):
    GPU = "gpu"
    CPU = "cpu"


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceEfficiency:
    """How close real kernels get to the datasheet; measured, with the source in the catalog.

    The compute cost model multiplies these ceilings by its shape-dependent terms (wave
    quantisation, K-loop overhead, roofline); calibrated ``curves`` replace that model.
    """

    matmul: float
    """Largest fraction of dense peak a well-shaped GEMM reaches (e.g. a max-achievable-matmul
    measurement; clocks under power limits are why it is below 1)."""
    attention: float
    """Fraction of dense peak reached by fused (flash) attention, forward and backward."""
    memory: float
    """Fraction of HBM bandwidth a streaming element-wise kernel reaches."""
    matmul_fp8: float = 0.0
    """As ``matmul`` for FP8 GEMMs (0: same as ``matmul``)."""
    attention_fa3: float = 0.0
    """Fraction of dense peak FlashAttention-3-class kernels sustain inside a training step
    (measured in training, so no ``in_training`` factor applies; 0: the device has none)."""
    attention_fa4: float = 0.0
    """As ``attention_fa3`` for Blackwell's kernels (FlashAttention-4, cuDNN on sm100): the fraction
    of dense peak they sustain inside a training step (0: the device has none)."""
    compute_slowdown_when_overlapped: float = 0.0
    """Extra fraction of time compute takes while a transfer of the same rank moves data: the
    same cores (gloo on a CPU) or SMs (NCCL kernels) do both. Calibration measures it."""
    comm_slowdown_when_overlapped: float = 0.0
    """Extra fraction of time a transfer takes when it starts while compute runs."""
    in_training: Mapping[OpClass, float] = field(default_factory=dict)
    """Factor from isolated-kernel throughput to what a real training step sustains, by op
    class (clocks under the power cap with every GPU busy, cold caches, framework gaps);
    calibrated on published training runs of this device. Missing classes: 1.0."""
    curves: Mapping[OpClass, EfficiencyCurve] = field(default_factory=dict)
    """Measured ``size -> fraction`` curves by op class (from calibration); used when present."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceSpec:
    """One accelerator; all rates are dense (no structured sparsity), SI units."""

    name: str
    kind: DeviceKind
    vendor: str
    peak_flops: Mapping[Dtype, float]
    """Dense peak FLOP/s per arithmetic format the device supports."""
    memory_bytes: float
    """HBM (or, for a CPU, DRAM) capacity."""
    memory_bandwidth: float
    """HBM bandwidth, bytes/s."""
    l2_cache_bytes: float
    compute_units: int
    """Streaming multiprocessors (NVIDIA), compute units (AMD) or cores (CPU)."""
    scale_up_generation: str
    """NVLink generation (e.g. ``nvlink4``), ``xgmi``, ``pcie`` or ``none``."""
    scale_up_bandwidth: float
    """Total (both directions) scale-up bandwidth per device as datasheets quote it, bytes/s."""
    tdp_w: float
    efficiency: DeviceEfficiency
    exp_rate: float = 0.0
    """Exponentials per second its special-function units evaluate (MUFU.EX2; softmax's
    exponential in fused attention); 0: unknown, attention's cost then scales with head width
    as the FLOP count does."""
    attention_exp_rate: float = 0.0
    """``exp_rate`` of the device on which the attention fractions were measured (their
    exponential time is that device's); 0: this device's own. Blackwell Ultra takes B200's
    in-step fraction with twice B200's exponential rate."""
    default_node: str
    """Catalog name of the node this device usually comes in."""
    fp8_any_layout: bool = False
    """FP8 GEMMs take their operands in any layout (Transformer Engine's
    ``is_non_tn_fp8_gemm_supported``: compute capability 10.x, 11.x and 13.x on, that is
    Blackwell's sm_100/sm_103, not sm_120; ``transformer_engine/pytorch/utils.py``, v2.8), so a
    per-tensor FP8 tensor needs no transposed copy for the backward GEMMs. False: TN only (Hopper)."""
    source: str = ""
    provenance: Mapping[str, str] = field(default_factory=dict)
    """For calibrated profiles: device, driver, library versions, date."""

    def flops(self, dtype: Dtype) -> float:
        """Dense peak for ``dtype``; an unsupported format raises a clear error."""
        if dtype not in self.peak_flops:
            have = ", ".join(d.value for d in self.peak_flops)
            raise SpecError("training.precision",
                            f"{self.name} has no {dtype.value} rate (it has {have})")
        return self.peak_flops[dtype]

    @property
    def scale_up_bandwidth_per_direction(self) -> float:
        return self.scale_up_bandwidth / 2


def read_device(f: Fields) -> DeviceSpec:
    name = f.path.rsplit(".", 1)[-1]
    peaks = f.sub("peak_flops", required=True)
    peak_flops = {}
    for dtype in Dtype:
        if peaks.has(dtype.value):
            peak_flops[dtype] = peaks.quantity(dtype.value, Quantity.FLOPS)
    peaks.done()
    if not peak_flops:
        raise SpecError(peaks.path, "at least one dtype rate is required (fp32, bf16, ...)")
    eff = f.sub("efficiency", required=True)
    curves = {}
    curve_fields = eff.sub("curves")
    for op in OpClass:
        if op not in MEASURED_AS and curve_fields.has(op.value):
            c = curve_fields.sub(op.value)
            try:
                curves[op] = EfficiencyCurve(tuple(float(x) for x in c.items("sizes")),
                                             tuple(float(x) for x in c.items("fractions")))
            except SpecError as err:
                raise SpecError(c.path, err.message) from None
            c.done()
    curve_fields.done()
    derate_f = eff.sub("in_training")
    in_training = {op: derate_f.number(op.value, minimum=0.05, maximum=1.5)
                   for op in OpClass if op not in MEASURED_AS and derate_f.has(op.value)}
    derate_f.done()
    efficiency = DeviceEfficiency(
        matmul=eff.number("matmul", minimum=0.01, maximum=1.0),
        attention=eff.number("attention", minimum=0.01, maximum=1.0),
        memory=eff.number("memory", minimum=0.01, maximum=1.0),
        matmul_fp8=eff.number("matmul_fp8", 0.0, minimum=0.0, maximum=1.0),
        attention_fa3=eff.number("attention_fa3", 0.0, minimum=0.0, maximum=1.0),
        attention_fa4=eff.number("attention_fa4", 0.0, minimum=0.0, maximum=1.0),
        in_training=in_training,
        compute_slowdown_when_overlapped=eff.number("compute_slowdown_when_overlapped", 0.0,
                                                    minimum=0.0),
        comm_slowdown_when_overlapped=eff.number("comm_slowdown_when_overlapped", 0.0,
                                                 minimum=0.0),
        curves=curves,
    )
    eff.done()
    prov = f.sub("provenance")
    provenance = {str(k): str(v) for k, v in prov.data.items()}
    prov._read.update(prov.data)
    spec = DeviceSpec(
        name=name,
        kind=f.choice("kind", DeviceKind, DeviceKind.GPU),
        vendor=f.text("vendor"),
        peak_flops=peak_flops,
        memory_bytes=f.quantity("memory", Quantity.BYTES),
        memory_bandwidth=f.quantity("memory_bandwidth", Quantity.BANDWIDTH),
        l2_cache_bytes=f.quantity("l2_cache", Quantity.BYTES),
        compute_units=f.integer("compute_units", minimum=1),
        scale_up_generation=f.text("scale_up_generation", "none"),
        scale_up_bandwidth=f.quantity("scale_up_bandwidth", Quantity.BANDWIDTH, 0.0,
                                      positive=False),
        tdp_w=f.quantity("tdp", Quantity.POWER),
        efficiency=efficiency,
        exp_rate=f.quantity("exp_rate", Quantity.FLOPS, 0.0, positive=False),
        attention_exp_rate=f.quantity("attention_exp_rate", Quantity.FLOPS, 0.0, positive=False),
        default_node=f.text("default_node"),
        fp8_any_layout=f.boolean("fp8_any_layout", False),
        source=f.text("source", ""),
        provenance=provenance,
    )
    f.done()
    return spec
