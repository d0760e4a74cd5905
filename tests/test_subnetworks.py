"""Subnetwork Data Parallelism (Singh et al., "Model Parallelism With Subnetwork Data
Parallelism", arXiv 2507.09029): what a replica stores, computes and reduces."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clustersim.analysis.config import config_from_mapping
from clustersim.analysis.step import run_step
from clustersim.hardware_specs import SpecError
from clustersim.workloads.axes import SUBNETWORK_DATA_GROUP
from clustersim.workloads.shards import stage_shards
from clustersim.workloads.stages import stage_plans

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama3_8b_subnetworks.yaml"


def _config(**strategy):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["strategy"] = {k: v for k, v in (data["strategy"] | strategy).items() if v is not None}
    return config_from_mapping(data)


@pytest.fixture(scope="module")
def steps():
    return run_step(_config()), run_step(_config(subnetworks=None))


def test_memory_reduction_is_in_the_papers_range(steps):
    # arXiv 2507.09029 v4 abstract: "SDP reduces per-device memory usage by 30%-75%". Half of
    # the blocks per replica (block level, forward masking) on Llama-3-8B must land in it.
    sdp, plain = (max(s.memory.total for s in r.memory) for r in steps)
    assert 0.30 <= 1 - sdp / plain <= 0.75


def test_a_replica_stores_computes_and_reduces_only_its_blocks(steps):
    sdp, plain = steps
    job = sdp.config.job
    shards = stage_shards(job.model, job.strategy, stage_plans(job.model, job.strategy)[0])
    assert len(shards.layers) == 16
    block = shards.layers[0][0]
    assert (block.group, block.ranks) == (SUBNETWORK_DATA_GROUP, 32 * 16 // 32)
    assert shards.root.ranks == 32                     # embedding and head: in every subnetwork
    group = sdp.trace.group_sets[SUBNETWORK_DATA_GROUP].groups
    assert len(group) == 2 and all(len(g) == 16 for g in group)
    # ZeRO-0 all-reduces every gradient once per step, 2 bytes each (bf16).
    held = sum(s.params for layer in shards.layers.values() for s in layer) + shards.root.params
    assert sdp.dp_bytes_per_gpu == pytest.approx(2 * held)
    assert held == pytest.approx(job.model.parameters - 16 * job.model.layer_total(0))
    weights = max(s.memory.weights for s in sdp.memory)
    assert weights == pytest.approx(2 * held)
    assert sdp.dp_bytes_per_gpu < plain.dp_bytes_per_gpu
    assert sdp.result.step_time_s < plain.result.step_time_s
    assert job.model_flops_per_step < plain.config.job.model_flops_per_step


@pytest.mark.parametrize(("subnetworks", "field"), [
    ({"count": 3, "layers": 16}, "strategy.subnetworks.count"),
    ({"count": 4, "layers": 10}, "strategy.subnetworks"),
    ({"count": 4, "layers": 32}, "strategy.subnetworks.layers"),
    ({"count": 4}, "strategy.subnetworks.layers"),
    ({"count": 4, "layers": 16, "width": 2}, "strategy.subnetworks"),
])
def test_bad_subnetworks_name_the_field(subnetworks, field):
    with pytest.raises(SpecError) as err:
        _config(subnetworks=subnetworks)
    assert err.value.field.startswith(field)
