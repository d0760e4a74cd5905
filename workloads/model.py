"""Decoder-only transformer descriptions: the spec, the presets, and import from HF config.json.

Parameter counts follow the architecture exactly (GQA K/V widths, gated MLPs, biases, norms,
learned positions, tied embeddings), so they match published totals: GPT-3 175B is 174.6B by
Narayanan et al. (SC'21) eq. (2) P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.fields import MISSING, Fields
from clustersim.hardware_specs.textfile import read_text


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


@dataclass(frozen=True, kw_only=True, slots=True)
class TransformerSpec:
    """A decoder-only transformer; sizes in elements, counts in parameters."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    """Key/value heads: equal to ``heads`` for MHA, fewer for GQA, 1 for MQA."""
    ffn_hidden: int
    vocab: int
    mlp: Mlp
    tied_embeddings: bool
    head_dim: int
    bias: bool = False
    """Linear layers (and LayerNorms) carry biases (GPT-3, BLOOM) or not (Llama, MPT)."""
    norm: Norm = Norm.LAYERNORM
    position: Position = Position.ROPE
    max_positions: int = 2048
    """Rows of the learned position table (only with ``position: learned``)."""
    dropout: bool = False
    """Dropout layers present (they store masks for backward)."""
    embedding_norm: bool = False
    """A norm right after the token embedding (BLOOM)."""
    num_experts: int = 1
    """Experts per MoE layer; 1 means a dense MLP."""
    top_k: int = 1
    """Experts each token is routed to."""
    moe_ffn_hidden: int = 0
    """Hidden width of one expert (0: same as ``ffn_hidden``)."""

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden or self.ffn_hidden

    @property
    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm is Norm.LAYERNORM and self.bias else 1)

    @property
    def attention_params(self) -> int:
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        weights = h * (q + 2 * kv) + q * h
        return weights + ((q + 2 * kv + h) if self.bias else 0)

    def mlp_params(self, ffn: int) -> int:
        """One MLP (or one expert) of width ``ffn``."""
        h = self.hidden
        if self.mlp is Mlp.SWIGLU:
            return 3 * h * ffn + ((2 * ffn + h) if self.bias else 0)
        return 2 * h * ffn + ((ffn + h) if self.bias else 0)

    @property
    def dense_layer_params(self) -> int:
        """A layer's parameters outside the experts (attention, norms, router)."""
        router = self.hidden * self.num_experts if self.is_moe else 0
        return self.attention_params + 2 * self.norm_params + router

    @property
    def expert_layer_params(self) -> int:
        """A layer's MLP parameters: all experts, or the one dense MLP."""
        if self.is_moe:
            return self.num_experts * self.mlp_params(self.expert_ffn)
        return self.mlp_params(self.ffn_hidden)

    @property
    def layer_params(self) -> int:
        return self.dense_layer_params + self.expert_layer_params

    def layer_tensors(self) -> tuple[int, ...]:
        """Sizes of a layer's parameter tensors in the usual module order (norm, QKV, proj,
        norm, MLP weights and biases): what per-tensor ZeRO-3 gathers one by one."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        norm = (h, h) if self.norm is Norm.LAYERNORM and self.bias else (h,)
        out: list[int] = list(norm) + [h * (q + 2 * kv)] + ([q + 2 * kv] if self.bias else [])
        out += [q * h] + ([h] if self.bias else []) + list(norm)
        ffn = self.expert_ffn if self.is_moe else self.ffn_hidden
        mats = 3 if self.mlp is Mlp.SWIGLU else 2
        experts = self.num_experts if self.is_moe else 1
        if self.is_moe:
            out.append(h * self.num_experts)
        for _ in range(experts):
            out += [h * ffn] * mats
            if self.bias:
                out += [ffn] * (mats - 1) + [h]
        return tuple(out)

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
    def parameters(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.head_params

    @property
    def active_parameters(self) -> int:
        """Parameters a token passes through (MoE: top_k experts of each layer)."""
        if not self.is_moe:
            return self.parameters
        unused = (self.num_experts - self.top_k) * self.mlp_params(self.expert_ffn)
        return self.parameters - self.layers * unused

    def to_dict(self) -> dict:
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value.value if isinstance(value, enum.Enum) else value
        return out


def check(model: TransformerSpec, path: str = "model") -> TransformerSpec:
    """Reject impossible architectures, naming the field and the numbers."""
    if model.heads % model.kv_heads:
        raise SpecError(f"{path}.kv_heads",
                        f"{model.kv_heads} does not divide {path}.heads={model.heads}")
    if model.top_k > model.num_experts:
        raise SpecError(f"{path}.top_k",
                        f"{model.top_k} exceeds {path}.num_experts={model.num_experts}")
    return model


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
        num_experts=f.integer("num_experts", d.get("num_experts", 1), minimum=1),
        top_k=f.integer("top_k", d.get("top_k", 1), minimum=1),
        moe_ffn_hidden=f.integer("moe_ffn_hidden", d.get("moe_ffn_hidden", 0), minimum=0),
    )
    f.done()
    return check(model, path)


_INLINE_FIELDS = ("base",) + tuple(TransformerSpec.__dataclass_fields__)

# Hugging Face config.json keys, by the name we use; the first key present wins.
_HF_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head", "n_heads"),
    "kv_heads": ("num_key_value_heads", "n_head_kv", "num_kv_heads"),
    "ffn_hidden": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "vocab": ("vocab_size", "padded_vocab_size"),
    "max_positions": ("max_position_embeddings", "n_positions", "max_seq_len"),
    "head_dim": ("head_dim",),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "top_k": ("num_experts_per_tok", "moe_top_k"),
    "moe_ffn_hidden": ("moe_intermediate_size",),
}
_GATED_ACTIVATIONS = {"silu", "swish", "swiglu", "geglu"}
_LEARNED_POSITIONS = {"gpt2", "gpt_bigcode", "opt", "gptj"}


MAX_LAYERS = 10_000
"""Fifty times the deepest published LLM; the trace holds every layer's ops, so a typo such as
100000000 would otherwise fill memory before anything is printed."""


def from_hf_config(path: Path) -> TransformerSpec:
    """Read a Hugging Face ``config.json`` (Llama/Mistral/Mixtral/Qwen2, GPT-2, BLOOM, MPT...)."""
    field = "model"
    try:
        cfg = json.loads(read_text(path, field))
    except json.JSONDecodeError as err:
        raise SpecError(field, f"cannot read Hugging Face config {path}: {err}") from None
    if not isinstance(cfg, dict):
        raise SpecError(field, f"{path} is not a JSON object")
    values = {}
    for ours, keys in _HF_KEYS.items():
        for key in keys:
            if cfg.get(key) is not None:
                values[ours] = _hf_whole(cfg[key], f"{field} ({path.name}: {key})")
                break
    missing = [k for k in ("layers", "hidden", "heads", "vocab") if k not in values]
    if missing:
        raise SpecError(field, f"{path} lacks {', '.join(missing)} "
                        f"(looked for {', '.join(_HF_KEYS[missing[0]])})")
    model_type = str(cfg.get("model_type", "")).lower()
    activation = str(cfg.get("hidden_act", cfg.get("activation_function", "gelu"))).lower()
    gated = activation in _GATED_ACTIVATIONS or model_type in {"llama", "mistral", "mixtral", "qwen2"}
    hidden = values["hidden"]
    attn_config = cfg.get("attn_config") or {}
    if not isinstance(attn_config, dict):
        raise SpecError(f"{field} ({path.name}: attn_config)",
                        f"expected a JSON object, got {attn_config!r:.40}")
    if "ffn_hidden" not in values:
        ratio = cfg.get("expansion_ratio") or attn_config.get("expansion_ratio") or 4
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < 1e3:
            raise SpecError(f"{field} ({path.name}: expansion_ratio)",
                            f"expected a positive number, got {ratio!r:.40}")
        values["ffn_hidden"] = int(ratio * hidden)
    no_bias = cfg.get("no_bias")
    bias = not no_bias if no_bias is not None else not gated and model_type != "mpt"
    rms = "rms" in str(cfg.get("norm_type", "")).lower() or gated or "rms_norm_eps" in cfg
    if model_type in _LEARNED_POSITIONS:
        position = Position.LEARNED
    elif model_type in {"bloom", "mpt"} or attn_config.get("alibi"):
        position = Position.ALIBI
    else:
        position = Position.ROPE
    mapping = {
        "name": cfg.get("_name_or_path") or path.parent.name or "hf-model",
        "mlp": Mlp.SWIGLU.value if gated else Mlp.GELU.value,
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", model_type in {"gpt2", "bloom", "mpt"})),
        "bias": bool(bias),
        "norm": (Norm.RMSNORM if rms else Norm.LAYERNORM).value,
        "position": position.value,
        "embedding_norm": model_type == "bloom",
        **values,
    }
    return from_mapping(mapping, field)


def _hf_whole(value: object, where: str) -> int:
    """A count from config.json: a whole number (JSON has no NaN; 2.9 layers is a typo)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or int(value) != value):
        raise SpecError(where, f"expected a whole number, got {value!r:.40}")
    return int(value)


def resolve(value: object, base_dir: Path | None = None, path: str = "model") -> TransformerSpec:
    """A model from a preset name, an inline mapping, or a path to a ``config.json``."""
    if isinstance(value, Mapping):
        return from_mapping(value, path)
    if isinstance(value, str):
        if value in PRESETS:
            return PRESETS[value]
        candidate = Path(value).expanduser()
        if base_dir is not None and not candidate.is_absolute():
            candidate = base_dir / candidate
        if candidate.is_dir():
            candidate = candidate / "config.json"
        if candidate.suffix == ".json" or candidate.exists():
            if not candidate.exists():
                raise SpecError(path, f"no such file: {candidate}")
            return from_hf_config(candidate)
        raise SpecError(path, f"unknown preset {value!r}; expected one of {', '.join(PRESETS)}, "
                        "an inline mapping, or a path to a Hugging Face config.json")
    raise SpecError(path, f"expected a preset name, a mapping or a path, got {value!r}")
