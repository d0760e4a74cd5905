"""Where a model comes from: a preset name, an inline mapping, or a Hugging Face ``config.json``.

The import reads every key of a config. A key either changes the model (it is read), or is on
:data:`IRRELEVANT_KEYS` with the reason it does not change what a training step computes,
stores or sends (tokenizer ids, rotary-scaling details, inference switches); any other key is an
error that names it, so an architecture we do not model is never silently a different one.

Families read as their Hugging Face ``modeling_*.py`` builds them: Llama/Mistral/Mixtral/Qwen2/
Qwen3(-MoE), DeepSeek-V2/V3 (MLA, shared experts, dense first layers, MTP), gpt-oss (biases,
sinks, banded attention), Llama 4 (text model, its interleaved MoE and chunked layers, and the
vision encoder's parameter count), GPT-2, BLOOM, MPT, OPT.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.errors import shown
from clustersim.hardware_specs.fields import did_you_mean, whole_number
from clustersim.hardware_specs.textfile import load_json
from clustersim.workloads.model import (
    PRESETS, LocalAttention, Mlp, Norm, Position, TransformerSpec, from_mapping,
)

HF_PRESETS: Mapping[str, str] = {
    "deepseek-v3": "deepseek-v3.json",
    "qwen3-30b-a3b": "qwen3-30b-a3b.json",
    "qwen3-235b-a22b": "qwen3-235b-a22b.json",
    "mixtral-8x22b": "mixtral-8x22b.json",
    "gpt-oss-20b": "gpt-oss-20b.json",
    "gpt-oss-120b": "gpt-oss-120b.json",
    "llama4-scout": "llama4-scout.json",
    "llama4-maverick": "llama4-maverick.json",
}
"""Presets read from the published config.json files bundled in ``workloads/hf_configs``
(sources in its README). ``mixtral-8x7b`` is a code preset, and its config.json is bundled too."""

_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head", "n_heads"),
    "kv_heads": ("num_key_value_heads", "n_head_kv", "num_kv_heads"),
    "ffn_hidden": ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim"),
    "vocab": ("vocab_size", "padded_vocab_size"),
    "max_positions": ("max_position_embeddings", "n_positions", "max_seq_len"),
    "head_dim": ("head_dim",),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "top_k": ("num_experts_per_tok", "moe_top_k"),
    "moe_ffn_hidden": ("moe_intermediate_size",),
}
"""config.json keys of each of our fields; the first one present wins."""

IRRELEVANT_KEYS: Mapping[str, str] = {
    **dict.fromkeys(("architectures", "model_type", "_name_or_path", "transformers_version",
                     "torch_dtype", "dtype", "auto_map", "_attn_implementation_autoset",
                     "for_llm_compressor", "_commit_hash", "name_or_path"),
                    "identity and bookkeeping"),
    **dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
                     "decoder_start_token_id", "boi_token_index", "eoi_token_index",
                     "image_token_index"), "tokenizer ids"),
    **dict.fromkeys(("use_cache", "output_router_logits", "cache_implementation",
                     "initial_context_length", "return_dict", "output_attentions",
                     "output_hidden_states", "tie_word_embeddings_for_generation",
                     "task_specific_params", "summary_type", "summary_use_proj",
                     "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
                     "n_ctx", "use_return_dict", "slow_but_exact", "output_past"),
                    "inference and fine-tuning-head switches, not the trained network"),
    **dict.fromkeys(("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps",
                     "initializer_range", "init_device", "init_config", "rope_theta",
                     "rope_scaling", "rope_parameters", "rope_interleave", "attn_scale",
                     "floor_scale", "attn_temperature_tuning",
                     "scale_attn_weights", "reorder_and_upcast_attn",
                     "scale_attn_by_inverse_layer_idx", "apply_residual_connection_post_layernorm",
                     "pretraining_tp", "logit_scale", "use_qk_norm", "learned_pos_emb",
                     "alibi_bias_max", "clip_qkv", "softmax_scale", "qk_ln", "attn_impl",
                     "attn_type", "attn_uses_sequence_id", "prefix_lm", "logit_scale",
                     "emb_pdrop_unused", "use_pad_tok_in_ffn", "verbose", "resid_pdrop_unused"),
                    "numerics, initialisation and rotary-scaling details: the same GEMMs, "
                    "the same bytes (Llama 4's qk norm is weightless L2)"),
    **dict.fromkeys(("routed_scaling_factor", "norm_topk_prob", "scoring_func", "topk_method",
                     "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "router_jitter_noise",
                     "ep_size", "moe_layers"),
                    "routing scores and losses: which experts, not how many (moe_layers is "
                    "checked against interleave_moe_layer_step)"),
    **dict.fromkeys(("attention_softmax_in_fp32", "bias_dropout_fusion", "masked_softmax_fusion",
                     "skip_bias_add", "skip_bias_add_qkv", "offset_alibi", "unk_token_id",
                     "tokenizer_name", "embedding_fraction", "init_std", "layerdrop",
                     "do_layer_norm_before", "prefix"),
                    "kernel-fusion and precision switches, the embedding's gradient scale, "
                    "layer-drop: the same network (BLOOM, MPT, OPT configs)"),
    "quantization_config": "how the released weights are stored; training precision is "
                           "the run's training.precision",
}


def from_hf_config(path: Path, name: str = "") -> TransformerSpec:
    """Read a Hugging Face ``config.json``; errors name the file and the key."""
    field = "model"
    cfg = load_json(path, field)
    if not isinstance(cfg, dict):
        raise SpecError(field, f"{path} is not a JSON object")
    return _HfConfig(cfg, path, name).model()


class _HfConfig:
    """One config.json being read; remembers the keys used so the rest can be checked."""

    def __init__(self, cfg: dict, path: Path, name: str = ""):
        self.cfg, self.path, self.name = cfg, path, name
        self.used: set[str] = set()
        self.model_type = str(cfg.get("model_type", "")).lower()
        if self.model_type == "llama4":
            self.text = self._object("text_config")
            self.used |= {"text_config", "vision_config", "tie_word_embeddings"}
        else:
            self.text = cfg

    def where(self, key: str) -> str:
        nested = "text_config." if self.text is not self.cfg and key in self.text else ""
        return f"model ({self.path.name}: {nested}{key})"

    def _object(self, key: str) -> dict:
        value = self.cfg.get(key)
        if not isinstance(value, dict):
            raise SpecError(f"model ({self.path.name}: {key})",
                            f"expected a JSON object, got {value!r:.40}")
        return value

    def get(self, key: str, default: object = None) -> object:
        self.used.add(key)
        value = self.text.get(key)
        return default if value is None else value

    def flag(self, key: str, default: bool) -> bool:
        """A JSON true/false: ``"false"`` is text, and ``bool("false")`` would read it as true."""
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise SpecError(self.where(key), f"expected true or false, got {value!r:.40}")
        return value

    def whole(self, key: str, default: object = None) -> int | None:
        value = self.get(key)
        if value is None:
            return default  # type: ignore[return-value]
        return _whole(value, self.where(key))

    def first(self, keys: tuple[str, ...]) -> int | None:
        for key in keys:
            if self.text.get(key) is not None:
                return self.whole(key)
        self.used.update(keys)
        return None

    def activation(self) -> str:
        """The MLP's activation, one Hugging Face knows: its name decides only whether the MLP
        is gated, so a misspelt one would silently give a different model."""
        key = "hidden_act" if self.get("hidden_act") is not None else "activation_function"
        value = self.get(key, "gelu")
        if not isinstance(value, str) or value.lower() not in _KNOWN_ACTIVATIONS:
            raise SpecError(self.where(key), f"expected one of Hugging Face's activations "
                            f"({', '.join(sorted(_KNOWN_ACTIVATIONS))}), got {value!r:.40}")
        return value.lower()

    # --- the model --------------------------------------------------------------------------
    def model(self) -> TransformerSpec:
        values = {ours: v for ours, keys in _KEYS.items()
                  if (v := self.first(keys)) is not None}
        missing = [k for k in ("layers", "hidden", "heads", "vocab") if k not in values]
        if missing:
            raise SpecError("model", f"{self.path} lacks {', '.join(missing)} "
                            f"(looked for {', '.join(_KEYS[missing[0]])})")
        mt = self.model_type
        activation = self.activation()
        gated = activation in _GATED_ACTIVATIONS or mt in _GATED_FAMILIES
        attn_config = self.get("attn_config") or {}
        if not isinstance(attn_config, dict):
            raise SpecError(self.where("attn_config"),
                            f"expected a JSON object, got {attn_config!r:.40}")
        if "ffn_hidden" not in values:
            ratio = self.get("expansion_ratio") or attn_config.get("expansion_ratio") or 4
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < 1e3:
                raise SpecError(self.where("expansion_ratio"),
                                f"expected a positive number, got {ratio!r:.40}")
            values["ffn_hidden"] = int(ratio * values["hidden"])
        bias = (not self.flag("no_bias", False) if self.get("no_bias") is not None
                else self.flag("attention_bias", not gated and mt != "mpt"))
        if self.flag("mlp_bias", False):
            raise SpecError(self.where("mlp_bias"), "MLP biases without attention biases are "
                            "not modelled (bias covers every linear layer)")
        rms = ("rms" in str(self.get("norm_type", "")).lower() or gated
               or "rms_norm_eps" in self.text)
        if mt in _LEARNED_POSITIONS:
            position = Position.LEARNED
        elif mt in {"bloom", "mpt"} or attn_config.get("alibi"):
            position = Position.ALIBI
        else:
            position = Position.ROPE
        tied = self.cfg.get("tie_word_embeddings", self.text.get("tie_word_embeddings",
                                                                  mt in {"gpt2", "bloom", "mpt"}))
        self.used.add("tie_word_embeddings")
        if not isinstance(tied, bool):
            raise SpecError(f"model ({self.path.name}: tie_word_embeddings)",
                            f"expected true or false, got {tied!r:.40}")
        mapping = {
            "name": (self.name or self.cfg.get("_name_or_path") or self.path.parent.name
                     or "hf-model"),
            "mlp": Mlp.SWIGLU.value if gated else Mlp.GELU.value,
            "tied_embeddings": tied,
            "bias": bias,
            "norm": (Norm.RMSNORM if rms else Norm.LAYERNORM).value,
            "position": position.value,
            "embedding_norm": mt == "bloom",
            "dropout": self._dropout(),
            **values,
        }
        mapping.update(self._family(mt, values))
        self._local_attention(mapping)
        self._reject_unknown(attn_config)
        return from_mapping(mapping, "model")

    def _dropout(self) -> bool:
        attn_config = self.text.get("attn_config")
        nested = attn_config if isinstance(attn_config, dict) else {}
        rates = [self.get(k) for k in _DROPOUT_KEYS if k in self.text]
        rates += [nested[k] for k in _DROPOUT_KEYS if k in nested]
        return any(isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0
                   for r in rates)

    def _family(self, mt: str, values: dict) -> dict:
        """What a family's modelling code adds beyond the common keys."""
        out: dict = {}
        if mt in {"qwen3", "qwen3_moe"}:
            out["qk_norm"] = True
        if mt in {"deepseek_v2", "deepseek_v3"}:
            out.update(self._deepseek(values))
        elif mt == "qwen3_moe":
            out["moe_layer_step"] = self.whole("decoder_sparse_step", 1)
            dense = self.get("mlp_only_layers", [])
            if not isinstance(dense, list) or dense != list(range(len(dense))):
                raise SpecError(self.where("mlp_only_layers"), f"{dense!r:.60}: only the "
                                "first k layers may be dense (a list 0, 1, ..., k-1)")
            out["first_dense_layers"] = len(dense)
        elif mt == "gpt_oss":
            out.update(router_bias=True, attention_sinks=True,
                       activation_clamp=bool(self.get("swiglu_limit")))
            if self.get("experts_per_token") not in (None, values.get("top_k")):
                raise SpecError(self.where("experts_per_token"), "differs from "
                                "num_experts_per_tok")
        elif mt == "llama4":
            out.update(self._llama4(values))
        return out

    def _deepseek(self, values: dict) -> dict:
        """DeepSeek-V2/V3 (``modeling_deepseek.py``): MLA, DeepSeekMoE with shared experts,
        dense first layers, node-limited routing, MTP modules."""
        if self.whole("moe_layer_freq", 1) != 1:
            raise SpecError(self.where("moe_layer_freq"), "only 1 (every layer after "
                            "first_k_dense_replace is MoE) is modelled")
        nope, rope = self.whole("qk_nope_head_dim"), self.whole("qk_rope_head_dim")
        if nope is None or rope is None or self.whole("kv_lora_rank") is None:
            raise SpecError(self.where("kv_lora_rank"), "DeepSeek configs need kv_lora_rank, "
                            "qk_nope_head_dim and qk_rope_head_dim")
        return {
            "head_dim": nope + rope,
            "kv_heads": values["heads"],
            "q_lora_rank": self.whole("q_lora_rank", 0),
            "kv_lora_rank": self.whole("kv_lora_rank"),
            "qk_rope_head_dim": rope,
            "v_head_dim": self.whole("v_head_dim", nope),
            "shared_experts": self.whole("n_shared_experts", 0),
            "first_dense_layers": self.whole("first_k_dense_replace", 0),
            "expert_groups": self.whole("n_group", 1),
            "expert_group_limit": self.whole("topk_group", 0),
            "mtp_layers": self.whole("num_nextn_predict_layers", 0),
            # noaux_tc routing adds a per-expert bias to the scores (e_score_correction_bias)
            "router_bias": self.text.get("topk_method") == "noaux_tc",
        }

    def _llama4(self, values: dict) -> dict:
        """Llama 4 (``modeling_llama4.py``): routed experts of ``intermediate_size`` plus one
        shared expert of the same width on MoE layers, dense layers of
        ``intermediate_size_mlp``; chunked attention on the rotary layers, global on the
        NoPE ones."""
        step = self.whole("interleave_moe_layer_step", 1)
        if step < 1:
            raise SpecError(self.where("interleave_moe_layer_step"), f"expected 1 or more, got {step}")
        layers = values["layers"]
        listed = self.get("moe_layers")
        expected = list(range(step - 1, layers, step))
        if listed is not None and listed != expected:
            raise SpecError(self.where("moe_layers"), f"{listed!r:.60} is not every "
                            f"{step}-th layer ({expected[:4]}...)")
        out = {"moe_layer_step": step, "shared_experts": 1,
               "moe_ffn_hidden": values["ffn_hidden"],
               "ffn_hidden": self.whole("intermediate_size_mlp", values["ffn_hidden"]),
               "vision_params": _llama4_vision_params(self._object("vision_config"),
                                                      values["hidden"], self.path)}
        chunk = self.whole("attention_chunk_size", 0)
        if chunk:
            # Empty no_rope_layers: every no_rope_layer_interval-th layer is NoPE (default 4,
            # Llama4TextConfig), and NoPE layers attend globally.
            no_rope = self.get("no_rope_layers", [])
            if not isinstance(no_rope, list):
                raise SpecError(self.where("no_rope_layers"), f"expected a list of 0/1 flags, "
                                f"got {shown(no_rope)}")
            if no_rope:
                every = _period([not bool(x) for x in no_rope], self.where("no_rope_layers"))
            else:
                every = self.whole("no_rope_layer_interval", 4)
            out.update(local_attention=LocalAttention.CHUNKED.value, local_window=chunk,
                       global_attention_every=every)
        return out

    def _local_attention(self, mapping: dict) -> None:
        """Sliding windows: on every layer (Mistral, Mixtral), or on the layers that
        ``layer_types`` marks (gpt-oss); Qwen's window only with ``use_sliding_window``."""
        if mapping.get("local_attention"):
            return
        window = self.whole("sliding_window", 0)
        use = self.get("use_sliding_window", True)
        self.used.add("max_window_layers")
        if not window or not use:
            return
        types = self.get("layer_types")
        if types is not None:
            if not isinstance(types, list) or len(types) != mapping["layers"]:
                raise SpecError(self.where("layer_types"), f"expected a list of "
                                f"{mapping['layers']} layer types, got {types!r:.60}")
            unknown = [t for t in types if t not in ("sliding_attention", "full_attention")]
            if unknown:
                raise SpecError(self.where("layer_types"), f"unknown layer type "
                                f"{shown(unknown[0])} (expected sliding_attention or "
                                "full_attention)")
            flags = [t == "full_attention" for t in types]
            every = _period(flags, self.where("layer_types"))
        else:
            every = 0
        mapping.update(local_attention=LocalAttention.SLIDING.value, local_window=window,
                       global_attention_every=every)

    def _reject_unknown(self, attn_config: dict) -> None:
        for key in self.text:
            if key not in self.used and key not in IRRELEVANT_KEYS:
                raise SpecError(self.where(key), "not understood: this key may change the "
                                "architecture, and the simulator does not model it")
        if self.text is not self.cfg:
            for key in self.cfg:
                if key not in self.used and key not in IRRELEVANT_KEYS:
                    raise SpecError(f"model ({self.path.name}: {key})", "not understood")
        for key in attn_config:
            if key not in {"alibi", "expansion_ratio", *_DROPOUT_KEYS} and key not in IRRELEVANT_KEYS:
                raise SpecError(f"model ({self.path.name}: attn_config.{key})", "not understood")


_DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                 "dropout", "activation_dropout", "attention_probs_dropout_prob",
                 "hidden_dropout_prob", "emb_pdrop", "projector_dropout")
"""Dropout rates: any above 0 means the layers keep dropout masks."""
_GATED_ACTIVATIONS = {"silu", "swish", "swiglu", "geglu"}
_KNOWN_ACTIVATIONS = _GATED_ACTIVATIONS | {
    # transformers src/transformers/activations.py, ACT2CLS keys (v4.5x)
    "gelu", "gelu_10", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh",
    "gelu_python_tanh", "gelu_accurate", "laplace", "leaky_relu", "linear", "mish",
    "quick_gelu", "relu", "relu2", "relu6", "sigmoid", "tanh", "prelu", "xielu", "hardswish",
    "sqrtsoftplus"}
_GATED_FAMILIES = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v2",
                   "deepseek_v3", "gpt_oss", "llama4"}
_LEARNED_POSITIONS = {"gpt2", "gpt_bigcode", "opt", "gptj"}


def _period(is_global: list[bool], where: str) -> int:
    """n such that layer i is global exactly when (i + 1) % n == 0 (0: none is global)."""
    if not any(is_global):
        return 0
    n = is_global.index(True) + 1
    if all(flag == ((i + 1) % n == 0) for i, flag in enumerate(is_global)):
        return n
    raise SpecError(where, "global layers are not every n-th layer; only periodic patterns "
                    "are modelled")


def _llama4_vision_params(v: dict, text_hidden: int, path: Path) -> int:
    """Llama 4's vision encoder, pixel-shuffle adapter and projector (``modeling_llama4.py``:
    unfold patch embedding without bias, class and position embeddings, pre/post LayerNorms,
    ViT layers with biased attention and GeLU MLP, a two-GEMM adapter, a linear projector)."""
    def whole(key: str) -> int:
        return _whole(v.get(key), f"model ({path.name}: vision_config.{key})")

    h, inner, layers = whole("hidden_size"), whole("intermediate_size"), whole("num_hidden_layers")
    patch, image, channels = whole("patch_size"), whole("image_size"), whole("num_channels")
    proj_in, proj_out = whole("projector_input_dim"), whole("projector_output_dim")
    if v.get("multi_modal_projector_bias"):
        raise SpecError(f"model ({path.name}: vision_config.multi_modal_projector_bias)",
                        "a biased projector is not modelled")
    positions = (image // patch) ** 2 + 1
    embed = channels * patch * patch * h + h + positions * h + 2 * 2 * h
    layer = 4 * (h * h + h) + 2 * 2 * h + (h * inner + inner) + (inner * h + h)
    adapter = inner * proj_in + proj_out * proj_out
    return embed + layers * layer + adapter + whole("vision_output_dim") * text_hidden


def _whole(value: object, where: str) -> int:
    """A count from config.json: a whole number (2.9 layers is a typo)."""
    return whole_number(value, where, "a whole number")


def bundled_config(name: str) -> Path:
    """The bundled config.json of an HF preset."""
    return Path(str(resources.files("clustersim.workloads").joinpath("hf_configs", HF_PRESETS[name])))


def preset_names() -> tuple[str, ...]:
    return tuple(PRESETS) + tuple(HF_PRESETS)


def resolve(value: object, base_dir: Path | None = None, path: str = "model") -> TransformerSpec:
    """A model from a preset name, an inline mapping, or a path to a ``config.json``."""
    if isinstance(value, Mapping):
        return from_mapping(value, path)
    if isinstance(value, str):
        if value in PRESETS:
            return PRESETS[value]
        if value in HF_PRESETS:
            return from_hf_config(bundled_config(value), value)
        candidate = Path(value).expanduser()
        if base_dir is not None and not candidate.is_absolute():
            candidate = base_dir / candidate
        if candidate.is_dir():
            candidate = candidate / "config.json"
        if candidate.suffix == ".json" or candidate.exists():
            if not candidate.exists():
                raise SpecError(path, f"no such file: {candidate}")
            return from_hf_config(candidate)
        raise SpecError(path, f"unknown preset {value!r}{did_you_mean(value, preset_names())} "
                        f"(expected one of {', '.join(preset_names())}, an inline mapping, or a "
                        "path to a Hugging Face config.json)")
    raise SpecError(path, f"expected a preset name, a mapping or a path, got {value!r}")
