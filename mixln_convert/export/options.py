"""The export's settings (``mixln-convert export``: export/__init__.py). Torch-free."""

from dataclasses import dataclass

from ..errors import MixLNError
from ..options import Options
from ..schema import Choice, setting
from . import DEFAULT_GGUF_TYPE, GGUF_TYPES, TARGETS


@dataclass(frozen=True, kw_only=True)
class ExportOptions(Options):
    """``mixln-convert export``'s options (export/__init__.py): the target, and a GGUF's matrix type."""
    to: str = setting(kind=Choice(TARGETS), help="llama: a plain transformers folder (LlamaForCausalLM, "
                      "Qwen2ForCausalLM or Qwen3ForCausalLM: no remote code, no Mix-LN config keys; tokenizer files "
                      "carried over). gguf: one llama.cpp file OUT.gguf (LLaMA/Qwen2/Qwen3 tensor names and metadata, "
                      "tokenizer included).")
    tensor_type: str | None = setting(None, Choice(GGUF_TYPES), "With --to gguf: the matrices' type (norm gains and "
                                      "biases stay f32; a q8_0 matrix whose rows are no multiple of 32 is f16).",
                                      flag="--type", default_help=DEFAULT_GGUF_TYPE)

    def check_combination(self):
        to = self.flag("to")
        if self.to != "gguf" and self.tensor_type is not None:
            raise MixLNError(f"{self.flag('tensor_type')} {self.tensor_type}: only {to} gguf takes a tensor type; "
                             f"{to} {self.to} keeps the checkpoint's dtype")

    @property
    def gguf_type(self) -> str | None:
        """The GGUF matrices' type (default f16); None for a folder."""
        return (self.tensor_type or DEFAULT_GGUF_TYPE) if self.to == "gguf" else None
