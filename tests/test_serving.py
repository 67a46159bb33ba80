"""The Mix-LN remote code against the contract vLLM's (and SGLang's) Transformers backend documents for a
custom model (vLLM docs, models/supported_models.md, "Custom models" and "Writing custom models"):
config.json's auto_map names AutoModel; the customisation sits in the base model; kwargs reach the
attention from the model's caller; every attention module calls ALL_ATTENTION_FUNCTIONS (the backend
swaps its own function in there, once per attention module and forward); the base model sets
_supports_attention_backend; each attention module has its own layer_idx (the backend's KV cache is per
layer). Neither server runs here: the contract is checked as the backend uses it."""

import json

import pytest
import torch
from transformers import AttentionInterface, AutoConfig
from transformers.dynamic_module_utils import get_class_from_dynamic_module
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tiny import TINY_CONFIG, make_tiny_llama

PROBE = "mixln_serving_probe"


@pytest.fixture(scope="module")
def calls():
    """An attention function registered as a backend registers its own: every call recorded, then SDPA."""
    seen = []

    def probe(module, query, key, value, attention_mask, **kwargs):
        seen.append((module, kwargs.get("probe_token")))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(PROBE, probe)
    return seen


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("layout", [{"alpha": 0.5}, {"layout": "lns"}])
def test_the_remote_code_meets_the_transformers_backend_contract(family, layout, calls, tiny_convert, tmp_path):
    source = make_tiny_llama(tmp_path / family, family=family)
    folder = tiny_convert(source, "converted", **layout)
    config = json.loads((folder / "config.json").read_text())
    assert "AutoModel" in config["auto_map"], config["auto_map"]  # the backend loads the base model by it
    # the base model as the backend loads it: from the remote code saved beside the weights
    base_class = get_class_from_dynamic_module(config["auto_map"]["AutoModel"], folder)
    assert base_class._supports_attention_backend is True
    model_config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    model = base_class.from_pretrained(folder, config=model_config, trust_remote_code=True).eval()
    model.set_attn_implementation(PROBE)
    attention = [m for m in model.modules() if m.__class__.__name__.endswith("Attention")]
    assert len(attention) == TINY_CONFIG["num_hidden_layers"]
    assert sorted(m.layer_idx for m in attention) == list(range(len(attention)))  # unique, one per layer
    calls.clear()
    with torch.no_grad():
        model(torch.arange(3, 19).unsqueeze(0), probe_token="from-the-caller")
    # each attention module once per forward, each given the caller's kwargs
    assert [module for module, _ in calls] == attention
    assert {token for _, token in calls} == {"from-the-caller"}
    # the layout is the base model's, not the causal LM head's: the customised blocks sit under it
    assert any(getattr(m, "is_post_ln", False) for m in model.modules()) == ("alpha" in layout)
