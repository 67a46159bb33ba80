"""The pair a heal runs: the converted checkpoint (the student) and the Pre-LN original it was converted
from (the teacher), checked to belong together, and their models (whole models share their common tail).
"""

from dataclasses import dataclass, field

import torch

from ..errors import MixLNError
from ..io.loader import open_checkpoint
from ..surgery.prefix import load_prefix, prefix_of
from ..surgery.shared_tail import load_pair
from .options import HealCommand

TEACHER = HealCommand.flag("teacher")


@dataclass
class Models:
    """The heal's models: each one's embeddings and first post_ln_layers blocks (``*_prefix``; the student's are
    trained), the whole models around those very blocks (``*_model``, None unless loaded), and the
    tensors outside the first post_ln_layers blocks the teacher keeps its own copies of (``unshared``: they differ)."""

    student_prefix: torch.nn.Module
    teacher_prefix: torch.nn.Module
    student_model: torch.nn.Module | None = None
    teacher_model: torch.nn.Module | None = None
    unshared: list[str] = field(default_factory=list)


def load_models(student_source, teacher_source, post_ln_layers: int, frozen: torch.dtype, device: str,
                whole: bool, share: bool = True) -> Models:
    """The pair's :class:`Models`, with ``whole`` the whole models too (sharing their tail with ``share``)."""
    arch = student_source.arch
    if not whole:
        student = load_prefix(student_source, arch, post_ln_layers, device=device)
        student.embed_tokens.requires_grad_(False)  # only the Post-LN blocks learn
        return Models(student, load_prefix(teacher_source, arch, post_ln_layers, frozen, device))
    student_model, teacher_model, unshared = load_pair(student_source, teacher_source, arch, post_ln_layers, frozen,
                                                       device, share)
    return Models(prefix_of(student_model, student_source, arch, post_ln_layers),
                  prefix_of(teacher_model, teacher_source, arch, post_ln_layers),
                  student_model, teacher_model, unshared)


def open_pair(converted, teacher):
    """The converted checkpoint and its teacher, refusing pairs that cannot be healed."""
    student_source = open_checkpoint(converted)
    config = student_source.config
    if not student_source.is_mixln:
        raise MixLNError(f"{converted}: not a Mix-LN checkpoint (model_type {config.get('model_type')!r}); "
                         "convert it first (mixln-convert convert)")
    if config.get("post_ln_layers", 0) == 0:
        raise MixLNError(f"{converted}: has no Post-LN layer (post_ln_layers 0); there is nothing to heal")
    teacher_source = open_checkpoint(teacher)
    if teacher_source.is_mixln:
        raise MixLNError(f"{TEACHER} {teacher}: a Mix-LN checkpoint; the teacher is the Pre-LN model {converted} "
                         "was converted from")
    family = teacher_source.arch
    if family.converted["model_type"] != config["model_type"]:  # its blocks would be run as another family's
        raise MixLNError(f"{TEACHER} {teacher}: a {family.name} checkpoint, but {converted} is a "
                         f"{config['model_type']} one; give the model it was converted from")
    def shape(config: dict, key: str):
        return config.get(key) or (config.get("num_attention_heads") if key == "num_key_value_heads" else None)

    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "vocab_size"):
        if shape(teacher_source.config, key) != shape(config, key):
            raise MixLNError(f"{TEACHER} {teacher}: {key} {shape(teacher_source.config, key)} differs from "
                             f"{converted}'s {shape(config, key)}; give the model it was converted from")
    return student_source, teacher_source


def same_tokenizer(student_source, teacher_source):
    """The converted model's tokenizer, after checking that the teacher reads text the same way."""
    tokenizer = student_source.tokenizer
    if teacher_source.tokenizer.get_vocab() != tokenizer.get_vocab():
        raise MixLNError(f"{TEACHER} {teacher_source.path}: its tokenizer differs from {student_source.path}'s; "
                         "give the model it was converted from")
    return tokenizer
