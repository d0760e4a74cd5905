import pytest

from clustersim.hardware_specs import SpecError
from clustersim.workloads import Job, Offload, Recompute, Strategy, TrainingSpec
from clustersim.workloads.memory import layer_activation_bytes, memory_per_stage
from clustersim.workloads.model import PRESETS, from_mapping
from clustersim.workloads.training import AttentionKernel

# Korthikanti et al. 2022 (arXiv 2205.05198), Table 3: heads, hidden, layers (TP 8, s 2048, b 1).
KORTHIKANTI = {"22B": (64, 6144, 48), "175B": (96, 12288, 96), "530B": (128, 20480, 105),
               "1T": (160, 25600, 128)}
S, B, T = 2048, 1, 8


def _model(heads, hidden, layers):
    return from_mapping({"layers": layers, "hidden": hidden, "heads": heads, "vocab": 51200,
                         "mlp": "gelu", "bias": True, "dropout": True, "position": "learned"})


def _table2(a, h, mode, sp):
    """Korthikanti et al. Table 2: activation bytes per layer."""
    sbh = S * B * h
    if mode is Recompute.FULL:
        return 2 * sbh
    attention = 0.0 if mode is Recompute.SELECTIVE else 5 * a * S / (h * T)
    return sbh * ((34 / T) if sp else (10 + 24 / T)) + sbh * attention


@pytest.mark.parametrize("name", list(KORTHIKANTI))
@pytest.mark.parametrize("mode, sp", [(Recompute.NONE, False), (Recompute.NONE, True),
                                      (Recompute.SELECTIVE, False), (Recompute.SELECTIVE, True),
                                      (Recompute.FULL, False)])
def test_activation_memory_per_layer_equals_korthikanti_table2(name, mode, sp):
    heads, hidden, layers = KORTHIKANTI[name]
    training = TrainingSpec(seq_len=S, global_batch=8, micro_batch=B,
                            attention=AttentionKernel.STANDARD)
    strategy = Strategy(tp=T, sequence_parallel=sp, recompute=mode)
    got = layer_activation_bytes(_model(heads, hidden, layers), training, strategy)
    assert got == pytest.approx(_table2(heads, hidden, mode, sp), rel=1e-12)


def test_flash_attention_drops_the_score_matrix_term():
    heads, hidden, layers = KORTHIKANTI["175B"]
    model = _model(heads, hidden, layers)
    strategy = Strategy(tp=T, sequence_parallel=True)
    flash = layer_activation_bytes(model, TrainingSpec(seq_len=S, global_batch=8), strategy)
    standard = layer_activation_bytes(
        model, TrainingSpec(seq_len=S, global_batch=8, attention=AttentionKernel.STANDARD), strategy)
    # Only the FP32 log-sum-exp (4 bytes per query and head) remains of the 5as^2b term.
    assert flash == pytest.approx(S * B * hidden * 34 / T + 4 * S * heads / T, rel=1e-12)
    assert standard - flash > 4 * (5 * heads * S * S * B / T) / 5


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_model_state_follows_zero_paper_2_2_12_bytes(zero):
    # Rajbhandari et al. SC'20, Fig. 1: 2 + 2 + 12 bytes per parameter, sharded by stage.
    model = PRESETS["llama3-8b"]
    job = Job(model, TrainingSpec(seq_len=2048, global_batch=8), Strategy(dp=8, zero=zero)).checked(8)
    mem = memory_per_stage(job.model, job.training, job.strategy)[0].memory
    p, n = model.parameters, 8
    expected = {0: (2 * p, 2 * p, 12 * p), 1: (2 * p, 2 * p, 12 * p / n),
                2: (2 * p, 2 * p / n, 12 * p / n), 3: (2 * p / n, 2 * p / n, 12 * p / n)}[zero]
    assert (mem.weights, mem.gradients, mem.optimizer) == pytest.approx(expected, rel=1e-12)


def test_one_f_one_b_first_stage_holds_pp_micro_batches():
    model = PRESETS["llama3-70b"]
    training = TrainingSpec(seq_len=4096, global_batch=64, micro_batch=1)
    job = Job(model, training, Strategy(tp=8, pp=4, dp=2, sequence_parallel=True,
                                        recompute=Recompute.SELECTIVE)).checked(64)
    stages = memory_per_stage(job.model, job.training, job.strategy)
    per_layer = layer_activation_bytes(job.model, job.training, job.strategy)
    middle = stages[1]
    assert middle.memory.activations == pytest.approx(3 * middle.layers * per_layer, rel=1e-9)
    assert stages[0].memory.activations > stages[-1].memory.activations


def test_offload_moves_optimizer_state_off_the_device():
    model = PRESETS["llama3-8b"]
    base = Job(model, TrainingSpec(seq_len=2048, global_batch=8), Strategy(dp=8, zero=2))
    off = Job(model, base.training, Strategy(dp=8, zero=2, offload=Offload.OPTIMIZER))
    a = base.memory()[0]
    b = off.memory()[0]
    assert b.memory.optimizer == 0 and b.offloaded_bytes == pytest.approx(a.memory.optimizer)


def test_block_recompute_sits_between_none_and_full():
    """Megatron's block method: recompute_layers N of each chunk recompute, the rest keep their
    activations; memory, hardware FLOPs and time fall in between, in proportion."""
    model, training = PRESETS["llama3-8b"], TrainingSpec(seq_len=8192, global_batch=8)

    def job(recompute, n=0):
        return Job(model, training, Strategy(dp=8, zero=3, recompute=recompute,
                                             recompute_layers=n)).checked(8)
    none, half, full = job(Recompute.NONE), job(Recompute.FULL, 16), job(Recompute.FULL)
    act = [j.memory()[0].memory.activations for j in (none, half, full)]
    assert act[0] > act[1] > act[2]
    assert act[1] == pytest.approx((act[0] + act[2]) / 2, rel=0.1)
    extra = full.hardware_flops_per_step - none.hardware_flops_per_step
    assert half.hardware_flops_per_step - none.hardware_flops_per_step == pytest.approx(extra / 2)
    assert job(Recompute.FULL, 32).hardware_flops_per_step == full.hardware_flops_per_step


@pytest.mark.parametrize("tp, sp", [(1, False), (4, False), (4, True)])
def test_fp8_linear_layers_keep_their_fp8_inputs(tp, sp):
    """Transformer Engine's FP8 Linear saves its FP8-cast input (1 byte) for the weight
    gradient: the two norm outputs and fc2's input shrink from 2 bytes to 1, the attention
    output is kept twice (the kernel's 16-bit output and the projection's FP8 copy)."""
    from clustersim.workloads.training import Precision
    m = PRESETS["llama3-8b"]
    strategy = Strategy(tp=tp, sequence_parallel=sp)
    bf16 = TrainingSpec(seq_len=4096, global_batch=8)
    fp8 = TrainingSpec(seq_len=4096, global_batch=8, precision=Precision.FP8)
    sbh = 4096 * m.hidden
    norms = 2 * sbh / (tp if sp else 1)                       # 2 tensors, 1 byte saved each
    split = 4096 * (m.ffn_hidden - m.attn_out_dim) / tp       # fc2 input less, projection copy more
    saved = (layer_activation_bytes(m, bf16, strategy)
             - layer_activation_bytes(m, fp8, strategy))
    assert saved == pytest.approx(norms + split, rel=1e-12)


def test_torchao_float8_keeps_16_bit_inputs():
    from clustersim.workloads.training import Precision
    m = PRESETS["llama3-8b"]
    bf16 = TrainingSpec(seq_len=4096, global_batch=8)
    torchao = TrainingSpec(seq_len=4096, global_batch=8, precision=Precision.FP8,
                           fp8_saved_inputs=False)
    assert (layer_activation_bytes(m, torchao, Strategy())
            == layer_activation_bytes(m, bf16, Strategy()))


def test_activation_offload_keeps_the_last_layers_activations_on_the_device():
    """Transformer Engine's default offload schedule (``cpu_offload.py``,
    ``_default_offload_sync_init``) peaks at (layers - n) layers of saved activations: n of 80
    layers' worth leave the device for host memory, and nothing else changes."""
    model = PRESETS["llama3-70b"]
    training = TrainingSpec(seq_len=8192, global_batch=128, micro_batch=2)

    def stage(n):
        return Job(model, training, Strategy(dp=64, zero=3, offload_activation_layers=n)
                   ).checked(64).memory()[0]
    kept, moved = stage(0), stage(40)
    per_layer = layer_activation_bytes(model, training, Strategy(dp=64, zero=3))
    assert moved.offloaded_activation_bytes == pytest.approx(40 * per_layer, rel=1e-12)
    assert kept.memory.activations - moved.memory.activations == pytest.approx(
        40 * per_layer, rel=1e-12)
    assert (moved.memory.weights, moved.memory.optimizer, moved.offloaded_bytes) == (
        kept.memory.weights, kept.memory.optimizer, kept.offloaded_bytes)


@pytest.mark.parametrize("strategy, message", [
    (dict(dp=8, pp=8, offload_activation_layers=4), "needs pp = 1"),
    (dict(dp=64, offload_activation_layers=4, recompute=Recompute.FULL), "needs recompute: none"),
    (dict(dp=64, offload_activation_layers=80), "must be below model.layers=80"),
])
def test_activation_offload_follows_megatron_cores_rules(strategy, message):
    """Megatron-Core's ``TransformerConfig.__post_init__`` refuses CPU offloading with pipeline
    parallelism, with recomputation, and of every layer."""
    training = TrainingSpec(seq_len=8192, global_batch=128)
    with pytest.raises(SpecError, match=message) as err:
        Job(PRESETS["llama3-70b"], training, Strategy(**strategy)).checked(64)
    assert err.value.field == "strategy.offload_activation_layers"
