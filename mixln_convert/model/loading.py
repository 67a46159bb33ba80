"""Load a model or tokenizer from any checkpoint this tool reads: an HF folder (plain LLaMA
or Mix-LN) or a .gguf file."""

from pathlib import Path

import torch

from ..errors import MixLNError


def _split(path) -> tuple[Path, dict]:
    path = Path(path)
    if not path.exists():
        raise MixLNError(f"{path}: no such checkpoint")
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, {"gguf_file": path.name}
    if path.is_dir() and (path / "config.json").is_file():
        return path, {}
    raise MixLNError(f"{path}: expected a checkpoint folder with config.json, or a .gguf file")


def load_tokenizer(path):
    from transformers import AutoTokenizer

    folder, kwargs = _split(path)
    try:
        return AutoTokenizer.from_pretrained(folder, **kwargs)
    except (OSError, ValueError) as e:
        raise MixLNError(f"{path}: cannot load its tokenizer ({str(e).splitlines()[0]})") from None


def load_model(path, dtype: torch.dtype | str | None = None, device: str | torch.device = "cpu"):
    """A causal LM from ``path`` in eval mode; Mix-LN checkpoints load through this package's
    registered classes (no remote code needed)."""
    from transformers import AutoModelForCausalLM

    from . import register  # noqa: F401  (registers the Mix-LN classes with the Auto* factories)

    folder, kwargs = _split(path)
    if kwargs:
        dtype = dtype or torch.float32  # GGUF is dequantized; float32 unless asked otherwise
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or "auto", **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise MixLNError(f"{path}: cannot load the model ({str(e).splitlines()[0]})") from None
    if kwargs:  # GGUF weights arrive dequantized: forget the quantizer, or save_pretrained refuses the model
        model.hf_quantizer = None
        del model.config.quantization_config
    return model.to(device).eval()
