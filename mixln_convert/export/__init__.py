"""``export()``: a checkpoint written as the plain model of its family, for tools that know nothing of
this package: a transformers folder (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``)
or a llama.cpp GGUF file.

What exports: a plain checkpoint (pruned or not), a Mix-LN checkpoint without Post-LN blocks (the
Pre-LN arm: ``post_ln_layers`` 0) and a LayerNorm Scaling one, whose 1/sqrt(l) is folded into its
blocks' norm gains (:mod:`.plain`). What does not: a Mix-LN checkpoint with Post-LN blocks, since no
plain architecture computes Norm(x + F(x)).

This module imports neither torch nor transformers: the CLI's --help and bad options answer at once.
"""

import sys
import types
from pathlib import Path

TARGETS = ("llama", "gguf")  # --to: a plain transformers folder, a llama.cpp file
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")  # --type of a GGUF's matrices (vectors stay f32, as llama.cpp writes them)
DEFAULT_GGUF_TYPE = "f16"


def export(ckpt, out, *, to: str, type: str | None = None, force: bool = False, progress: bool = True) -> Path:
    """Write the checkpoint ``ckpt`` (HF folder, .gguf or Hub model name) as a plain model at ``out``:
    ``to="llama"`` a transformers folder, ``to="gguf"`` one .gguf file of tensor type ``type`` (default
    f16). Everything is checked before any work; ``ckpt`` is never written, ``out`` appears only when
    complete (an existing one is replaced only with ``force``). Returns ``out``."""
    from ..io.paths import check_destination, checkpoint_path
    from ..runtime import map_large_allocations
    from .options import ExportOptions  # which imports this module's choices

    map_large_allocations()
    tensor_type = ExportOptions(to=to, tensor_type=type).gguf_type  # each checked, and the two together
    src = checkpoint_path(ckpt, "CKPT")
    inputs = {"CKPT": src}
    if to == "llama":
        check_destination(out, inputs, force, flag="OUT")
    else:
        from .gguf import check_gguf_destination, write_gguf

        check_gguf_destination(out, inputs, force)
    from ..io.loader import open_checkpoint
    from .plain import plain_architecture, write_plain

    source = open_checkpoint(src)
    arch = plain_architecture(source)
    if source.path.is_file():  # a GGUF's tokenizer is transformers' reading of its metadata: both outputs carry it
        source.tokenizer  # noqa: B018  (built and checked now, before any work)
    if to == "llama":
        write_plain(source, arch, out, inputs, force=force, progress=progress)
    else:
        write_gguf(source, arch, out, tensor_type, inputs, force=force, progress=progress)
    return Path(out)


class _CallableModule(types.ModuleType):
    """This package, callable as :func:`export`: once any of its modules is imported, Python binds the package to
    ``mixln_convert.export``, so ``from mixln_convert import export`` gives the package, not the function."""

    def __call__(self, *args, **kwargs) -> Path:
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["DEFAULT_GGUF_TYPE", "GGUF_TYPES", "TARGETS", "export"]
