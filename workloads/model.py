"""Decoder-only transformer descriptions: the spec, the presets, and import from HF config.json.

Parameter counts follow the architecture exactly (GQA K/V widths, gated MLPs, biases, norms,
learned positions, tied embeddings), so they match published totals: GPT-3 175B is 174.6B by
Narayanan et al. (SC'21) eq. (2) P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.fields import MISSING, Fields
from clustersim.workloads.hybrid import LayerType, check_hybrid, mamba_tensors


class Mlp(enum.Enum):
    GELU = "gelu"
    """Two GEMMs, h -> f -> h, with a GeLU between."""
    SWIGLU = "swiglu"
    """Three GEMMs: gate and up (h -> f each), SiLU(gate) * up, down (f -> h)."""


class Norm(enum.Enum):
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class Position(enum.Enum):
    LEARNED = "learned"
    ROPE = "rope"
    ALIBI = "alibi"


class LocalAttention(enum.Enum):
    """How the layers that do not attend to the whole sequence restrict their keys."""

    NONE = "none"
    SLIDING = "sliding"
    """Each query sees the last ``local_window`` keys (Mistral 7B, gpt-oss's banded layers)."""
    CHUNKED = "chunked"
    """The sequence is cut into chunks of ``local_window``; a query sees its own chunk only
    (Llama 4's local layers, HF ``attention_chunk_size``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TransformerSpec:
    """A decoder-only transformer; sizes in elements, counts in parameters.

    Layers may differ: a mixture of experts can keep its first layers dense
    (``first_dense_layers``, DeepSeek-V3) or put experts on every n-th layer only
    (``moe_layer_step``, Llama 4 Maverick), and local-attention layers can alternate with
    global ones (``global_attention_every``). :meth:`is_moe_layer` and :meth:`layer_parts`
    say what layer i is."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    """Key/value heads: equal to ``heads`` for MHA, fewer for GQA, 1 for MQA."""
    ffn_hidden: int
    """Width of a dense MLP (the dense layers of a mixture of experts)."""
    vocab: int
    mlp: Mlp
    tied_embeddings: bool
    head_dim: int
    """Query/key width per head (MLA: qk_nope_head_dim + qk_rope_head_dim)."""
    bias: bool = False
    """Linear layers (and LayerNorms) carry biases (GPT-3, BLOOM, gpt-oss) or not (Llama, MPT)."""
    norm: Norm = Norm.LAYERNORM
    position: Position = Position.ROPE
    max_positions: int = 2048
    """Rows of the learned position table (only with ``position: learned``)."""
    dropout: bool = False
    """Dropout layers present (they store masks for backward)."""
    embedding_norm: bool = False
    """A norm right after the token embedding (BLOOM)."""
    num_experts: int = 1
    """Routed experts per MoE layer; 1 means a dense MLP."""
    top_k: int = 1
    """Routed experts each token goes to."""
    moe_ffn_hidden: int = 0
    """Hidden width of one routed expert (0: same as ``ffn_hidden``)."""
    shared_experts: int = 0
    """Experts every token passes through beside its routed ones (DeepSeekMoE, Dai et al. 2024,
    arXiv 2401.06066 sec. 3.2; DeepSeek-V3 and Llama 4 have one)."""
    shared_expert_ffn: int = 0
    """Hidden width of one shared expert (0: the routed experts' width)."""
    router_bias: bool = False
    """A per-expert bias in the router (gpt-oss; DeepSeek-V3's ``e_score_correction_bias``)."""
    activation_clamp: bool = False
    """The experts' gated activation clamps its two inputs first (gpt-oss's ``swiglu_limit``:
    gate at most the limit, linear half within plus or minus it)."""
    first_dense_layers: int = 0
    """The first k layers keep a dense MLP of ``ffn_hidden`` (DeepSeek-V3: 3, HF
    ``first_k_dense_replace``)."""
    moe_layer_step: int = 1
    """Layer i (from 0) is a MoE layer when (i + 1) is a multiple of this (Llama 4 Maverick: 2,
    HF ``interleave_moe_layer_step``; Qwen ``decoder_sparse_step``)."""
    expert_groups: int = 1
    """Node-limited routing: experts fall in this many groups (DeepSeek-V3: 8, one per node)."""
    expert_group_limit: int = 0
    """...and a token reaches at most this many groups (DeepSeek-V3: 4; 0: no limit)."""
    mtp_layers: int = 0
    """Multi-token-prediction modules after the last layer (DeepSeek-V3 sec. 2.2: one; each is
    a transformer layer, two norms and a 2h x h projection, sharing embedding and LM head)."""
    q_lora_rank: int = 0
    """MLA (DeepSeek-V2, arXiv 2405.04434 sec. 2.1): rank of the compressed query (0: a full
    h x heads*head_dim query projection)."""
    kv_lora_rank: int = 0
    """MLA: rank of the compressed key/value latent; 0 means standard (GQA/MHA) attention."""
    qk_rope_head_dim: int = 0
    """MLA: the decoupled rotary part of each query/key head (one shared rotary key)."""
    v_head_dim: int = 0
    """Value width per head (0: ``head_dim``; MLA: 128 while queries/keys have 192)."""
    qk_norm: bool = False
    """Per-head RMSNorm weights on queries and keys (Qwen3)."""
    attention_sinks: bool = False
    """A learned sink logit per head (gpt-oss)."""
    local_attention: LocalAttention = LocalAttention.NONE
    local_window: int = 0
    """Keys a local-attention query may see (sliding) or the chunk length (chunked)."""
    global_attention_every: int = 0
    """With local attention, layer i is global when (i + 1) is a multiple of this (gpt-oss: 2,
    Llama 4: 4); 0: every layer is local."""
    vision_params: int = 0
    """Parameters of a vision encoder and projector that the published total includes (Llama 4);
    counted in :attr:`parameters`, never simulated (the trace runs the text model)."""
    hybrid_pattern: str = ""
    """A hybrid stack's layers, one Megatron-Core symbol each (``workloads/hybrid.py``): M a
    Mamba-2 mixer, * attention, - a dense MLP, E a mixture of experts, each layer one pre-norm
    and one block. Empty: every layer is attention and an MLP (or MoE)."""
    mamba_heads: int = 0
    """Mamba-2 heads (Megatron ``mamba_num_heads``); d_inner = heads x head_dim."""
    mamba_head_dim: int = 0
    mamba_state: int = 0
    """SSM state size N (``mamba_state_dim``, HF ``ssm_state_size``)."""
    mamba_groups: int = 0
    """B/C groups (``mamba_num_groups``, HF ``n_groups``)."""
    mamba_conv: int = 4
    """Taps of the depthwise causal conv1d (``d_conv``)."""
    mamba_chunk: int = 128
    """Chunk length Q of the SSD scan (``chunk_size``)."""

    # --- attention ---------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def qk_nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of all query heads (and of all key heads under MLA)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key heads (MLA: decompressed per head, one for every query head)."""
        return self.kv_heads * self.head_dim

    @property
    def v_dim(self) -> int:
        """Width of the value heads, which is also the attention output's."""
        return self.kv_heads * self.value_head_dim

    @property
    def attn_out_dim(self) -> int:
        """Input width of the output projection: every query head's value-sized output."""
        return self.heads * self.value_head_dim

    def is_global_attention(self, layer: int) -> bool:
        if self.local_attention is LocalAttention.NONE:
            return True
        every = self.global_attention_every
        return bool(every) and (layer + 1) % every == 0

    @property
    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm is Norm.LAYERNORM and self.bias else 1)

    def attention_tensors(self) -> tuple[int, ...]:
        """Sizes of the attention's parameter tensors, in module order."""
        h = self.hidden
        if self.is_mla:
            heads, rope, lora_q, lora_kv = self.heads, self.qk_rope_head_dim, \
                self.q_lora_rank, self.kv_lora_rank
            q = ((h * lora_q, lora_q, lora_q * self.q_dim) if lora_q else (h * self.q_dim,))
            kv = (h * (lora_kv + rope), lora_kv,
                  lora_kv * heads * (self.qk_nope_head_dim + self.value_head_dim))
            return q + kv + (self.attn_out_dim * h,)
        q, k, v = self.q_dim, self.kv_dim, self.v_dim
        out: tuple[int, ...] = (h * (q + k + v),) + ((q + k + v,) if self.bias else ())
        out += (self.attn_out_dim * h,) + ((h,) if self.bias else ())
        if self.qk_norm:
            out += (self.head_dim, self.head_dim)
        if self.attention_sinks:
            out += (self.heads,)
        return out

    @property
    def attention_params(self) -> int:
        return sum(self.attention_tensors())

    # --- MLPs and experts --------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden or self.ffn_hidden

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn or self.expert_ffn

    @property
    def is_hybrid(self) -> bool:
        return bool(self.hybrid_pattern)

    def layer_type(self, layer: int) -> LayerType | None:
        """What layer ``layer`` of a hybrid stack is (None: attention and an MLP, no pattern)."""
        return LayerType(self.hybrid_pattern[layer]) if self.hybrid_pattern else None

    def has_attention(self, layer: int) -> bool:
        return self.layer_type(layer) in (None, LayerType.ATTENTION)

    def has_mlp(self, layer: int) -> bool:
        """A dense MLP or a mixture of experts."""
        return self.layer_type(layer) in (None, LayerType.MLP, LayerType.MOE)

    def is_moe_layer(self, layer: int) -> bool:
        if self.hybrid_pattern:
            return self.is_moe and self.layer_type(layer) is LayerType.MOE
        return (self.is_moe and layer >= self.first_dense_layers
                and (layer + 1) % self.moe_layer_step == 0)

    def layer_kind(self, layer: int) -> tuple[bool, bool, LayerType | None]:
        """(MoE MLP, global attention, hybrid layer type): what sets a layer's kernels apart
        from another's."""
        return self.is_moe_layer(layer), self.is_global_attention(layer), self.layer_type(layer)

    def mamba_tensors(self) -> tuple[tuple[int, bool], ...]:
        """A Mamba-2 mixer's parameter tensors (size, TP-split), its layer's norm aside."""
        return mamba_tensors(self.hidden, self.mamba_heads, self.mamba_head_dim,
                             self.mamba_state, self.mamba_groups, self.mamba_conv)

    @property
    def mamba_params(self) -> int:
        return sum(n for n, _ in self.mamba_tensors())

    @property
    def moe_layers(self) -> int:
        return sum(1 for i in range(self.layers) if self.is_moe_layer(i))

    def mlp_tensors(self, ffn: int) -> tuple[int, ...]:
        h, mats = self.hidden, (3 if self.mlp is Mlp.SWIGLU else 2)
        return (h * ffn,) * mats + (((ffn,) * (mats - 1) + (h,)) if self.bias else ())

    def mlp_params(self, ffn: int) -> int:
        """One MLP (or one expert) of width ``ffn``."""
        return sum(self.mlp_tensors(ffn))

    @property
    def router_params(self) -> int:
        return self.hidden * self.num_experts + (self.num_experts if self.router_bias else 0)

    @property
    def routed_expert_params(self) -> int:
        """All routed experts of one MoE layer: what expert parallelism splits."""
        return self.num_experts * self.mlp_params(self.expert_ffn)

    def layer_parts(self, layer: int) -> tuple[int, int]:
        """(dense, expert) parameters of layer ``layer``: the expert part is its routed experts
        (0 in a dense layer); the dense part is everything else, shared experts and router
        included."""
        kind = self.layer_type(layer)
        if kind is not None:   # one pre-norm and one block
            block = {LayerType.MAMBA: self.mamba_params, LayerType.ATTENTION: self.attention_params,
                     LayerType.MLP: self.mlp_params(self.ffn_hidden)}
            if kind is LayerType.MOE:
                shared = self.shared_experts * self.mlp_params(self.shared_ffn)
                return self.norm_params + self.router_params + shared, self.routed_expert_params
            return self.norm_params + block[kind], 0
        base = self.attention_params + 2 * self.norm_params
        if self.is_moe_layer(layer):
            shared = self.shared_experts * self.mlp_params(self.shared_ffn)
            return base + self.router_params + shared, self.routed_expert_params
        return base + self.mlp_params(self.ffn_hidden), 0

    def layer_total(self, layer: int) -> int:
        return sum(self.layer_parts(layer))

    def params_of_layers(self, layers) -> tuple[int, int]:
        """(dense, expert) parameters of the given layer indices."""
        parts = [self.layer_parts(i) for i in layers]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    @property
    def dense_layer_params(self) -> float:
        """A layer's parameters outside the routed experts (attention, norms, router, shared
        experts; a dense model's MLP is on :attr:`expert_layer_params`). The mean over layers
        when they differ."""
        if not self.is_moe:
            return self.attention_params + 2 * self.norm_params
        return self.params_of_layers(range(self.layers))[0] / self.layers

    @property
    def expert_layer_params(self) -> float:
        """A layer's MLP parameters: all routed experts, or the one dense MLP (mean over layers
        when they differ)."""
        if not self.is_moe:
            return self.mlp_params(self.ffn_hidden)
        return self.params_of_layers(range(self.layers))[1] / self.layers

    @property
    def layer_params(self) -> float:
        return self.dense_layer_params + self.expert_layer_params

    # --- the whole model -----------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        """Token embedding, learned positions and the optional embedding norm (first stage)."""
        positions = self.max_positions * self.hidden if self.position is Position.LEARNED else 0
        return self.vocab * self.hidden + positions + (self.norm_params if self.embedding_norm else 0)

    @property
    def head_params(self) -> int:
        """Final norm and, when untied, the LM head matrix (last stage)."""
        return self.norm_params + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @property
    def mtp_module_params(self) -> int:
        """One multi-token-prediction module without the embedding and LM head it shares:
        a layer like the last one, the two input norms, the 2h x h projection and the head's
        norm (DeepSeek-V3 sec. 2.2; the checkpoint's ``model.layers.61``)."""
        return (self.layer_total(self.layers - 1) + 3 * self.norm_params
                + 2 * self.hidden * self.hidden)

    @property
    def mtp_params(self) -> int:
        return self.mtp_layers * self.mtp_module_params

    @property
    def parameters(self) -> int:
        """The main model as published: layers, embedding, head and any vision encoder;
        multi-token-prediction modules are :attr:`mtp_params` (DeepSeek-V3's 671 B leaves
        them out)."""
        layers = sum(self.layer_total(i) for i in range(self.layers))
        return layers + self.embedding_params + self.head_params + self.vision_params

    @property
    def unused_expert_params(self) -> int:
        """Routed-expert parameters a token does not pass through, over all layers."""
        if not self.is_moe:
            return 0
        return self.moe_layers * (self.num_experts - self.top_k) * self.mlp_params(self.expert_ffn)

    @property
    def active_parameters(self) -> int:
        """Parameters of the text model a token passes through, the embedding table counted
        (MoE: top_k routed experts of each MoE layer; Mixtral's 12.9 B counts this way)."""
        return self.parameters - self.vision_params - self.unused_expert_params

    @property
    def active_compute_parameters(self) -> int:
        """Active parameters that multiply: the input embedding is a table lookup, so an
        untied one is left out (DeepSeek-V3's 36.6 B and gpt-oss's 5.1 B count this way)."""
        lookup = 0 if self.tied_embeddings else self.embedding_params
        return self.active_parameters - lookup

    def to_dict(self) -> dict:
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value.value if isinstance(value, enum.Enum) else value
        return out


def check(model: TransformerSpec, path: str = "model") -> TransformerSpec:
    """Reject impossible architectures, naming the field and the numbers."""
    m = model
    check_hybrid(m, path)
    if m.heads % m.kv_heads:
        raise SpecError(f"{path}.kv_heads", f"{m.kv_heads} does not divide {path}.heads={m.heads}")
    if m.top_k > m.num_experts:
        raise SpecError(f"{path}.top_k", f"{m.top_k} exceeds {path}.num_experts={m.num_experts}")
    moe_only = {"shared_experts": m.shared_experts, "first_dense_layers": m.first_dense_layers,
                "moe_ffn_hidden": m.moe_ffn_hidden, "expert_group_limit": m.expert_group_limit}
    for key, value in moe_only.items():
        if value and not m.is_moe:
            raise SpecError(f"{path}.{key}", f"{value} needs a mixture of experts "
                            f"({path}.num_experts > 1)")
    if m.is_moe and not m.moe_layers:
        raise SpecError(f"{path}.first_dense_layers", f"{m.first_dense_layers} with "
                        f"moe_layer_step {m.moe_layer_step} leaves no MoE layer of {m.layers}")
    if m.num_experts % m.expert_groups:
        raise SpecError(f"{path}.expert_groups", f"{m.expert_groups} does not divide "
                        f"{path}.num_experts={m.num_experts}")
    if m.expert_group_limit > m.expert_groups:
        raise SpecError(f"{path}.expert_group_limit", f"{m.expert_group_limit} exceeds "
                        f"{path}.expert_groups={m.expert_groups}")
    if m.is_mla:
        if not 0 < m.qk_rope_head_dim < m.head_dim:
            raise SpecError(f"{path}.qk_rope_head_dim", f"MLA needs 0 < {m.qk_rope_head_dim} < "
                            f"{path}.head_dim={m.head_dim} (the rotary part of each head)")
        if m.kv_heads != m.heads or m.bias or m.qk_norm or m.attention_sinks:
            raise SpecError(f"{path}.kv_lora_rank", "multi-head latent attention has one key "
                            "head per query head and no biases, QK norms or sinks")
    elif m.q_lora_rank or m.qk_rope_head_dim:
        key = "q_lora_rank" if m.q_lora_rank else "qk_rope_head_dim"
        raise SpecError(f"{path}.{key}", "needs multi-head latent attention (kv_lora_rank > 0)")
    if (m.local_attention is LocalAttention.NONE) != (m.local_window == 0):
        raise SpecError(f"{path}.local_window", f"{m.local_window} with local_attention "
                        f"{m.local_attention.value}: a window needs local attention and back")
    return m


def _megatron_gpt(name: str, layers: int, hidden: int, heads: int) -> TransformerSpec:
    """The GPT models of Narayanan et al. (SC'21) Table 1: GeLU MLP of 4h, V = 51,200,
    learned positions for s = 2048, biases, LayerNorm, dropout, tied embeddings."""
    return TransformerSpec(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
        ffn_hidden=4 * hidden, vocab=51200, mlp=Mlp.GELU, tied_embeddings=True,
        head_dim=hidden // heads, bias=True, norm=Norm.LAYERNORM, position=Position.LEARNED,
        max_positions=2048, dropout=True)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int,
           vocab: int) -> TransformerSpec:
    """Llama 2/3 (Touvron et al. 2023; Llama 3 Herd, arXiv 2407.21783, Table 3): SwiGLU,
    RMSNorm, RoPE, no biases, untied embeddings."""
    return TransformerSpec(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        ffn_hidden=ffn, vocab=vocab, mlp=Mlp.SWIGLU, tied_embeddings=False,
        head_dim=hidden // heads, bias=False, norm=Norm.RMSNORM, position=Position.ROPE)


def _mpt(name: str, layers: int, hidden: int, heads: int, vocab: int) -> TransformerSpec:
    """MosaicML MPT (llm-foundry mpt-*.yaml): GeLU MLP of 4h, ALiBi, no biases, LayerNorm
    without bias, tied embeddings, no dropout."""
    return TransformerSpec(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
        ffn_hidden=4 * hidden, vocab=vocab, mlp=Mlp.GELU, tied_embeddings=True,
        head_dim=hidden // heads, bias=False, norm=Norm.LAYERNORM, position=Position.ALIBI)


PRESETS: Mapping[str, TransformerSpec] = {
    # GPT-3 (Brown et al. 2020, Table 2.1) as trained with Megatron (vocabulary padded to 51,200).
    "gpt3-175b": _megatron_gpt("gpt3-175b", 96, 12288, 96),
    # Narayanan et al. SC'21, Table 1.
    "megatron-1.7b": _megatron_gpt("megatron-1.7b", 24, 2304, 24),
    "megatron-3.6b": _megatron_gpt("megatron-3.6b", 30, 3072, 32),
    "megatron-7.5b": _megatron_gpt("megatron-7.5b", 36, 4096, 32),
    "megatron-18b": _megatron_gpt("megatron-18b", 40, 6144, 48),
    "megatron-39b": _megatron_gpt("megatron-39b", 48, 8192, 64),
    "megatron-76b": _megatron_gpt("megatron-76b", 60, 10240, 80),
    "megatron-145b": _megatron_gpt("megatron-145b", 80, 12288, 96),
    "megatron-310b": _megatron_gpt("megatron-310b", 96, 16384, 128),
    "megatron-530b": _megatron_gpt("megatron-530b", 105, 20480, 128),
    "megatron-1t": _megatron_gpt("megatron-1t", 128, 25600, 160),
    # BLOOM (BigScience, arXiv 2211.05100, Table 1): ALiBi, embedding LayerNorm, tied, V = 250,880.
    "bloom-176b": TransformerSpec(
        name="bloom-176b", layers=70, hidden=14336, heads=112, kv_heads=112, ffn_hidden=57344,
        vocab=250880, mlp=Mlp.GELU, tied_embeddings=True, head_dim=128, bias=True,
        norm=Norm.LAYERNORM, position=Position.ALIBI, dropout=False, embedding_norm=True),
    "llama2-7b": _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
    "llama2-13b": _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
    "llama2-70b": _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
    "llama3-8b": _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
    "llama3-405b": _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256),
    # MPT-7B/30B as released on the Hugging Face hub (vocab 50,432); MPT-70B from llm-foundry's
    # scripts/train/yamls/pretrain/mpt-70b.yaml (vocab 50,368).
    "mpt-7b": _mpt("mpt-7b", 32, 4096, 32, 50432),
    "mpt-30b": _mpt("mpt-30b", 48, 7168, 64, 50432),
    "mpt-70b": _mpt("mpt-70b", 80, 8192, 64, 50368),
    # Nemotron 3 Nano 30B-A3B: Megatron-Bridge src/megatron/bridge/recipes/nemotronh/h100/
    # nemotron_3_nano.py @ 067f987d (HybridModelProvider: pattern, hidden 2688, 32 query and 2
    # KV heads of 128, 64 Mamba heads of 64, state 128, 8 groups, 128 experts of 1856, top-6,
    # one shared expert of 3712, squared-ReLU MLPs: two GEMMs, run as mlp gelu; sigmoid router
    # with expert bias), Megatron-LM mamba_mixer.py defaults d_conv 4, chunk_size 128; vocab
    # 131,072 and untied embeddings from the HF config of nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B.
    "nemotron3-nano-30b-a3b": TransformerSpec(
        name="nemotron3-nano-30b-a3b", layers=52, hidden=2688, heads=32, kv_heads=2,
        ffn_hidden=1856, vocab=131072, mlp=Mlp.GELU, tied_embeddings=False, head_dim=128,
        norm=Norm.RMSNORM, position=Position.ROPE, num_experts=128, top_k=6,
        moe_ffn_hidden=1856, shared_experts=1, shared_expert_ffn=3712, router_bias=True,
        hybrid_pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
        mamba_heads=64, mamba_head_dim=64, mamba_state=128, mamba_groups=8),
    # Mixtral 8x7B (Jiang et al. 2024, arXiv 2401.04088): 8 experts, top-2, GQA.
    "mixtral-8x7b": replace(_llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000),
                            num_experts=8, top_k=2),
}


def from_mapping(data: Mapping, path: str = "model") -> TransformerSpec:
    """An inline model: ``{layers, hidden, heads, ...}``; ``base: PRESET`` fills what is omitted."""
    f = Fields(data, path).only(_INLINE_FIELDS)
    base_name = f.text("base", "")
    if base_name and base_name not in PRESETS:
        raise SpecError(f.at("base"), f"unknown preset {base_name!r}; known: {', '.join(PRESETS)}")
    base = PRESETS.get(base_name)
    d = base.to_dict() if base else {}
    d = {k: v for k, v in d.items()}
    for key in ("layers", "hidden", "heads", "vocab"):
        d.setdefault(key, MISSING)
    hidden = f.integer("hidden", d.get("hidden"), minimum=1)
    heads = f.integer("heads", d.get("heads"), minimum=1)
    mlp = f.choice("mlp", Mlp, d.get("mlp", "gelu"))
    if mlp is not Mlp.GELU and d.get("ffn_hidden") is None and not f.has("ffn_hidden"):
        raise SpecError(f.at("ffn_hidden"), f"is required with mlp: {mlp.value} (gated MLPs have "
                        "no standard width; Llama-style models use about 8/3 x hidden)")
    if hidden % heads and not f.has("head_dim"):
        raise SpecError(f.at("heads"), f"{heads} does not divide {path}.hidden={hidden}; give head_dim")
    model = TransformerSpec(
        name=f.text("name", d.get("name", "custom")),
        layers=f.integer("layers", d.get("layers"), minimum=1, maximum=MAX_LAYERS),
        hidden=hidden,
        heads=heads,
        kv_heads=f.integer("kv_heads", d.get("kv_heads", heads), minimum=1),
        ffn_hidden=f.integer("ffn_hidden", d.get("ffn_hidden", 4 * hidden if mlp is Mlp.GELU else None),
                             minimum=1),
        vocab=f.integer("vocab", d.get("vocab"), minimum=1),
        mlp=mlp,
        tied_embeddings=f.boolean("tied_embeddings", d.get("tied_embeddings", False)),
        head_dim=f.integer("head_dim", d.get("head_dim", hidden // heads), minimum=1),
        bias=f.boolean("bias", d.get("bias", False)),
        norm=f.choice("norm", Norm, d.get("norm", "layernorm")),
        position=f.choice("position", Position, d.get("position", "rope")),
        max_positions=f.integer("max_positions", d.get("max_positions", 2048), minimum=1),
        dropout=f.boolean("dropout", d.get("dropout", False)),
        embedding_norm=f.boolean("embedding_norm", d.get("embedding_norm", False)),
        num_experts=f.integer("num_experts", d.get("num_experts", 1), minimum=1,
                              maximum=MAX_EXPERTS),
        top_k=f.integer("top_k", d.get("top_k", 1), minimum=1),
        moe_ffn_hidden=f.integer("moe_ffn_hidden", d.get("moe_ffn_hidden", 0), minimum=0),
        **_moe_and_attention_fields(f, d),
    )
    f.done()
    return check(model, path)


_INLINE_FIELDS = ("base",) + tuple(TransformerSpec.__dataclass_fields__)

MAX_EXPERTS = 16_384
"""Eight times the most experts published (Switch-C, 2,048); routing keeps an entry per
expert, so 100000000 would run out of memory after a minute instead of failing at once."""
MAX_LAYERS = 10_000
"""Fifty times the deepest published LLM; the trace holds every layer's ops, so a typo such as
100000000 would otherwise fill memory before anything is printed."""


def _moe_and_attention_fields(f: Fields, d: Mapping) -> dict:
    """The mixture-of-experts, MLA and local-attention fields of an inline model."""
    whole = ("shared_experts", "shared_expert_ffn", "first_dense_layers", "expert_group_limit",
             "mtp_layers", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim",
             "local_window", "global_attention_every", "vision_params", "mamba_heads",
             "mamba_head_dim", "mamba_state", "mamba_groups")
    out: dict = {key: f.integer(key, d.get(key, 0), minimum=0) for key in whole}
    for key in ("moe_layer_step", "expert_groups"):
        out[key] = f.integer(key, d.get(key, 1), minimum=1)
    for key in ("router_bias", "qk_norm", "attention_sinks", "activation_clamp"):
        out[key] = f.boolean(key, d.get(key, False))
    out["local_attention"] = f.choice("local_attention", LocalAttention,
                                      d.get("local_attention", "none"))
    out["hybrid_pattern"] = f.text("hybrid_pattern", d.get("hybrid_pattern", ""))
    out["mamba_conv"] = f.integer("mamba_conv", d.get("mamba_conv", 4), minimum=1)
    out["mamba_chunk"] = f.integer("mamba_chunk", d.get("mamba_chunk", 128), minimum=1)
    return out
