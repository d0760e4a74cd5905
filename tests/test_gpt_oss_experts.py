"""gpt-oss's experts as Megatron-Core 0.15-0.17 run them: the clamped gated activation clamps and
concatenates outside its fused kernel (fusions/fused_bias_geglu.py,
weighted_bias_quick_geglu_impl), and fc2's bias is added per local expert by TEGroupedMLP's
_apply_bias (moe/experts.py). Models without biases or a clamp run neither."""

import json
from dataclasses import replace

import pytest

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.loader import load_catalog
from clustersim.simulator.cost.compute import LAUNCH_GAP_S, ComputeModel
from clustersim.workloads import Strategy, TrainingSpec
from clustersim.workloads.kernels import elementwise
from clustersim.workloads.layer_ops import LayerOps
from clustersim.workloads.memory import layer_activation_bytes
from clustersim.workloads.model_sources import bundled_config, from_hf_config, resolve
from clustersim.workloads.strategy import Recompute, RecomputeModule

TRAINING = TrainingSpec(seq_len=4096, global_batch=64, micro_batch=4)


def _mlp(name: str, strategy: Strategy) -> dict:
    ops = LayerOps(resolve(name), TRAINING, strategy)
    return {k.name: k for k in ops.forward(1).mlp}


def test_gpt_oss_config_clamps_its_activation_and_others_do_not():
    assert resolve("gpt-oss-120b").activation_clamp and resolve("gpt-oss-20b").activation_clamp
    assert not resolve("qwen3-30b-a3b").activation_clamp
    assert not resolve("mixtral-8x7b").activation_clamp


def test_swiglu_limit_outside_gpt_oss_is_an_error_naming_it(tmp_path):
    cfg = json.loads(bundled_config("qwen3-30b-a3b").read_text())
    cfg["swiglu_limit"] = 7.0
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="swiglu_limit"):
        from_hf_config(path)


def test_clamp_and_bias_kernels_move_the_bytes_megatron_core_moves():
    # EP 8: 16 local experts, each GEMM over the busiest device's rows per expert.
    kernels = _mlp("gpt-oss-120b", Strategy(dp=8, ep=8))
    fc1 = kernels["expert_fc1"]
    received, hidden, up = fc1.m * fc1.batch, 2880, 2 * 2880
    assert fc1.batch == 16 and fc1.n == up
    clamp, bias = kernels["expert_clamp"], kernels["expert_fc2_bias"]
    # Two clamps (read and write a half each) and a cat (read and write the whole): 4 passes.
    assert clamp.bytes == pytest.approx(received * up * 4 * 2) and clamp.launches == 3
    # bias x prob written, added to the rows (2 reads, 1 write), cat (read, write): 6 passes;
    # two kernels per local expert and the cat.
    assert bias.bytes == pytest.approx(received * hidden * 6 * 2) and bias.launches == 2 * 16 + 1
    names = list(kernels)
    assert names.index("expert_fc1") < names.index("expert_clamp") < names.index("expert_act")
    assert names.index("expert_fc2") < names.index("expert_fc2_bias")


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_models_without_biases_or_clamps_run_neither(name):
    kernels = _mlp(name, Strategy(dp=8, ep=8))
    assert "expert_clamp" not in kernels and "expert_fc2_bias" not in kernels


def test_moe_act_recompute_reruns_the_clamp_with_the_activation():
    s = Strategy(dp=8, ep=8, recompute=Recompute.MODULES,
                 recompute_modules=(RecomputeModule.MOE_ACT,))
    work = LayerOps(resolve("gpt-oss-120b"), TRAINING, s).recompute(1)
    assert [k.name for k in work.mlp] == ["expert_clamp", "expert_act"]


def test_each_launch_of_an_element_wise_loop_pays_its_gap():
    model = ComputeModel(load_catalog().device("b200"))
    one = elementwise("x", 1e8, 2, 2.0)
    loop = elementwise("x", 1e8, 2, 2.0, launches=33)
    assert model.kernel_time(loop) - model.kernel_time(one) == pytest.approx(32 * LAUNCH_GAP_S)


@pytest.mark.parametrize("modules, extra", [((), 1.0), ((RecomputeModule.MOE_ACT,), 0.0),
                                            ((RecomputeModule.MOE,), 0.0)])
def test_the_clamped_copy_is_kept_unless_the_activation_is_recomputed(modules, extra):
    oss = resolve("gpt-oss-120b")
    s = (Strategy(dp=8, ep=8, recompute=Recompute.MODULES, recompute_modules=modules)
         if modules else Strategy(dp=8, ep=8))
    kept = layer_activation_bytes(oss, TRAINING, s, 1)
    unclamped = layer_activation_bytes(replace(oss, activation_clamp=False), TRAINING, s, 1)
    # fc1's gated output (2 x 2880 per routed copy, 4 copies per token) in BF16.
    clamped_copy = 4 * 4096 * 4 * 2 * 2880 * 2
    assert kept - unclamped == pytest.approx(extra * clamped_copy)
