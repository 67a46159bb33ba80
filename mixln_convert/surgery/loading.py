"""Load a model or tokenizer from any checkpoint this tool reads: an HF folder (plain LLaMA
or Mix-LN) or a .gguf file, through the one validated :class:`~mixln_convert.io.loader.Checkpoint`."""

import torch

from ..io.loader import open_checkpoint


def load_tokenizer(path):
    """The tokenizer of the checkpoint at ``path`` (loaded once per process)."""
    return open_checkpoint(path).tokenizer


def load_model(path, dtype: torch.dtype | str | None = None, device: str | torch.device = "cpu"):
    """A causal LM from ``path`` in eval mode, its values checked. A GGUF is dequantized to
    float32 (unless ``dtype`` says otherwise) once per process; every call returns a fresh copy."""
    return open_checkpoint(path).model(dtype, device)
