"""Residual-stream statistics of the original Pre-LN model, for the calibrated conversion.

Only the embeddings and the first ``n`` blocks are loaded and run: that is all the statistics
of the first ``n`` layers depend on, so calibrating a 70B model costs a few of its layers.
"""

import torch
from tqdm.auto import tqdm

from ..architectures import Architecture


def load_prefix(source, arch: Architecture, num_layers: int, dtype=torch.float32):
    """transformers' ``LlamaModel`` holding the source's embeddings and first ``num_layers`` blocks."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaModel

    config = LlamaConfig.from_dict({**source.config, "num_hidden_layers": num_layers, "use_cache": False})
    model = LlamaModel(config)
    model.norm = torch.nn.Identity()  # the final norm is not part of the prefix: return the residual stream
    prefix = "model."
    wanted = [arch.embed] + [n for n in source.names() if (arch.layer_of(n) is not None and arch.layer_of(n) < num_layers)]
    state = {name.removeprefix(prefix): source.get(name).to(dtype) for name in wanted}
    model.load_state_dict(state, strict=False)
    missing = set(model.state_dict()) - set(state)
    if missing:
        raise KeyError(f"prefix weights missing: {sorted(missing)[:3]}")
    return model.to(dtype).eval()


def _token_rms(x: torch.Tensor) -> torch.Tensor:
    return x.float().pow(2).mean(-1).sqrt().flatten()


@torch.no_grad()
def residual_rms(model, blocks: torch.Tensor, batch_size: int = 4, progress: bool = True) -> dict:
    """Median per-token RMS of the residual stream of a prefix model (see :func:`load_prefix`).

    Returns ``{"input": [c_0 .. c_n], "mid": [m_0 .. m_{n-1}]}``: ``c_i`` at the input of
    block i (``c_n`` at the output of the last one), ``m_i`` after block i's attention add.
    The median is robust to the few outlier tokens whose residual RMS reaches the thousands.
    """
    layers = model.layers
    inputs = [[] for _ in range(len(layers) + 1)]
    mids = [[] for _ in layers]
    hooks = []
    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(lambda mod, args, i=i: inputs[i].append(_token_rms(args[0]))))
        hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(
            lambda mod, args, i=i: mids[i].append(_token_rms(args[0]))))
    hooks.append(layers[-1].register_forward_hook(lambda mod, args, out: inputs[-1].append(_token_rms(out))))
    try:
        for start in tqdm(range(0, len(blocks), batch_size), desc="calibrating", disable=not progress, leave=False):
            model(input_ids=blocks[start:start + batch_size])
    finally:
        for hook in hooks:
            hook.remove()
    median = lambda xs: torch.cat(xs).median().item()  # noqa: E731
    return {"input": [median(x) for x in inputs], "mid": [median(x) for x in mids]}
