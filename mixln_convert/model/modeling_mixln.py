"""Mix-LN models: Post-LN in the first ``config.post_ln_layers`` blocks, Pre-LN in the rest.

One set of classes per family of ``architectures/`` (LLaMA, Qwen2, Qwen3), each built on that
family's transformers classes: attention (Qwen2's q/k/v biases, Qwen3's per-head q/k norms),
MLP, rotary embeddings, KV cache and the SDPA/eager/flash dispatch are the family's own; only the
block's normalization order differs (:class:`MixLNBlock`, shared by every family).

    Pre-LN  (LLaMA):  h = x + A(N_in(x));       out = h + M(N_pa(h))
    Post-LN:          h = N_pa(x + A(x));        out = N_pf(h + M(h))
    LNS (block l):    h = x + A(N_in(x) / sqrt(l));  out = h + M(N_pa(h) / sqrt(l)),  l = layer index + 1

(LNS: LayerNorm Scaling, arXiv 2502.05795, with ``config.layernorm_scaling``; every block Pre-LN.)

This file is copied beside every converted checkpoint (``trust_remote_code=True`` loading),
so it imports only torch, transformers and its sibling configuration file.
"""

import math

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2ForCausalLM, Qwen2Model
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM, Qwen3Model

from .configuration_mixln import MixLNConfig, MixLNLayout, MixLNQwen2Config, MixLNQwen3Config


class MixLNBlock:
    """A family's Pre-LN decoder layer, the class after this one among a block's bases, made
    Post-LN when ``layer_idx < config.post_ln_layers``, and with its norms' outputs scaled by
    ``1 / sqrt(layer_idx + 1)`` with ``config.layernorm_scaling``."""

    def __init__(self, config: MixLNLayout, layer_idx: int):
        super().__init__(config, layer_idx)
        self.is_post_ln = layer_idx < config.post_ln_layers
        if self.is_post_ln:
            # A Post-LN block normalizes after each residual add: no input norm, one more output norm
            # (of the family's own RMSNorm class).
            del self.input_layernorm
            norm_class = type(self.post_attention_layernorm)
            self.post_feedforward_layernorm = norm_class(config.hidden_size, eps=config.rms_norm_eps)
        # applied here, not in a norm subclass: transformers may swap a norm's forward for a hub kernel
        self.norm_scale = 1 / math.sqrt(layer_idx + 1) if config.layernorm_scaling else None

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:
        if self.norm_scale is not None:  # LNS: the family's Pre-LN block, each norm's output scaled
            attn_output, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states) * self.norm_scale,
                                            **kwargs)
            hidden_states = hidden_states + attn_output
            return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states) * self.norm_scale)
        if not self.is_post_ln:
            return super().forward(hidden_states, **kwargs)
        attn_output, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states = self.post_attention_layernorm(hidden_states + attn_output)
        return self.post_feedforward_layernorm(hidden_states + self.mlp(hidden_states))


def _legacy_checkpointing(config) -> bool:
    """A config's legacy ``gradient_checkpointing: true``. transformers applies it in the first
    post_init() and deletes it from the config; here that is the family's throwaway layers built by
    super().__init__, so it is read first and applied to the Mix-LN layers afterwards."""
    return bool(getattr(config, "gradient_checkpointing", False))


def enable_checkpointing(model, kwargs: dict | None = None) -> None:
    """transformers' activation checkpointing of ``model``'s blocks, with ``kwargs`` for torch's checkpoint."""
    # transformers renamed it activation_checkpointing_enable (the old name warns); older 5.x has only the old
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)(kwargs)


def _declare_blocks(cls, block_class: type) -> None:
    """Tell transformers that a family's Mix-LN model or causal LM is made of ``block_class``
    blocks, not of the family's decoder layers: the blocks FSDP wraps whole, and those whose
    outputs are recorded as hidden states."""
    cls._no_split_modules = [block_class.__name__]
    cls._can_record_outputs = {**cls._can_record_outputs, "hidden_states": block_class}


class MixLNDecoder:
    """A family's decoder, the model class after this one among the bases, made of ``block_class``
    blocks; its config is ``config_class``."""

    config_class: type
    block_class: type

    def __init_subclass__(cls, **kwargs):
        _declare_blocks(cls, cls.block_class)
        super().__init_subclass__(**kwargs)

    def __init__(self, config: MixLNLayout):
        checkpointing = _legacy_checkpointing(config)
        super().__init__(config)
        self.layers = nn.ModuleList(self.block_class(config, i) for i in range(config.num_hidden_layers))
        self.post_init()
        if checkpointing:
            enable_checkpointing(self)


class MixLNCausalLM:
    """A family's causal LM, the class after this one among the bases, over a ``decoder_class``
    decoder, whose config and blocks are its own."""

    decoder_class: type

    def __init_subclass__(cls, **kwargs):
        cls.config_class = cls.decoder_class.config_class
        _declare_blocks(cls, cls.decoder_class.block_class)
        super().__init_subclass__(**kwargs)

    def __init__(self, config: MixLNLayout):
        checkpointing = _legacy_checkpointing(config)
        super().__init__(config)
        self.model = self.decoder_class(config)
        # post_init() adds the children's block classes to _no_split_modules; the family's model that
        # super() built (replaced above) left its own decoder layer there, which FSDP's auto-wrap then
        # looks for in vain.
        self._no_split_modules = set(type(self)._no_split_modules)
        self.post_init()
        if checkpointing:
            enable_checkpointing(self)


# Each family: its decoder layer with the Mix-LN layout, its base model, its causal LM.
class MixLNDecoderLayer(MixLNBlock, LlamaDecoderLayer):
    """A LLaMA decoder layer with the Mix-LN layout (:class:`MixLNBlock`)."""


class MixLNQwen2DecoderLayer(MixLNBlock, Qwen2DecoderLayer):
    """A Qwen2 decoder layer (q/k/v biases) with the Mix-LN layout (:class:`MixLNBlock`)."""


class MixLNQwen3DecoderLayer(MixLNBlock, Qwen3DecoderLayer):
    """A Qwen3 decoder layer (per-head q/k norms in the attention) with the Mix-LN layout (:class:`MixLNBlock`)."""


class MixLNModel(MixLNDecoder, LlamaModel):
    config_class, block_class = MixLNConfig, MixLNDecoderLayer


class MixLNQwen2Model(MixLNDecoder, Qwen2Model):
    config_class, block_class = MixLNQwen2Config, MixLNQwen2DecoderLayer


class MixLNQwen3Model(MixLNDecoder, Qwen3Model):
    config_class, block_class = MixLNQwen3Config, MixLNQwen3DecoderLayer


class MixLNForCausalLM(MixLNCausalLM, LlamaForCausalLM, GenerationMixin):
    decoder_class = MixLNModel


class MixLNQwen2ForCausalLM(MixLNCausalLM, Qwen2ForCausalLM, GenerationMixin):
    decoder_class = MixLNQwen2Model


class MixLNQwen3ForCausalLM(MixLNCausalLM, Qwen3ForCausalLM, GenerationMixin):
    decoder_class = MixLNQwen3Model


# (config, base model, causal LM) of each family: what register.py registers with the Auto classes
FAMILIES = (
    (MixLNConfig, MixLNModel, MixLNForCausalLM),
    (MixLNQwen2Config, MixLNQwen2Model, MixLNQwen2ForCausalLM),
    (MixLNQwen3Config, MixLNQwen3Model, MixLNQwen3ForCausalLM),
)

__all__ = ["MixLNBlock", "MixLNDecoderLayer", "MixLNForCausalLM", "MixLNModel", "MixLNQwen2DecoderLayer",
           "MixLNQwen2ForCausalLM", "MixLNQwen2Model", "MixLNQwen3DecoderLayer", "MixLNQwen3ForCausalLM",
           "MixLNQwen3Model"]
