"""How a job is split across devices: parallel degrees, pipeline schedule, memory savers.

``check_strategy`` holds every rule that ties a strategy to a model, a batch and a world size, and
says what is wrong with the numbers, e.g. ``strategy.tp: 7 does not divide model.heads=64``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.fields import Fields
from clustersim.workloads.model import TransformerSpec
from clustersim.workloads.dispatch import Dispatcher
from clustersim.workloads.subnetworks import Subnetworks, check_subnetworks, subnetworks_from_mapping
from clustersim.workloads.training import CrossEntropy, TrainingSpec


class Schedule(enum.Enum):
    GPIPE = "gpipe"
    """All forwards, then all backwards (Huang et al. 2019)."""
    ONE_F_ONE_B = "1f1b"
    """PipeDream-Flush: warm-up forwards, then alternate (Narayanan et al. SC'21 sec. 2.2.1)."""
    INTERLEAVED = "interleaved"
    """1F1B over ``virtual_stages`` model chunks per device (Narayanan et al. SC'21 sec. 2.2.2)."""
    DUALPIPE = "dualpipe"
    """DeepSeek-V3's bidirectional pipeline (arXiv 2412.19437 sec. 3.2.1): micro-batches from
    both ends, two parameter copies per stage, forward and backward chunks of two micro-batches
    overlapped so the expert all-to-all of one hides under the other's compute."""


class CpAlgorithm(enum.Enum):
    """How context-parallel ranks share the keys and values of attention."""

    RING = "ring"
    """K/V blocks passed around the CP ring, cp - 1 exchanges each hidden behind a piece of the
    attention core (ring attention, Liu et al. 2023; Megatron-Core ``cp_comm_type: p2p``)."""
    ALLGATHER = "allgather"
    """K and V all-gathered before attention on the local queries, dK and dV reduce-scattered
    in backward (Llama 3, arXiv 2407.21783 sec. 3.3.2; Megatron-Core ``all_gather``)."""
    ULYSSES = "ulysses"
    """All-to-all from sequence shards to head shards before attention and back after it
    (DeepSpeed-Ulysses, arXiv 2309.14509; Megatron-Core ``a2a``): heads and KV heads must
    divide by tp x cp."""
    HIERARCHICAL = "hierarchical"
    """All-to-all inside domains of ``cp_a2a`` ranks, a ring across them (Megatron-Core
    ``a2a+p2p`` with ``hierarchical_context_parallel_sizes``)."""


class Recompute(enum.Enum):
    NONE = "none"
    SELECTIVE = "selective"
    """Recompute only the attention core (Korthikanti et al. 2022 sec. 5)."""
    FULL = "full"
    """Store each layer's input only; recompute the whole layer forward in backward."""
    OP = "op"
    """torchtitan's per-op selective checkpointing (``selective_ac_option: op``): each layer
    saves the outputs of its attention kernel and of every other matmul (the 1st, 3rd, ...
    in forward order: q, v, and w1 and w2 of a gated MLP) and recomputes the rest (the k and
    output projections, w3, every element-wise op) before its backward
    (torchtitan ``_apply_ac_to_transformer_block``, "except every second mm")."""
    MODULES = "modules"
    """Recompute the modules ``recompute_modules`` names in backward and store none of their
    outputs (Megatron-Core ``--recompute-granularity selective --recompute-modules``; the
    DeepSeek-V3 report, arXiv 2412.19437 sec. 3.2.3, recomputes every RMSNorm and the MLA
    up-projections)."""


class RecomputeModule(enum.Enum):
    """What ``recompute: modules`` recomputes (Megatron-Core's module names)."""

    LAYERNORM = "layernorm"
    """Every norm of a layer (RMSNorm or LayerNorm, MLA's latent norms included)."""
    MLA_UP_PROJ = "mla_up_proj"
    """MLA's query and key/value up-projections, their layout and rotary embedding: the
    queries, keys and values attention reads are rebuilt from the stored latents."""
    MLP = "mlp"
    """The dense MLP of each layer without experts (fc1, activation, fc2): only its input is
    kept, and its forward reruns before its backward (Megatron-Core's ``mlp``, "recompute the
    dense MLP submodule"; a MoE layer's block is ``moe``'s). Under sequence parallelism the
    rerun's all-gather and reduce-scatter are not counted."""
    MOE_ACT = "moe_act"
    """The routed experts' activation function (the input of their second GEMM)."""
    MOE = "moe"
    """The whole MoE block (router, permute, dispatch, experts, combine, unpermute, shared
    experts): only its input is kept, and its forward, all-to-alls included, reruns just
    before its backward (Megatron-Core's ``--recompute-modules moe``)."""


class Offload(enum.Enum):
    NONE = "none"
    OPTIMIZER = "optimizer"
    """Optimizer state (and the step) on the host (ZeRO-Offload, Ren et al. ATC'21)."""
    PARAMS = "params"
    """Optimizer state and parameters off the device, fetched per layer (ZeRO-Infinity, SC'21)."""


class Zero3Granularity(enum.Enum):
    """What one ZeRO-3 parameter all-gather covers."""

    LAYER = "layer"
    """One flat buffer per transformer layer (PyTorch FSDP wrapping each block)."""
    TENSOR = "tensor"
    """One all-gather and one reduce-scatter per parameter tensor, each gather after a device
    synchronisation (DeepSpeed ZeRO-3 as of 2020-2021)."""


class Zero3Prefetch(enum.Enum):
    """Which ZeRO-3 gathers are issued one layer ahead, to overlap the layer before."""

    ALL = "all"
    """Forward and backward (FSDP on GPUs: the host issues the next layer's gather while the
    device still computes this one)."""
    BACKWARD = "backward"
    """Backward only: FSDP2 prefetches backward gathers explicitly, forward ones only by the host
    running ahead of the device, which a CPU rank computing on its own thread cannot do."""
    NONE = "none"
    """Every gather waits for the compute before it."""


class CudaGraphs(enum.Enum):
    """Which kernels replay from CUDA graphs; the others the host issues one by one, each at
    its eager cost (``simulator/cost/host.py``), in program order (``HostOp``). The host runs
    ahead of the device except where it reads device results: dropless MoE routing's token
    counts (``workloads/strategies/expert.py``), so only what follows such a sync can leave the
    device waiting on the host."""

    FULL = "full"
    """Every kernel: the host's issue time is not charged (the default; also Megatron's
    full-iteration graphs)."""
    ATTN_MOE_ROUTER = "attn_moe_router"
    """Megatron-Core's Transformer Engine graphs scoped to ``attn``, ``moe_router`` and
    ``moe_preprocess``: as ``moe_router``, and each layer's attention module (norm,
    projections, core attention and their TP/CP communication) replays from one graph."""
    MOE_ROUTER = "moe_router"
    """Megatron-Core's Transformer Engine graphs scoped to ``moe_router`` and
    ``moe_preprocess`` (``--cuda-graph-scope``): the router's kernels, up to the dispatcher's
    sync, replay from a graph (one launch); every other kernel is issued eagerly."""
    NONE = "none"
    """No graphs: eager PyTorch issues every kernel."""

    @property
    def router(self) -> bool:
        """A MoE layer's router replays from a graph (its host issues one launch)."""
        return self in (CudaGraphs.ATTN_MOE_ROUTER, CudaGraphs.MOE_ROUTER)

    @property
    def attention(self) -> bool:
        """Each attention module replays from one graph (one launch)."""
        return self is CudaGraphs.ATTN_MOE_ROUTER


def _prefetch(f: Fields) -> Zero3Prefetch:
    """``true``/``false`` (all/none), or a :class:`Zero3Prefetch` name."""
    value = f.raw("zero3_prefetch", True)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if isinstance(value, bool):
        return Zero3Prefetch.ALL if value else Zero3Prefetch.NONE
    names = {m.value: m for m in Zero3Prefetch}
    if isinstance(value, str) and value.lower() in names:
        return names[value.lower()]
    raise SpecError(f.at("zero3_prefetch"),
                    f"expected true, false or one of {'|'.join(names)}, got {value!r}")


def _offload_split(f: Fields) -> tuple[tuple[str, float], ...]:
    """``offload_split: {tier: fraction, ...}``: fractions in (0, 1] summing to 1."""
    if not f.has("offload_split"):
        return ()
    section = f.sub("offload_split")
    out = tuple((str(name), section.number(str(name), minimum=0.0, maximum=1.0))
                for name in section.data)
    section.done()
    if not out:
        return ()          # {}: no split (as ``Strategy.to_dict`` writes it)
    if any(share <= 0 for _, share in out) or abs(sum(s for _, s in out) - 1) > 1e-9:
        raise SpecError(f.at("offload_split"), f"expected fractions > 0 of the offloaded state "
                        f"per tier, summing to 1, got {dict(out)}")
    return out


def _recompute_modules(f: Fields) -> tuple[RecomputeModule, ...]:
    """A list of :class:`RecomputeModule` names; a bad entry is named by its index."""
    entries = Fields(dict(enumerate(f.items("recompute_modules", []))), f.at("recompute_modules"))
    return tuple(entries.choice(i, RecomputeModule) for i in range(len(entries.data)))


@dataclass(frozen=True, kw_only=True, slots=True)
class Strategy:
    """Parallel degrees and the options that change what each device computes, stores and sends."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    """Context parallel: the sequence split across devices (see ``cp_algorithm``)."""
    cp_algorithm: CpAlgorithm = CpAlgorithm.RING
    cp_a2a: int = 0
    """Hierarchical CP: ranks of each all-to-all domain (Megatron-Core's
    ``hierarchical_context_parallel_sizes[0]``); cp / cp_a2a domains form the ring."""
    ep: int = 1
    """Expert parallel: a MoE layer's experts split across devices of a pipeline stage."""
    etp: int = 0
    """Expert tensor parallel: each expert's FFN split across this many devices; 0: ``tp``
    (Megatron-Core's default). With etp != tp the expert groups fold over the stage's
    tp x cp x dp devices apart from attention's (Megatron-Core's parallel folding)."""
    ep_dispatcher: Dispatcher = Dispatcher.ALLTOALL
    """How tokens reach their experts: NCCL all-to-all, or DeepEP's normal or low-latency
    kernels (Megatron-Core ``--moe-token-dispatcher-type alltoall`` or ``flex``)."""
    ep_dispatcher_sms: int = 0
    """SMs DeepEP's (or HybridEP's) dispatch and combine kernels hold while they run
    (Megatron-Core ``moe_deepep_num_sms``, ``moe_hybridep_num_sms``); compute that overlaps them
    runs on the others. 0: the dispatcher's default (``workloads/dispatch.py``)."""
    moe_a2a_overlap: bool = False
    """Megatron-Core's 1F1B all-to-all overlap (``--overlap-moe-expert-parallel-comm``): each
    steady-state forward runs merged with a backward of another micro-batch, the expert
    all-to-alls of one under the compute of the other (``workloads/strategies/pipeline.py``).
    Needs ep > 1, no full recompute, and with pp > 1 the interleaved schedule, as Megatron-Core
    requires."""
    moe_paged_stash_buffer: float = 0.0
    """Megatron-Core's MoE paged stash (``--moe-paged-stash``): the routed experts' saved
    activations are copied into one preallocated paged buffer of this many times their balanced
    size (``--moe-paged-stash-buffer-size-factor-cuda``, 1.10 by default, 1.2 in
    Megatron-Bridge's full-iteration-graph recipes); 0: no paged stash."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms/dropout split over TP; all-gather + reduce-scatter."""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    recompute: Recompute = Recompute.NONE
    recompute_layers: int = 0
    """With full recompute, how many layers of each model chunk recompute (Megatron's
    ``--recompute-method block --recompute-num-layers``); the others keep their activations.
    0: every layer."""
    recompute_modules: tuple[RecomputeModule, ...] = ()
    """With ``recompute: modules``, which modules recompute."""
    zero: int = 0
    """ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also parameters (FSDP)."""
    dp_shard: int = 0
    """HSDP: ZeRO shards over groups of ``dp_shard`` data-parallel ranks (x cp), replicated
    over ``dp / dp_shard`` groups that all-reduce their reduced gradient shards (torchtitan's
    ``data_parallel_shard_degree`` with ``data_parallel_replicate_degree``; FSDP2's HSDP, FSDP1's
    ``HYBRID_SHARD``; Megatron's ``--num-distributed-optimizer-instances``). 0: dp."""
    offload: Offload = Offload.NONE
    offload_tier: str = ""
    """Memory tier that receives offloaded state ('' = the node's host DRAM)."""
    offload_split: tuple[tuple[str, float], ...] = ()
    """Offloaded state placed over several memory tiers: (catalog tier, fraction) pairs whose
    fractions sum to 1, e.g. host DRAM 0.6 and CXL 0.4; each tier's share is copied at that
    tier's bandwidth (``simulator/cost/memory.py``). Empty: all in ``offload_tier``."""
    offload_activation_layers: int = 0
    """Transformer layers whose saved activations go to host memory in the forward and come
    back for their backward (Megatron-Core's ``--cpu-offloading`` with activations and
    ``--cpu-offloading-num-layers``, Transformer Engine's ``get_cpu_offload_context``): the
    first n layers, each copied out while later layers compute (``workloads/memory.py``). The
    copies run on their own stream and are not simulated as time."""
    layers_per_stage: tuple[int, ...] = ()
    """Explicit layers per model chunk (pp x virtual_stages entries); empty: automatic."""
    replica_batch: tuple[int, ...] = ()
    """Samples each data-parallel replica processes per step (dp entries, multiples of
    ``training.micro_batch``, summing to ``training.global_batch``): uneven data parallelism,
    as HAP's sharding ratios give a faster device a larger share of the batch (Zhang et al.,
    EuroSys'24). Empty: global_batch / dp each."""
    account_for_embedding_in_pipeline_split: bool = False
    """Megatron-Core's flag: the embedding counts as one layer when the layers are split evenly
    over the chunks, so the first chunk holds one transformer layer fewer (possibly none)."""
    account_for_loss_in_pipeline_split: bool = False
    """Megatron-Core's flag: the LM head and loss count as one layer; the last chunk holds one
    transformer layer fewer (possibly none)."""
    zero3_granularity: Zero3Granularity = Zero3Granularity.LAYER
    zero3_prefetch: Zero3Prefetch = Zero3Prefetch.ALL
    overlap_param_gather: bool = False
    """Megatron-Core's ``--overlap-param-gather`` (distributed optimizer, ZeRO-1/2): updated
    parameters are all-gathered layer by layer as the next step's forward reaches them, not
    all at once after the optimizer step."""
    tp_comm_overlap: bool = False
    """Megatron-Core's ``--tp-comm-overlap`` (Transformer Engine userbuffers; needs sequence
    parallelism): tensor-parallel all-gathers and reduce-scatters stream in tp chunks beside the
    GEMMs that consume and produce them."""
    cuda_graphs: CudaGraphs = CudaGraphs.FULL
    """Which kernels replay from CUDA graphs (``CudaGraphs``); the rest pay the host's eager
    issue time. Default ``full``: host issue time not modelled."""
    subnetworks: Subnetworks | None = None
    """Subnetwork Data Parallelism (``workloads/subnetworks.py``): each replica holds, computes
    and reduces only its subnetwork's blocks. None: every replica holds the whole model."""

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def zero_shards(self) -> int:
        """Data-parallel ranks ZeRO shards over (HSDP's shard degree; dp without HSDP)."""
        return self.dp_shard or self.dp

    @property
    def dp_replicate(self) -> int:
        """HSDP's replica groups: how many copies of each ZeRO shard there are (1: no HSDP)."""
        return self.dp // self.zero_shards

    @property
    def expert_tp(self) -> int:
        """Devices each expert's FFN is split across."""
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Devices of a pipeline stage that hold the same expert shard (Megatron-Core's
        expert-data-parallel group): their expert gradients are reduced together."""
        return self.tp * self.cp * self.dp // (self.ep * self.expert_tp)

    @property
    def sequence_split(self) -> int:
        """Ways sequence parallelism splits the tokens of norms, dropouts and residuals over the
        TP ranks (Korthikanti et al. 2022, sec. 4.2.2): tp with it, 1 without."""
        return self.tp if self.sequence_parallel else 1

    @property
    def chunks(self) -> int:
        """Model chunks of the whole pipeline (stages x virtual stages)."""
        return self.pp * self.virtual_stages

    @property
    def split_extra_layers(self) -> int:
        """Non-transformer parts that count as layers in Megatron-Core's pipeline split."""
        return (int(self.account_for_embedding_in_pipeline_split)
                + int(self.account_for_loss_in_pipeline_split))

    @property
    def fsdp_keeps_gathered(self) -> bool:
        """FSDP (ZeRO-3) under pipeline parallelism as torchtitan runs it: a stage gathers its
        parameters at its first forward and keeps them through every micro-batch
        (``reshard_after_forward`` is False by default with PP), gradients accumulate unsharded
        and are reduce-scattered in the last micro-batch's backward (FSDP2's
        ``set_requires_gradient_sync`` is on only then): ZeRO-1's traffic and memory for
        weights and gradients, ZeRO-3's sharded storage between steps."""
        return self.zero >= 3 and self.pp > 1 and self.zero3_granularity is Zero3Granularity.LAYER

    def recomputes(self, position: int) -> bool:
        """Whether the layer at ``position`` within its model chunk recomputes in full."""
        return self.recompute is Recompute.FULL and (
            not self.recompute_layers or position < self.recompute_layers)

    def recomputed_layers(self, chunk_sizes) -> int:
        """How many layers of chunks of these sizes recompute in full."""
        return sum(1 for size in chunk_sizes for i in range(size) if self.recomputes(i))

    def to_dict(self) -> dict:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp,
                "cp_algorithm": self.cp_algorithm.value, "cp_a2a": self.cp_a2a,
                "ep": self.ep, "etp": self.etp, "ep_dispatcher": self.ep_dispatcher.value,
                "ep_dispatcher_sms": self.ep_dispatcher_sms,
                "moe_a2a_overlap": self.moe_a2a_overlap,
                "moe_paged_stash_buffer": self.moe_paged_stash_buffer,
                "sequence_parallel": self.sequence_parallel, "schedule": self.schedule.value,
                "virtual_stages": self.virtual_stages, "recompute": self.recompute.value,
                "recompute_layers": self.recompute_layers,
                "recompute_modules": [m.value for m in self.recompute_modules], "zero": self.zero,
                "dp_shard": self.dp_shard,
                "offload": self.offload.value, "offload_tier": self.offload_tier,
                "offload_split": dict(self.offload_split),
                "offload_activation_layers": self.offload_activation_layers,
                "layers_per_stage": list(self.layers_per_stage),
                "replica_batch": list(self.replica_batch),
                "account_for_embedding_in_pipeline_split":
                    self.account_for_embedding_in_pipeline_split,
                "account_for_loss_in_pipeline_split": self.account_for_loss_in_pipeline_split,
                "zero3_granularity": self.zero3_granularity.value,
                "zero3_prefetch": self.zero3_prefetch.value,
                "overlap_param_gather": self.overlap_param_gather,
                "tp_comm_overlap": self.tp_comm_overlap,
                "cuda_graphs": self.cuda_graphs.value,
                "subnetworks": self.subnetworks.to_dict() if self.subnetworks else None}


def strategy_from_mapping(data: Mapping, path: str = "strategy") -> Strategy:
    f = Fields(data, path).only(Strategy.__dataclass_fields__)
    layers = tuple(f.integers("layers_per_stage", [], minimum=1))
    spec = Strategy(
        dp=f.integer("dp", 1, minimum=1),
        tp=f.integer("tp", 1, minimum=1),
        pp=f.integer("pp", 1, minimum=1),
        cp=f.integer("cp", 1, minimum=1),
        cp_algorithm=f.choice("cp_algorithm", CpAlgorithm, CpAlgorithm.RING),
        cp_a2a=f.integer("cp_a2a", 0, minimum=0),
        ep=f.integer("ep", 1, minimum=1),
        etp=f.integer("etp", 0, minimum=0),
        ep_dispatcher=f.choice("ep_dispatcher", Dispatcher, Dispatcher.ALLTOALL),
        ep_dispatcher_sms=f.integer("ep_dispatcher_sms", 0, minimum=0),
        moe_a2a_overlap=f.boolean("moe_a2a_overlap", False),
        moe_paged_stash_buffer=f.number("moe_paged_stash_buffer", 0.0, minimum=0.0),
        sequence_parallel=f.boolean("sequence_parallel", False),
        schedule=f.choice("schedule", Schedule, Schedule.ONE_F_ONE_B),
        virtual_stages=f.integer("virtual_stages", 1, minimum=1),
        recompute=f.choice("recompute", Recompute, Recompute.NONE),
        recompute_layers=f.integer("recompute_layers", 0, minimum=0),
        recompute_modules=_recompute_modules(f),
        zero=f.integer("zero", 0, minimum=0),
        dp_shard=f.integer("dp_shard", 0, minimum=0),
        offload=f.choice("offload", Offload, Offload.NONE),
        offload_tier=f.text("offload_tier", ""),
        offload_split=_offload_split(f),
        offload_activation_layers=f.integer("offload_activation_layers", 0, minimum=0),
        layers_per_stage=layers,
        replica_batch=tuple(f.integers("replica_batch", [], minimum=1)),
        account_for_embedding_in_pipeline_split=f.boolean(
            "account_for_embedding_in_pipeline_split", False),
        account_for_loss_in_pipeline_split=f.boolean("account_for_loss_in_pipeline_split", False),
        zero3_granularity=f.choice("zero3_granularity", Zero3Granularity, Zero3Granularity.LAYER),
        zero3_prefetch=_prefetch(f),
        overlap_param_gather=f.boolean("overlap_param_gather", False),
        tp_comm_overlap=f.boolean("tp_comm_overlap", False),
        cuda_graphs=f.choice("cuda_graphs", CudaGraphs, CudaGraphs.FULL),
        subnetworks=subnetworks_from_mapping(f),
    )
    f.done()
    return spec


def _check_context(s: Strategy, model: TransformerSpec, path: str) -> None:
    """Context-parallel variants: Ulysses splits heads over tp x cp (hierarchical: over tp x
    cp_a2a), so the query and KV heads must divide by that."""
    algo = s.cp_algorithm
    if algo is not CpAlgorithm.RING and s.cp == 1:
        raise SpecError(f"{path}.cp_algorithm", f"{algo.value} needs cp > 1")
    if s.cp_a2a and algo is not CpAlgorithm.HIERARCHICAL:
        raise SpecError(f"{path}.cp_a2a", f"{s.cp_a2a} needs cp_algorithm: hierarchical")
    if algo is CpAlgorithm.HIERARCHICAL and (s.cp_a2a < 2 or s.cp_a2a >= s.cp or s.cp % s.cp_a2a):
        raise SpecError(f"{path}.cp_a2a", f"hierarchical context parallelism needs the size of its "
                        f"all-to-all domains: a divisor of cp={s.cp} between 2 and cp/2, "
                        f"got {s.cp_a2a}")
    split = {CpAlgorithm.ULYSSES: s.cp, CpAlgorithm.HIERARCHICAL: s.cp_a2a}.get(algo)
    if split is not None:
        ways, name = s.tp * split, "cp" if algo is CpAlgorithm.ULYSSES else "cp_a2a"
        for heads in ("heads", "kv_heads"):
            if getattr(model, heads) % ways:
                raise SpecError(f"{path}.cp_algorithm", f"{algo.value} splits attention heads over "
                                f"tp*{name} = {s.tp}*{split} = {ways}, which does not divide "
                                f"model.{heads}={getattr(model, heads)} (both heads and kv_heads "
                                "must divide by it)")


def _check_experts(s: Strategy, model: TransformerSpec, path: str) -> None:
    if model.num_experts % s.ep:
        raise SpecError(f"{path}.ep", f"{s.ep} does not divide model.num_experts={model.num_experts}")
    etp = s.expert_tp
    if model.expert_ffn % etp:
        field = "etp" if s.etp else "tp"
        raise SpecError(f"{path}.{field}", f"{etp} does not divide the experts' FFN width "
                        f"{model.expert_ffn}")
    stage = s.tp * s.cp * s.dp
    if stage % (s.ep * etp):
        raise SpecError(f"{path}.ep", f"ep*etp = {s.ep}*{etp} does not divide the devices of a "
                        f"pipeline stage, tp*cp*dp = {s.tp}*{s.cp}*{s.dp} = {stage}")
    if etp != s.tp and s.tp > 1 and not s.sequence_parallel:
        raise SpecError(f"{path}.etp", f"{etp} differs from tp={s.tp}: experts then take each "
                        "device's own tokens, which needs sequence_parallel: true")


def _check_a2a_overlap(s: Strategy, path: str) -> None:
    """Megatron-Core's rules for ``--overlap-moe-expert-parallel-comm`` (its MoE guide)."""
    if not s.moe_a2a_overlap:
        return
    field = f"{path}.moe_a2a_overlap"
    if s.ep == 1:
        raise SpecError(field, "overlaps expert all-to-alls and needs ep > 1")
    if s.recompute is Recompute.FULL:
        raise SpecError(field, "does not run with recompute: full (Megatron-Core refuses it)")
    if s.schedule is Schedule.GPIPE or (s.pp > 1 and s.virtual_stages == 1):
        raise SpecError(field, "merges a forward with a backward of the 1F1B steady state: with "
                        f"pp > 1 it needs schedule: interleaved and virtual_stages > 1 (got "
                        f"schedule {s.schedule.value}, pp={s.pp}, "
                        f"virtual_stages={s.virtual_stages})")


def _check_op_recompute(s: Strategy, model: TransformerSpec, path: str) -> None:
    """Per-op recompute is modelled where torchtitan's matmul count is known: dense layers
    with separate projections, and no tensor parallelism (under TP torchtitan's recompute
    also re-runs the sequence-parallel all-gathers, which the model does not emit)."""
    if s.recompute is not Recompute.OP:
        return
    if model.is_moe or model.is_mla:
        raise SpecError(f"{path}.recompute", "op is modelled for dense layers with "
                        "multi-head or grouped-query attention only (this model has "
                        f"{'experts' if model.is_moe else 'latent attention'})")
    if s.tp > 1:
        raise SpecError(f"{path}.recompute", f"op is modelled without tensor parallelism "
                        f"(tp = 1), got tp = {s.tp}")


def _check_module_recompute(s: Strategy, model: TransformerSpec, path: str) -> None:
    """``recompute_modules`` goes with ``recompute: modules``, and each module must exist."""
    field = f"{path}.recompute_modules"
    if s.recompute is not Recompute.MODULES:
        if s.recompute_modules:
            raise SpecError(field, f"needs recompute: modules, got {s.recompute.value}")
        return
    if not s.recompute_modules:
        raise SpecError(field, "recompute: modules needs a list of modules, some of "
                        f"{', '.join(m.value for m in RecomputeModule)}")
    if RecomputeModule.MLA_UP_PROJ in s.recompute_modules and not model.is_mla:
        raise SpecError(field, "mla_up_proj needs multi-head latent attention "
                        "(model.kv_lora_rank)")
    for module in (RecomputeModule.MOE_ACT, RecomputeModule.MOE):
        if module in s.recompute_modules and not model.is_moe:
            raise SpecError(field, f"{module.value} needs a mixture-of-experts model")


def _check_hsdp(s: Strategy, path: str) -> None:
    if s.dp % s.dp_shard:
        raise SpecError(f"{path}.dp_shard", f"{s.dp_shard} does not divide dp = {s.dp}")
    if s.dp_replicate > 1 and s.zero == 0:
        raise SpecError(f"{path}.dp_shard", "HSDP shards ZeRO state: needs zero 1, 2 or 3, "
                        "got zero 0")
    if s.dp_replicate > 1 and (s.ep > 1 or s.etp not in (0, s.tp)):
        raise SpecError(f"{path}.dp_shard", "HSDP with expert parallelism is not modelled "
                        f"(ep = {s.ep}, etp = {s.etp})")
    if s.dp_replicate > 1 and s.offload is not Offload.NONE:
        raise SpecError(f"{path}.dp_shard", f"HSDP with {s.offload.value} offload is not "
                        "modelled")


def _check_dualpipe(s: Strategy, model: TransformerSpec, micro: int, path: str) -> None:
    """DualPipe's shape (deepseek-ai/DualPipe asserts the same): an even pipeline, at least two
    micro-batches per stage, as many from each end; the two directions are its model chunks."""
    field = f"{path}.schedule"
    if s.pp < 2 or s.pp % 2:
        raise SpecError(field, f"dualpipe needs an even pp >= 2, got pp={s.pp}")
    if micro % 2 or micro < 2 * s.pp:
        raise SpecError(field, f"dualpipe needs an even number of micro-batches per pipeline, "
                        f"at least 2*pp = {2 * s.pp}; got {micro}")
    if s.virtual_stages != 1:
        raise SpecError(f"{path}.virtual_stages", "dualpipe's two directions are its chunks; "
                        f"virtual_stages must be 1, got {s.virtual_stages}")
    if s.zero >= 3:
        raise SpecError(f"{path}.zero", "dualpipe with ZeRO-3 is not modelled (DeepSeek-V3 ran "
                        "ZeRO-1)")
    if s.moe_a2a_overlap:
        raise SpecError(f"{path}.moe_a2a_overlap", "dualpipe overlaps its chunk pairs itself; "
                        "leave moe_a2a_overlap false")
    if model.tied_embeddings:
        raise SpecError(field, "dualpipe with tied embeddings is not modelled")


def micro_batches(training: TrainingSpec, strategy: Strategy) -> int:
    """Micro-batches each pipeline runs per step (gradient-accumulation steps); with uneven
    ``replica_batch``, the most any replica runs."""
    return max(replica_micro_batches(training, strategy))


def replica_micro_batches(training: TrainingSpec, strategy: Strategy) -> tuple[int, ...]:
    """Micro-batches of each data-parallel replica per step."""
    if strategy.replica_batch:
        return tuple(b // training.micro_batch for b in strategy.replica_batch)
    return (training.global_batch // (training.micro_batch * strategy.dp),) * strategy.dp


def _check_replica_batch(s: Strategy, training: TrainingSpec, path: str) -> None:
    """Uneven data parallelism: one entry per replica, whole micro-batches, the global batch in
    all; every collective that spans replicas must still be issued the same number of times
    by each of them, which per-micro-batch ZeRO-3 gathers and expert all-to-alls are not."""
    field, batch = f"{path}.replica_batch", list(s.replica_batch)
    if len(batch) != s.dp:
        raise SpecError(field, f"has {len(batch)} entries, expected one per data-parallel "
                        f"replica (dp = {s.dp})")
    odd = [b for b in batch if b % training.micro_batch]
    if odd:
        raise SpecError(field, f"entries must be multiples of training.micro_batch="
                        f"{training.micro_batch}, got {odd[0]} in {batch}")
    if sum(batch) != training.global_batch:
        raise SpecError(field, f"entries must sum to training.global_batch="
                        f"{training.global_batch}, got {sum(batch)} from {batch}")
    if (s.zero >= 3 and not s.fsdp_keeps_gathered) or s.ep > 1 or s.expert_tp != s.tp:
        why = ("expert parallelism (its all-to-alls span replicas every micro-batch)"
               if s.ep > 1 or s.expert_tp != s.tp
               else "ZeRO-3 gathering every micro-batch (only FSDP under pipeline parallelism "
               "keeps its gather for the step)")
        raise SpecError(field, f"uneven batches need collectives across replicas only once a "
                        f"step; not with {why}")


def check_strategy(strategy: Strategy, model: TransformerSpec, training: TrainingSpec,
                   world_size: int | None = None, path: str = "strategy") -> Strategy:
    """Every rule joining strategy, model, batch and cluster; errors print the numbers."""
    s = strategy
    if s.zero > 3:
        raise SpecError(f"{path}.zero", f"expected 0, 1, 2 or 3, got {s.zero}")
    if model.heads % s.tp:
        raise SpecError(f"{path}.tp", f"{s.tp} does not divide model.heads={model.heads}")
    if model.kv_heads % s.tp and s.tp % model.kv_heads:
        raise SpecError(f"{path}.tp", f"{s.tp} neither divides model.kv_heads={model.kv_heads} "
                        "nor is a multiple of it (to replicate KV heads)")
    if model.ffn_hidden % s.tp:
        raise SpecError(f"{path}.tp", f"{s.tp} does not divide model.ffn_hidden={model.ffn_hidden}")
    if world_size is not None and s.world_size != world_size:
        raise SpecError(f"{path}", f"dp*tp*pp*cp = {s.dp}*{s.tp}*{s.pp}*{s.cp} = {s.world_size} "
                        f"but cluster.num_gpus = {world_size}")
    if s.sequence_parallel and s.tp == 1:
        raise SpecError(f"{path}.sequence_parallel", "needs tp > 1")
    if training.cross_entropy is CrossEntropy.COMPILED_FP32 and s.tp > 1:
        raise SpecError("training.cross_entropy", f"compiled_fp32 is modelled without tensor "
                        f"parallelism (loss_parallel's DTensor loss under torch.compile is "
                        f"not), got tp {s.tp}")
    if s.tp_comm_overlap and not s.sequence_parallel:
        raise SpecError(f"{path}.tp_comm_overlap", "needs sequence_parallel: true (and tp > 1)")
    if s.dp_shard:
        _check_hsdp(s, path)
    if s.overlap_param_gather and not 1 <= s.zero <= 2:
        raise SpecError(f"{path}.overlap_param_gather",
                        f"needs the distributed optimizer (zero 1 or 2), got zero {s.zero}")
    if s.recompute_layers and s.recompute is not Recompute.FULL:
        raise SpecError(f"{path}.recompute_layers", f"{s.recompute_layers} needs recompute: full")
    if s.offload_split and (s.offload is Offload.NONE or s.offload_tier):
        raise SpecError(f"{path}.offload_split", "needs offload: optimizer or params, and replaces "
                        "offload_tier (name every tier in the split)")
    if s.offload_tier and s.offload is Offload.NONE:
        raise SpecError(f"{path}.offload_tier", f"names {s.offload_tier!r} but offload is none; "
                        "set offload: optimizer or params")
    if training.seq_len % (s.cp * s.sequence_split):
        split = s.cp * s.sequence_split
        raise SpecError("training.seq_len", f"{training.seq_len} is not divisible by "
                        f"cp{'*tp' if s.sequence_parallel else ''} = {split}")
    if s.cp > 1 and training.seq_len // s.cp < 2:
        raise SpecError(f"{path}.cp", f"{s.cp} leaves fewer than 2 tokens per device")
    per_step = training.micro_batch * s.dp
    if s.replica_batch:
        _check_replica_batch(s, training, path)
    elif training.global_batch % per_step:
        raise SpecError("training.global_batch", f"{training.global_batch} is not divisible by "
                        f"micro_batch*dp = {training.micro_batch}*{s.dp} = {per_step}")
    _check_context(s, model, path)
    if model.is_moe:
        _check_experts(s, model, path)
    elif s.cuda_graphs.router:
        raise SpecError(f"{path}.cuda_graphs", f"{s.cuda_graphs.value} graphs a MoE layer's "
                        "router and needs a mixture-of-experts model (model.num_experts > 1); "
                        "none or full")
    elif s.ep != 1 or s.etp or s.moe_paged_stash_buffer:
        field = "ep" if s.ep != 1 else "etp" if s.etp else "moe_paged_stash_buffer"
        raise SpecError(f"{path}.{field}", f"{getattr(s, field)} needs a mixture-of-experts model "
                        "(model.num_experts > 1)")
    if s.ep_dispatcher is not Dispatcher.ALLTOALL and s.ep == 1:
        raise SpecError(f"{path}.ep_dispatcher", f"{s.ep_dispatcher.value} dispatches tokens "
                        "between expert-parallel ranks and needs ep > 1")
    if s.ep_dispatcher_sms and s.ep_dispatcher is not Dispatcher.DEEPEP:
        raise SpecError(f"{path}.ep_dispatcher_sms", f"{s.ep_dispatcher_sms} SMs are set for "
                        "DeepEP's normal kernels (ep_dispatcher: deepep); "
                        f"{s.ep_dispatcher.value} chooses its own")
    _check_a2a_overlap(s, path)
    _check_op_recompute(s, model, path)
    _check_module_recompute(s, model, path)
    if s.schedule is Schedule.DUALPIPE:
        _check_dualpipe(s, model, micro_batches(training, s), path)
    if s.virtual_stages > 1 and s.schedule is not Schedule.INTERLEAVED:
        raise SpecError(f"{path}.virtual_stages", f"{s.virtual_stages} needs schedule: interleaved")
    if s.schedule is Schedule.INTERLEAVED:
        if s.pp == 1:
            raise SpecError(f"{path}.schedule", "interleaved needs pp > 1")
        for m in set(replica_micro_batches(training, s)):
            if s.virtual_stages > 1 and m % s.pp:
                raise SpecError(f"{path}.schedule", f"interleaved needs micro-batches per "
                                f"pipeline ({m}) divisible by pp={s.pp}")
    units = model.layers + s.split_extra_layers
    if s.split_extra_layers:
        flag = (f"{path}.account_for_embedding_in_pipeline_split"
                if s.account_for_embedding_in_pipeline_split
                else f"{path}.account_for_loss_in_pipeline_split")
        if s.layers_per_stage:
            raise SpecError(flag, "cannot be combined with layers_per_stage (which says the "
                            "split itself)")
        if s.pp == 1:
            raise SpecError(flag, "needs pp > 1")
        if units % s.chunks:
            raise SpecError(flag, f"model.layers + {s.split_extra_layers} = {units} is not "
                            f"divisible by pp*virtual_stages = {s.chunks} (Megatron-Core "
                            "splits them evenly)")
    if s.layers_per_stage:
        if len(s.layers_per_stage) != s.chunks:
            raise SpecError(f"{path}.layers_per_stage", f"has {len(s.layers_per_stage)} entries, "
                            f"expected pp*virtual_stages = {s.chunks}")
        if sum(s.layers_per_stage) != model.layers or min(s.layers_per_stage) < 1:
            raise SpecError(f"{path}.layers_per_stage", f"entries must be >= 1 and sum to "
                            f"model.layers={model.layers}, got {list(s.layers_per_stage)}")
    elif units < s.chunks:
        raise SpecError(f"{path}.pp", f"pp*virtual_stages = {s.chunks} exceeds model.layers="
                        f"{model.layers}" + (f" + {s.split_extra_layers}"
                                             if s.split_extra_layers else ""))
    if s.subnetworks:
        check_subnetworks(s.subnetworks, model.layers, s.dp, s.pp, s.ep, path)
        if s.dp_replicate > 1:
            raise SpecError(f"{path}.dp_shard", f"{s.dp_shard} (HSDP) cannot be combined with "
                            "subnetworks, whose blocks are shared by their own replica groups")
    if s.zero == 3 and s.pp > 1 and s.zero3_granularity is Zero3Granularity.TENSOR:
        raise SpecError(f"{path}.zero3_granularity", "tensor (DeepSpeed's 2020-21 ZeRO-3) does "
                        "not run with pp > 1; FSDP's layer granularity does (torchtitan)")
    if s.offload is not Offload.NONE and s.zero == 0:
        raise SpecError(f"{path}.offload", f"{s.offload.value} offload needs zero >= 1 "
                        "(ZeRO-Offload partitions what it moves)")
    if s.offload is Offload.PARAMS and s.zero != 3:
        raise SpecError(f"{path}.offload", "params offload needs zero 3 (ZeRO-Infinity)")
    _check_activation_offload(s, model, path)
    return s


def _check_activation_offload(s: Strategy, model: TransformerSpec, path: str) -> None:
    """Megatron-Core's ``TransformerConfig.__post_init__`` rules for CPU offloading: fewer
    offloaded layers than the model has, no pipeline parallelism, no recompute."""
    n, field = s.offload_activation_layers, f"{path}.offload_activation_layers"
    if n >= model.layers:
        raise SpecError(field, f"{n} must be below model.layers={model.layers}")
    if n and s.pp > 1:
        raise SpecError(field, f"{n} needs pp = 1 (Megatron-Core does not offload activations "
                        f"under pipeline parallelism), got pp={s.pp}")
    if n and s.recompute is not Recompute.NONE:
        raise SpecError(field, f"{n} needs recompute: none (Megatron-Core does not offload "
                        f"with recomputation), got {s.recompute.value}")
