"""Configuration of a Mix-LN model (arXiv 2412.13795), or of a LayerNorm Scaling one
(arXiv 2502.05795), per family of ``architectures/``: the family's own config with the fields
of :class:`MixLNLayout`.

This file is copied beside every converted checkpoint so that plain transformers can load it
with ``trust_remote_code=True``: it may import only torch/transformers and its sibling
``modeling_mixln.py``.
"""

from dataclasses import dataclass

from huggingface_hub.dataclasses import strict
from transformers.models.llama.configuration_llama import LlamaConfig
from transformers.models.qwen2.configuration_qwen2 import Qwen2Config
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config


# A plain dataclass, not a PreTrainedConfig: as one it would bring PreTrainedConfig's defaults
# along and override the family's own (Qwen2Config's tie_word_embeddings false, for one).
@dataclass(kw_only=True, repr=False, eq=False)
class MixLNLayout:
    r"""The fields a family's config gains: its first ``post_ln_layers`` decoder blocks are Post-LN.

    Args:
        post_ln_layers (`int`, defaults to 0):
            Number of leading blocks that are Post-LN; the remaining blocks are the family's Pre-LN.
            0 is a plain Pre-LN model, ``num_hidden_layers`` a plain Post-LN one.
        layernorm_scaling (`bool`, defaults to `False`):
            LayerNorm Scaling (arXiv 2502.05795): every norm output of block ``l`` (counted from 1) is
            multiplied by ``1 / sqrt(l)``. Only for an all-Pre-LN layout (``post_ln_layers`` 0).
        alpha (`float`, *optional*):
            The ratio the layout was derived from (``post_ln_layers = floor(alpha * L)``);
            provenance only, the layout is ``post_ln_layers``.
        mixln_provenance (`dict`, *optional*):
            How the checkpoint was produced (source, strategy, calibration statistics...).
    """

    post_ln_layers: int = 0
    layernorm_scaling: bool = False
    alpha: float | None = None
    mixln_provenance: dict | None = None

    def validate_architecture(self):
        super().validate_architecture()
        if not 0 <= self.post_ln_layers <= self.num_hidden_layers:
            raise ValueError(
                f"post_ln_layers={self.post_ln_layers} must lie in [0, num_hidden_layers={self.num_hidden_layers}]"
            )
        if self.layernorm_scaling and self.post_ln_layers:
            raise ValueError(f"layernorm_scaling scales Pre-LN blocks' norms; post_ln_layers={self.post_ln_layers} "
                             "must be 0")


@strict
class MixLNConfig(MixLNLayout, LlamaConfig):
    """A [`LlamaConfig`] with the Mix-LN layout of [`MixLNLayout`]."""

    model_type = "mixln_llama"


@strict
class MixLNQwen2Config(MixLNLayout, Qwen2Config):
    """A [`Qwen2Config`] (Qwen2, Qwen2.5) with the Mix-LN layout of [`MixLNLayout`]."""

    model_type = "mixln_qwen2"


@strict
class MixLNQwen3Config(MixLNLayout, Qwen3Config):
    """A [`Qwen3Config`] with the Mix-LN layout of [`MixLNLayout`]."""

    model_type = "mixln_qwen3"


__all__ = ["MixLNConfig", "MixLNLayout", "MixLNQwen2Config", "MixLNQwen3Config"]
