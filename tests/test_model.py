import json

import pytest

from clustersim.hardware_specs import SpecError
from clustersim.workloads.layer_ops import model_flops_per_token
from clustersim.workloads.model import PRESETS
from clustersim.workloads.model_sources import from_hf_config, resolve


@pytest.mark.parametrize("name, published", [
    ("gpt3-175b", 174.6e9),      # Narayanan et al. SC'21, Table 1
    ("bloom-176b", 176.2e9),     # BigScience, arXiv 2211.05100
    ("llama3-8b", 8.03e9),       # Llama 3 Herd, arXiv 2407.21783, Table 3
    ("llama3-70b", 70.6e9),
    ("llama3-405b", 405.9e9),    # idem (405,853M parameters on the HF model card)
])
def test_parameter_counts_within_half_a_percent_of_published(name, published):
    assert PRESETS[name].parameters == pytest.approx(published, rel=0.005)


@pytest.mark.parametrize("name", ["megatron-1.7b", "megatron-18b", "megatron-145b", "megatron-1t"])
def test_megatron_family_matches_narayanan_eq2(name):
    # P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)), Narayanan et al. SC'21 eq. (2), plus the
    # final LayerNorm (2h) that the equation leaves out.
    m = PRESETS[name]
    l, h, v, s = m.layers, m.hidden, m.vocab, m.max_positions
    eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h))
    assert m.parameters == pytest.approx(eq2 + 2 * h, rel=1e-12)


def test_model_flops_match_narayanan_eq3_without_recompute():
    # eq. (3) with the recompute forward removed: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) per batch.
    m, s = PRESETS["gpt3-175b"], 2048
    l, h, v = m.layers, m.hidden, m.vocab
    expected = 72 * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert model_flops_per_token(m, s) == pytest.approx(expected, rel=1e-9)


def test_hf_config_import_matches_preset(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 128256, "hidden_act": "silu", "tie_word_embeddings": False,
           "rms_norm_eps": 1e-5}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert from_hf_config(path).parameters == PRESETS["llama3-8b"].parameters
    assert resolve(str(tmp_path)).parameters == PRESETS["llama3-8b"].parameters


def test_inline_model_errors_name_the_field():
    with pytest.raises(SpecError, match="model.kv_heads: 3 does not divide model.heads=8"):
        resolve({"layers": 2, "hidden": 128, "heads": 8, "kv_heads": 3, "vocab": 100})
    with pytest.raises(SpecError, match="model.layrs: unknown field"):
        resolve({"layrs": 2, "hidden": 128, "heads": 8, "vocab": 100})
    with pytest.raises(SpecError, match="unknown preset"):
        resolve("gpt5")
