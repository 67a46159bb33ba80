"""The first blocks of a checkpoint as a model of their own, read tensor by tensor: calibration and
healing need only the embeddings and the first blocks, a few layers of a 70B model, not the whole of it.
"""

import torch


def prefix_names(source, arch, num_layers: int) -> list[str]:
    """Checkpoint names of the embeddings and the first ``num_layers`` blocks."""
    return [arch.embed] + [n for n in source.names() if arch.layer_of(n) is not None and arch.layer_of(n) < num_layers]


def _prefix_model(source, num_layers: int):
    """An empty (meta) base model of the source's family (its Mix-LN model for a converted source) of
    ``num_layers`` blocks whose final norm is the identity, so that it returns the residual stream."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    from ..model import register  # noqa: F401  (the Mix-LN classes, for a converted source)

    source.check_loadable()
    fields = {**source.config, "num_hidden_layers": num_layers, "use_cache": False}
    if fields.get("layer_types"):  # the attention kind of each block (Qwen's): the first blocks' only
        fields["layer_types"] = fields["layer_types"][:num_layers]
    config = AutoConfig.for_model(**fields)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):  # no time spent initializing weights that are loaded next
        model = MODEL_MAPPING[type(config)](config)
    model.norm = torch.nn.Identity()
    return model


def load_prefix(source, arch, num_layers: int, dtype=torch.float32, device="cpu"):
    """:func:`_prefix_model` holding the source's embeddings and first ``num_layers`` blocks. Attention is
    SDPA: causal without an explicit mask, also in manual block calls."""
    model = _prefix_model(source, num_layers)
    state = {name.removeprefix(arch.decoder + "."): source.get(name).to(dtype)
             for name in prefix_names(source, arch, num_layers)}
    model.load_state_dict(state, strict=True, assign=True)
    model.rotary_emb = type(model.rotary_emb)(config=model.config)  # rebuild its buffers off the meta device
    return model.to(device).eval()


def prefix_of(whole, source, arch, num_layers: int):
    """The embeddings and first ``num_layers`` blocks of ``whole`` (the causal LM of ``source``) as
    :func:`load_prefix` returns them, made of the very same modules: training one trains the other."""
    model, decoder = _prefix_model(source, num_layers), arch.decoder_of(whole)
    model.embed_tokens = decoder.embed_tokens
    model.layers = arch.blocks_of(whole)[:num_layers]
    model.rotary_emb = decoder.rotary_emb
    return model.eval()
