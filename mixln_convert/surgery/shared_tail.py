"""The converted model and its teacher as two whole models over one copy of what they share.

A conversion rewrites only the first ``post_ln_layers`` blocks, so a heal need not hold the
rest twice: the teacher's model is given the student's very Parameter objects for it. Sharing is
decided tensor by tensor at load time, on the values: a tail tensor the conversion did change
(``scratch``, ``--dtype bf16`` of a float32 source, a teacher of another depth) stays the teacher's
own, so the two models compute exactly what they would apart, only with more memory.
"""

import torch

from ..errors import MixLNError


def load_pair(student_source, teacher_source, arch, post_ln_layers: int, dtype=torch.float32, device="cpu",
              share: bool = True):
    """``(student, teacher, unshared)``: whole causal LMs in eval mode, the student's first ``post_ln_layers`` blocks
    float32 and trainable, every other tensor frozen in ``dtype``; the teacher holds the student's own
    Parameters wherever the two agree bit for bit, ``unshared`` names the frozen tensors it could not. Without
    ``share`` the teacher holds copies of its own (sharded models: each is a root of its own shards)."""

    def trained(name: str) -> bool:
        return arch.layer_of(name) is not None and arch.layer_of(name) < post_ln_layers

    teacher_names = set(teacher_source.names())
    student_state, teacher_state, shared, unshared = {}, {}, [], []
    for name in student_source.names():
        tensor = student_source.get(name)
        student_state[name] = tensor.to(device, torch.float32 if trained(name) else dtype)
        if trained(name) or name not in teacher_names or not share:
            continue
        original = teacher_source.get(name)
        if _equal(tensor, original):
            shared.append(name)
        else:
            teacher_state[name] = original.to(device, dtype)
            unshared.append(name)
    for name in teacher_names - set(shared) - set(teacher_state):
        teacher_state[name] = teacher_source.get(name).to(device, dtype)

    student = _whole_model(student_source, arch, student_state).requires_grad_(False)
    arch.blocks_of(student)[:post_ln_layers].requires_grad_(True)
    parameters = dict(student.named_parameters(remove_duplicate=False))
    teacher_state.update({name: parameters[name] for name in shared})  # Parameters: assigned as they are
    teacher = _whole_model(teacher_source, arch, teacher_state).requires_grad_(False)
    return student.to(device), teacher.to(device), unshared


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same values as the float32 they would be computed in apart."""
    if a.dtype != b.dtype:
        a, b = a.float(), b.float()
    return a.shape == b.shape and torch.equal(a, b)


def _whole_model(source, arch, state: dict):
    """The causal LM of ``source``'s config (the class transformers would load it as) holding the
    tensors of ``state`` (checkpoint names) as they are, not copied."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..model import register  # noqa: F401  (the Mix-LN classes, for a converted source)

    source.check_loadable()
    config = AutoConfig.for_model(**{**source.config, "use_cache": False})
    config._attn_implementation = "sdpa"
    with torch.device("meta"):  # no time spent initializing weights that are assigned next
        model = AutoModelForCausalLM.from_config(config)
    missing = [name for name in model.load_state_dict(state, strict=False, assign=True).missing_keys
               if not (config.tie_word_embeddings and name == arch.lm_head)]  # tied: a saved head is the embeddings
    if missing:
        raise MixLNError(f"{source.path}: lacks tensor {missing[0]}")
    model.tie_weights()
    decoder = arch.decoder_of(model)
    decoder.rotary_emb = type(decoder.rotary_emb)(config=config)  # rebuild its buffers off the meta device
    return model.eval()
