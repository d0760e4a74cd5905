"""Context-parallel variants (ring, all-gather, Ulysses, hierarchical) and Megatron-Core's
parallel folding of the expert groups (ep x etp over a stage's tp x cp x dp devices)."""

import pytest

from clustersim.analysis.sweeps.space import SweepSpace, enumerate_space
from clustersim.hardware_specs import SpecError
from clustersim.simulator import simulate
from clustersim.workloads import Job
from clustersim.workloads.axes import CP_A2A_GROUP, CP_RING_GROUP, EXPERT_DATA_GROUP, Axis
from clustersim.workloads.builder import build_trace
from clustersim.workloads.layout import ParallelLayout
from clustersim.workloads.model import PRESETS
from clustersim.workloads.model_sources import resolve
from clustersim.workloads.strategy import CpAlgorithm, strategy_from_mapping
from clustersim.workloads.trace import CollectiveKind, CollectiveOp, ComputeOp, Phase
from clustersim.workloads.training import training_from_mapping

LLAMA = PRESETS["llama3-8b"]          # 32 heads, 8 KV heads of 128
SEQ = 32768


def _job(model=LLAMA, seq=SEQ, gbs=2, **strategy) -> Job:
    training = training_from_mapping({"seq_len": seq, "global_batch": gbs, "micro_batch": 1,
                                      "precision": "bf16"})
    s = strategy_from_mapping(strategy)
    return Job(model, training, s).checked(s.world_size)


def _first_layer_cp_ops(job: Job, phase: str = "fwd0.layer0") -> list[CollectiveOp]:
    ops = build_trace(job).programs[0].ops
    return [op for op in ops if isinstance(op, CollectiveOp) and op.stream.value == "cp"
            and op.name.startswith(phase + ".")]


def _bytes(per_token_width: float, job: Job) -> float:
    return job.training.seq_len // job.strategy.cp * per_token_width * 2   # bf16


KV = 2 * 8 * 128         # K and V widths of llama3-8b
Q = O = 32 * 128


@pytest.mark.parametrize("algorithm, expected", [
    # cp - 1 ring exchanges of this rank's K and V
    ("ring", [(CollectiveKind.RING_EXCHANGE, KV)] * 3),
    # K and V of all 4 ranks gathered
    ("allgather", [(CollectiveKind.ALL_GATHER, 4 * KV)]),
    # Q, K, V to head shards, then the output back to sequence shards
    ("ulysses", [(CollectiveKind.ALL_TO_ALL, Q + KV), (CollectiveKind.ALL_TO_ALL, O)]),
])
def test_forward_context_parallel_communication_per_layer(algorithm, expected):
    job = _job(cp=4, dp=2, cp_algorithm=algorithm)
    ops = _first_layer_cp_ops(job)
    assert [(op.kind, op.bytes) for op in ops] == [(k, _bytes(w, job)) for k, w in expected]


def test_hierarchical_cp_shuffles_heads_inside_domains_and_rings_across_them():
    """cp 8 = 2 all-to-all domains of 4: one all-to-all each way over the domain, one ring
    exchange across the two domains of a block the plain ring's size (4x the tokens, 1/4 of
    the KV heads)."""
    job = _job(cp=8, cp_algorithm="hierarchical", cp_a2a=4)
    ops = _first_layer_cp_ops(job)
    assert [(op.kind, op.group) for op in ops] == [
        (CollectiveKind.ALL_TO_ALL, CP_A2A_GROUP), (CollectiveKind.RING_EXCHANGE, CP_RING_GROUP),
        (CollectiveKind.ALL_TO_ALL, CP_A2A_GROUP)]
    assert ops[1].bytes == _bytes(KV, job)
    layout = ParallelLayout(cp=8, cp_a2a=4)
    assert layout.partition(CP_A2A_GROUP) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert layout.partition(CP_RING_GROUP) == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_backward_all_gather_cp_gathers_again_and_reduce_scatters_dk_dv():
    job = _job(cp=4, dp=2, cp_algorithm="allgather")
    ops = _first_layer_cp_ops(job, "bwd0.layer0")
    assert [op.kind for op in ops] == [CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER]


@pytest.mark.parametrize("algorithm", ["ring", "allgather", "ulysses"])
def test_the_variant_changes_communication_not_work(algorithm):
    """Every variant computes the same attention: the step's compute FLOPs do not change."""
    def flops(job):
        return sum(op.flops for op in build_trace(job).programs[0].ops
                   if isinstance(op, ComputeOp) and op.phase is not Phase.OPTIMIZER)
    assert flops(_job(cp=4, dp=2, cp_algorithm=algorithm)) == pytest.approx(
        flops(_job(cp=4, dp=2)), rel=1e-12)


@pytest.mark.parametrize("strategy, message", [
    ({"cp": 16, "cp_algorithm": "ulysses"},
     r"strategy\.cp_algorithm: ulysses splits attention heads over tp\*cp = 1\*16 = 16, which "
     r"does not divide model\.kv_heads=8 \(both heads and kv_heads must divide by it\)"),
    ({"cp": 4, "tp": 4, "cp_algorithm": "ulysses"}, r"tp\*cp = 4\*4 = 16.*kv_heads=8"),
    ({"cp": 8, "cp_algorithm": "hierarchical"}, r"strategy\.cp_a2a: .*a divisor of cp=8"),
    ({"cp": 8, "cp_algorithm": "hierarchical", "cp_a2a": 3}, r"strategy\.cp_a2a"),
    ({"cp": 4, "cp_a2a": 2}, r"strategy\.cp_a2a: 2 needs cp_algorithm: hierarchical"),
    ({"cp": 1, "dp": 2, "cp_algorithm": "allgather"}, r"strategy\.cp_algorithm: allgather needs cp > 1"),
])
def test_context_parallel_rules_name_the_field_and_the_numbers(strategy, message):
    with pytest.raises(SpecError, match=message):
        _job(**strategy)


def test_an_unknown_cp_algorithm_lists_the_known_ones():
    with pytest.raises(SpecError, match=r"strategy\.cp_algorithm: expected one of "
                                        r"ring\|allgather\|ulysses\|hierarchical"):
        strategy_from_mapping({"cp": 2, "cp_algorithm": "tree"})


def test_sweep_explores_every_variant_for_long_sequences(catalog):
    job = _job(cp=4, dp=2)
    space = SweepSpace(tp=(1,), pp=(1,), schedule=(job.strategy.schedule,),
                       recompute=(job.strategy.recompute,), zero=(0,),
                       offload=(job.strategy.offload,))
    candidates = enumerate_space(job, 8, 1e15, space)
    assert {(c.job.strategy.cp_algorithm, c.job.strategy.cp_a2a) for c in candidates} == {
        (CpAlgorithm.RING, 0), (CpAlgorithm.ALLGATHER, 0), (CpAlgorithm.ULYSSES, 0),
        (CpAlgorithm.HIERARCHICAL, 2)}
    assert len({c.key for c in candidates}) == len(candidates)


def test_the_ring_hides_its_exchanges_where_gathers_and_all_to_alls_wait(catalog):
    """At 32K tokens on one node the ring's K/V exchanges run behind the attention pieces;
    the all-gather and the all-to-alls sit in front of the core and are exposed."""
    cluster = catalog.cluster(device="h100-sxm", num_devices=8)
    exposed = {}
    for algorithm, extra in (("ring", {}), ("allgather", {}), ("ulysses", {}),
                             ("hierarchical", {"cp_a2a": 2})):
        result = simulate(build_trace(_job(cp=4, dp=2, cp_algorithm=algorithm, **extra)), cluster)
        exposed[algorithm] = result.breakdown.exposed_comm_s[Axis.CP.value]
    assert exposed["ring"] < min(exposed["allgather"], exposed["ulysses"], exposed["hierarchical"])


# --- parallel folding ------------------------------------------------------------------------

QWEN = resolve("qwen3-30b-a3b")   # 128 experts, top 8


def test_folded_expert_groups_span_attention_tp_ranks():
    """etp 1: an EP group is ep consecutive ranks of the stage (TP peers included); the default
    etp = tp keeps EP inside each data x context-parallel group."""
    folded = ParallelLayout(tp=2, dp=4, ep=8, etp=1)
    assert folded.partition(Axis.EP.value) == (tuple(range(8)),)
    default = ParallelLayout(tp=2, dp=4, ep=4)
    assert default.partition(Axis.EP.value) == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert default.partition(EXPERT_DATA_GROUP) == ((0,), (2,), (4,), (6,), (1,), (3,), (5,), (7,))
    assert ParallelLayout(tp=2, dp=8, ep=4, etp=1).partition(EXPERT_DATA_GROUP) == (
        (0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15))


def test_folding_lets_ep_exceed_dp_and_holds_experts_whole():
    job = _job(model=QWEN, seq=4096, gbs=8, tp=2, dp=4, ep=8, etp=1, sequence_parallel=True)
    trace = build_trace(job)
    assert len(trace.group_sets[Axis.EP.value].groups[0]) == 8
    ep_ops = [op for op in trace.programs[0].ops if isinstance(op, CollectiveOp)
              and op.group == Axis.EP.value]
    assert ep_ops and all(op.kind is CollectiveKind.ALL_TO_ALL for op in ep_ops)
    expert_gemm = next(k for op in trace.programs[0].ops if isinstance(op, ComputeOp)
                       for k in op.kernels if k.name == "expert_fc2")
    assert expert_gemm.k == QWEN.expert_ffn                     # not split by tp
    assert job.strategy.expert_dp == 1


def test_expert_tp_gathers_dispatched_tokens_and_scatters_the_output():
    job = _job(model=QWEN, seq=4096, gbs=8, tp=2, dp=4, ep=4, sequence_parallel=True)
    ops = [op for op in build_trace(job).programs[0].ops if isinstance(op, CollectiveOp)
           and op.name.startswith("fwd0.layer0.")]
    names = [op.name.split(".")[-1] for op in ops if op.group in ("ep", "etp")]
    assert names == ["ep_dispatch", "etp_all_gather", "etp_reduce_scatter", "ep_combine"]
    dispatch, gather = ops[[op.name.endswith("ep_dispatch") for op in ops].index(True)], \
        ops[[op.name.endswith("etp_all_gather") for op in ops].index(True)]
    assert gather.bytes == 2 * dispatch.bytes


@pytest.mark.parametrize("strategy, message", [
    ({"tp": 2, "dp": 4, "ep": 8, "sequence_parallel": True},
     r"strategy\.ep: ep\*etp = 8\*2 does not divide the devices of a pipeline stage, "
     r"tp\*cp\*dp = 2\*1\*4 = 8"),
    ({"tp": 2, "dp": 4, "ep": 8, "etp": 1},
     r"strategy\.etp: 1 differs from tp=2.*sequence_parallel: true"),
    ({"dp": 8, "ep": 8, "etp": 5}, r"strategy\.etp: 5 does not divide the experts' FFN width 768"),
])
def test_expert_folding_rules_name_the_field(strategy, message):
    with pytest.raises(SpecError, match=message):
        _job(model=QWEN, seq=4096, gbs=8, **strategy)


def test_etp_needs_a_mixture_of_experts():
    with pytest.raises(SpecError, match=r"strategy\.etp: 1 needs a mixture-of-experts model"):
        _job(dp=2, etp=1)
