"""Configuration of a Mix-LN LLaMA model (arXiv 2412.13795).

This file is copied beside every converted checkpoint so that plain transformers can load it
with ``trust_remote_code=True``: it may import only torch/transformers and its sibling
``modeling_mixln.py``.
"""

from huggingface_hub.dataclasses import strict
from transformers.models.llama.configuration_llama import LlamaConfig


@strict
class MixLNConfig(LlamaConfig):
    r"""A [`LlamaConfig`] whose first ``post_ln_layers`` decoder blocks are Post-LN.

    Args:
        post_ln_layers (`int`, defaults to 0):
            Number of leading blocks that are Post-LN; the remaining blocks are LLaMA's Pre-LN.
            0 is a plain Pre-LN model, ``num_hidden_layers`` a plain Post-LN one.
        alpha (`float`, *optional*):
            The ratio the layout was derived from (``post_ln_layers = floor(alpha * L)``);
            provenance only, the layout is ``post_ln_layers``.
        mixln_provenance (`dict`, *optional*):
            How the checkpoint was produced (source, strategy, calibration statistics...).
    """

    model_type = "mixln_llama"

    post_ln_layers: int = 0
    alpha: float | None = None
    mixln_provenance: dict | None = None

    def validate_architecture(self):
        super().validate_architecture()
        if not 0 <= self.post_ln_layers <= self.num_hidden_layers:
            raise ValueError(
                f"post_ln_layers={self.post_ln_layers} must lie in [0, num_hidden_layers={self.num_hidden_layers}]"
            )


__all__ = ["MixLNConfig"]
