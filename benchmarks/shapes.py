"""Published LLaMA-family shapes (the models' config.json values), built with random weights where a
benchmark needs a model of that size and cannot fetch it (this CPU machine reaches PyPI only, the GPU
machine nothing): a forward or training step costs the same whatever the weights hold.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                         max_position_embeddings=8192),
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048),
}


def random_model(shape: str, seed: int = 0, **overrides) -> LlamaForCausalLM:
    """``LlamaForCausalLM`` of a published shape with transformers' own random initialization."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**SHAPES[shape], **overrides})).eval()
