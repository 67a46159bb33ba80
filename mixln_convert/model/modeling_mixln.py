"""Mix-LN LLaMA: Post-LN in the first ``config.post_ln_layers`` blocks, Pre-LN in the rest.

Built on transformers' LLaMA classes: attention, rotary embeddings, KV cache and the
SDPA/eager/flash dispatch are LLaMA's own; only the block's normalization order differs.

    Pre-LN  (LLaMA):  h = x + A(N_in(x));       out = h + M(N_pa(h))
    Post-LN:          h = N_pa(x + A(x));        out = N_pf(h + M(h))

This file is copied beside every converted checkpoint (``trust_remote_code=True`` loading),
so it imports only torch, transformers and its sibling configuration file.
"""

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    LlamaPreTrainedModel,
    LlamaRMSNorm,
)

from .configuration_mixln import MixLNConfig


class MixLNDecoderLayer(LlamaDecoderLayer):
    """A LLaMA decoder layer that is Post-LN when ``layer_idx < config.post_ln_layers``."""

    def __init__(self, config: MixLNConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.is_post_ln = layer_idx < config.post_ln_layers
        if self.is_post_ln:
            # A Post-LN block normalizes after each residual add: no input norm, one more output norm.
            del self.input_layernorm
            self.post_feedforward_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
        if not self.is_post_ln:
            return super().forward(hidden_states, **kwargs)
        attn_output, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states = self.post_attention_layernorm(hidden_states + attn_output)
        return self.post_feedforward_layernorm(hidden_states + self.mlp(hidden_states))


class MixLNPreTrainedModel(LlamaPreTrainedModel):
    config_class = MixLNConfig
    config: MixLNConfig
    _no_split_modules = ["MixLNDecoderLayer"]
    _can_record_outputs = {**LlamaPreTrainedModel._can_record_outputs, "hidden_states": MixLNDecoderLayer}


def _legacy_checkpointing(config) -> bool:
    """A config's legacy ``gradient_checkpointing: true``. transformers applies it in the first
    post_init() and deletes it from the config; here that is the throwaway LLaMA layers built by
    super().__init__, so it is read first and applied to the Mix-LN layers afterwards."""
    return bool(getattr(config, "gradient_checkpointing", False))


def enable_checkpointing(model, kwargs: dict | None = None) -> None:
    """transformers' activation checkpointing of ``model``'s blocks, with ``kwargs`` for torch's checkpoint."""
    # transformers renamed it activation_checkpointing_enable (the old name warns); older 5.x has only the old
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)(kwargs)


class MixLNModel(MixLNPreTrainedModel, LlamaModel):
    def __init__(self, config: MixLNConfig):
        checkpointing = _legacy_checkpointing(config)
        super().__init__(config)
        self.layers = nn.ModuleList(MixLNDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.post_init()
        if checkpointing:
            enable_checkpointing(self)


class MixLNForCausalLM(MixLNPreTrainedModel, LlamaForCausalLM, GenerationMixin):
    def __init__(self, config: MixLNConfig):
        checkpointing = _legacy_checkpointing(config)
        super().__init__(config)
        self.model = MixLNModel(config)
        # post_init() adds the children's block classes to _no_split_modules; the LlamaModel that
        # super() built (replaced above) left LlamaDecoderLayer there, which FSDP's auto-wrap then
        # looks for in vain.
        self._no_split_modules = set(MixLNPreTrainedModel._no_split_modules)
        self.post_init()
        if checkpointing:
            enable_checkpointing(self)


__all__ = ["MixLNDecoderLayer", "MixLNForCausalLM", "MixLNModel", "MixLNPreTrainedModel"]
