"""The balancing planner for mixed clusters (``clustersim plan``), checked against HAP.

HAP (Zhang et al., "HAP: SPMD DNN Training on Heterogeneous GPU Clusters with Automated Program
Synthesis", EuroSys'24, arXiv 2401.05965) chooses per-device sharding ratios by linear
programming and reports speed-ups of up to 2.41x on heterogeneous clusters: a balanced plan
must beat the naive even split and the fastest devices alone, and by no more than that.
"""

import itertools
import subprocess
import sys

import pytest

from clustersim.analysis.config import config_from_mapping, load_config
from clustersim.analysis.sweeps.balance import (
    HAP_MAX_SPEEDUP, GroupCosts, plan, share_micro_batches, split_layers,
)
from clustersim.hardware_specs import SpecError
from tests.conftest import REPO


def _finish(n, t, pp):
    return max((k + pp - 1) * x for k, x in zip(n, t))


@pytest.mark.parametrize("times, total, pp", [
    ([2.5, 1.0], 64, 1), ([2.48, 2.48, 1.02, 1.02], 16, 1), ([3.0, 1.0, 1.7], 20, 4),
])
def test_micro_batches_minimise_the_slowest_replica(times, total, pp):
    """The greedy share against every split (at least one each): none finishes earlier."""
    n = share_micro_batches(times, total, pp, 1)
    assert sum(n) == total and min(n) >= 1
    best = min(_finish(c, times, pp) for c in itertools.product(range(1, total + 1),
                                                                repeat=len(times))
               if sum(c) == total)
    assert _finish(n, times, pp) == pytest.approx(best)


def test_two_devices_share_the_batch_as_their_speeds():
    """HAP's continuous optimum gives B_i proportional to 1 / t_i: 64 x (1/2.5) / (1/2.5 + 1)
    = 18.3 micro-batches to the device 2.5x slower."""
    assert share_micro_batches([2.5, 1.0], 64, 1, 1) == [18, 46]


def test_layers_split_minimises_the_slowest_stage():
    """Against every contiguous split of 9 layers on 3 stages (the middle one twice as fast,
    the last one with a head costing two layers)."""
    slow = GroupCosts(device="slow", num_devices=8, layer_s=(2.0,) * 9, stage_extra_s=(0, 0, 4))
    fast = GroupCosts(device="fast", num_devices=8, layer_s=(1.0,) * 9, stage_extra_s=(0, 0, 2))
    costs, stages = (slow, fast), [{0}, {1}, {0}]
    sizes = split_layers(costs, stages, 9)

    def worst(split):
        starts = [sum(split[:i]) for i in range(3)]
        return max(sum(costs[g].layer_s[i] for i in range(starts[s], starts[s] + split[s]))
                   + costs[g].stage_extra_s[s] for s, group in enumerate(stages) for g in group)
    best = min(worst(c) for c in itertools.product(range(1, 8), repeat=3) if sum(c) == 9)
    assert sum(sizes) == 9 and worst(sizes) == best


def test_layers_split_keeps_to_what_fits():
    """A fast stage that can hold at most 4 layers gets 4, the slow ones the rest."""
    slow = GroupCosts(device="slow", num_devices=8, layer_s=(2.0,) * 9, stage_extra_s=(0, 0))
    fast = GroupCosts(device="fast", num_devices=8, layer_s=(1.0,) * 9, stage_extra_s=(0, 0))
    stages = [{0}, {1}]
    assert split_layers((slow, fast), stages, 9) == (3, 6)
    assert split_layers((slow, fast), stages, 9,
                        lambda stage, start, end: stage == 0 or end - start <= 4) == (5, 4)
    with pytest.raises(SpecError, match="strategy.pp: no split of the 9 layers"):
        split_layers((slow, fast), stages, 9, lambda stage, start, end: end - start <= 4)


def test_a_pipeline_across_groups_gets_more_layers_on_the_faster_stage():
    """llama3-8b TP8 PP2 DP2 on 16 A100 + 16 H100: stage 0 on the A100s, stage 1 (with the LM
    head) on the H100s."""
    cfg = config_from_mapping({
        "model": "llama3-8b",
        "training": {"seq_len": 4096, "global_batch": 32, "micro_batch": 1},
        "strategy": {"tp": 8, "pp": 2, "dp": 2, "zero": 1},
        "cluster": {"groups": [{"gpu": "a100-80gb", "num_gpus": 16},
                               {"gpu": "h100-sxm", "num_gpus": 16}]}})
    p = plan(cfg)
    first, second = p.layers_per_stage
    assert first + second == 32 and first < second
    assert p.balanced.result.step_time_s < p.even.result.step_time_s
    assert p.balanced.result.step_time_s < p.fastest_only.result.step_time_s


def test_plan_needs_a_mixed_cluster():
    run = subprocess.run([sys.executable, "-m", "clustersim", "plan", "llama3_8b_fsdp"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 2
    assert run.stderr.startswith("error: cluster.groups: the balancing planner needs a mixed "
                                 "cluster")


@pytest.mark.slow
def test_balanced_64_a100_64_h100_beats_h100_alone_and_the_even_split_within_haps_range():
    """examples/hetero_a100_h100.yaml (Llama-3-70B, TP8 DP16): HAP's sharding ratios give the
    H100 replicas the larger share; the plan is faster than the 64 H100 alone and than the even
    split, and by no more than HAP's largest published speed-up (2.41x, arXiv 2401.05965)."""
    p = plan(load_config("examples/hetero_a100_h100.yaml"))
    a100, h100 = p.replica_batch[0], p.replica_batch[-1]
    assert h100 > 2 * a100 and sum(p.replica_batch) == 512
    assert p.groups[p.fastest_group].device == "h100-sxm"
    for speedup in (p.speedup_over_even, p.speedup_over_fastest):
        assert 1.0 < speedup <= HAP_MAX_SPEEDUP
    assert all(r.result.fits_in_memory for r in (p.balanced, p.even, p.fastest_only))
