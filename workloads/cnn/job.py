"""A 3D CNN training job: the network, what a step processes, and its hybrid parallelism
(a spatial grid per sample, data parallelism across grids).

In a run config::

    model: cosmoflow                 # a preset (workloads/cnn/presets.py) or a layer list
    training: {global_batch: 64, micro_batch: 1, precision: fp16, optimizer: sgd}
    strategy: {dp: 8, spatial: [2, 2, 2]}   # ranks per sample along depth, height, width
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.fields import Fields
from clustersim.workloads.cnn.memory import CnnMemory, CnnOptimizer
from clustersim.workloads.cnn.network import CnnSpec, cnn_from_mapping
from clustersim.workloads.cnn.presets import CNN_PRESETS, cnn_preset
from clustersim.workloads.cnn.spatial import SpatialGrid
from clustersim.workloads.memory import MemoryBreakdown
from clustersim.workloads.training import Precision


@dataclass(frozen=True, kw_only=True, slots=True)
class CnnJob:
    model: CnnSpec
    grid: SpatialGrid
    dp: int
    """Data-parallel replicas: grids, each training its own samples."""
    global_batch: int
    """Samples per step."""
    micro_batch: int
    """Samples a grid processes at once; a step accumulates gradients over the rest."""
    precision: Precision
    optimizer: CnnOptimizer

    @property
    def world_size(self) -> int:
        return self.dp * self.grid.size

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def model_flops_per_step(self) -> float:
        return self.model.training_flops_per_sample * self.global_batch

    def memory(self) -> MemoryBreakdown:
        return CnnMemory(spec=self.model, grid=self.grid, samples=self.micro_batch,
                         element_bytes=self.precision.activation_bytes,
                         optimizer=self.optimizer).breakdown()

    def checked(self, world_size: int | None = None) -> "CnnJob":
        """This job after its cross-checks (:class:`SpecError` names the field)."""
        if world_size is not None and world_size != self.world_size:
            raise SpecError("cluster.num_gpus", f"expected dp x spatial = {self.dp} x "
                            f"{self.grid.size} = {self.world_size} GPUs, got {world_size}")
        if self.global_batch % (self.dp * self.micro_batch):
            raise SpecError("training.global_batch", f"{self.global_batch} samples do not "
                            f"divide over dp {self.dp} x micro_batch {self.micro_batch}")
        self.grid.check(self.model)
        return self


def is_cnn_model(value: object) -> bool:
    """Whether a run config's ``model`` names a 3D CNN: a preset, or a mapping whose ``layers``
    is a list (a transformer's inline ``layers`` is a count)."""
    if isinstance(value, str):
        return value in CNN_PRESETS
    return isinstance(value, Mapping) and isinstance(value.get("layers"), list)


def cnn_job_from_mapping(data: Mapping) -> CnnJob:
    """The ``model``, ``training`` and ``strategy`` sections of a 3D CNN run config."""
    top = Fields(data, "")
    raw = top.raw("model")
    model = cnn_preset(raw) if isinstance(raw, str) else cnn_from_mapping(raw)
    t = top.sub("training", required=True).only(
        ("global_batch", "micro_batch", "precision", "optimizer"))
    s = top.sub("strategy", required=True).only(("dp", "spatial"))
    split = s.integers("spatial", [1, 1, 1], minimum=1)
    if len(split) != 3:
        raise SpecError(s.at("spatial"), f"expected ranks along [depth, height, width], got "
                        f"{len(split)} numbers")
    job = CnnJob(model=model, grid=SpatialGrid(tuple(split)), dp=s.integer("dp", minimum=1),
                 global_batch=t.integer("global_batch", minimum=1),
                 micro_batch=t.integer("micro_batch", 1, minimum=1),
                 precision=t.choice("precision", Precision, Precision.FP16),
                 optimizer=t.choice("optimizer", CnnOptimizer, CnnOptimizer.SGD))
    if job.precision.quantized:
        raise SpecError(t.at("precision"), f"{job.precision.value} is not modelled for 3D CNNs; "
                        "expected fp32, fp16 or bf16")
    t.done()
    s.done()
    return job
