"""Calibration of the Post-LN blocks of a converted model against the original Pre-LN model, on the
embeddings and first ``n`` blocks only: all the Post-LN blocks depend on (a few layers of a 70B model).

The conversion of block i (see :mod:`.plan`) needs four things:

- ``input_scale[i]``: the RMS of the residual stream entering the block; ``input_layernorm.weight /
  input_scale[i]`` is folded into the q/k/v input columns, so that they see what the Pre-LN norm gave.
- ``post_attention_gain[i]``: the gain of the Post-LN norm after the attention add.
- ``mid_scale[i]``: the RMS of that norm's output, folded with ``post_attention_layernorm.weight`` into gate/up.
- ``post_feedforward_gain[i]``: the gain of the norm after the MLP add -- the residual stream the
  next block (and, after the last Post-LN block, the Pre-LN blocks) receives.

A Post-LN block outputs every token at the norm's gain, where the original stream's scale
varies from token to token; the gains decide what the converted stream looks like. They are
fitted block by block on the converted model's own activations (so errors do not compound
unseen), each gain vector by per-channel least squares against the original stream. Unweighted
least squares lets the few tokens with massive activations (residual RMS in the thousands, in a
handful of channels) set those channels' gains, which keeps them massive after the Post-LN norm;
the later Pre-LN layers rely on them.
"""

import torch
from tqdm.auto import tqdm


def _unit(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a gain, as LlamaRMSNorm computes it."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _token_rms(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).mean(-1).sqrt()


def _fit_gain(unit_batches, target_batches) -> torch.Tensor:
    """Per-channel least squares: g_j = argmin sum_t (g_j u_tj - y_tj)^2, in closed form."""
    num = den = 0.0
    for u, y in zip(unit_batches, target_batches):
        num = num + (u * y).flatten(0, -2).sum(0)
        den = den + (u * u).flatten(0, -2).sum(0)
    return num / den.clamp_min(1e-12)


def _median_rms(batches) -> float:
    return torch.cat([_token_rms(x).flatten() for x in batches]).median().item()


@torch.no_grad()
def calibrate(prefix, windows: torch.Tensor, batch_size: int = 4, progress: bool = True) -> dict:
    """Fit the Post-LN conversion of every block of ``prefix``. Returns per-block lists: the four
    values of the module docstring and ``relative_error``, the mean per-token relative error of the
    converted stream after each block: what is left to heal."""
    eps = prefix.config.rms_norm_eps
    device = next(prefix.parameters()).device
    batches = [windows[s:s + batch_size].to(device) for s in range(0, len(windows), batch_size)]
    positions = [torch.arange(b.shape[1], device=device)[None] for b in batches]
    teacher = [prefix.embed_tokens(b).float() for b in batches]
    student = [t.clone() for t in teacher]
    rope = [prefix.rotary_emb(t, p) for t, p in zip(teacher, positions)]
    keys = ("input_scale", "post_attention_gain", "mid_scale", "post_feedforward_gain", "relative_error")
    stats = {k: [] for k in keys}

    def attention(layer, x, k):
        return layer.self_attn(hidden_states=x, attention_mask=None, position_embeddings=rope[k],
                               position_ids=positions[k])[0]

    for layer in tqdm(prefix.layers, desc="calibrating", disable=not progress, leave=False):
        g_in = layer.input_layernorm.weight.float()
        g_pa = layer.post_attention_layernorm.weight.float()
        # The original block, step by step.
        teacher_mid = [x + attention(layer, layer.input_layernorm(x), k) for k, x in enumerate(teacher)]
        teacher = [h + layer.mlp(layer.post_attention_layernorm(h)) for h in teacher_mid]
        # The converted block, on the converted stream.
        s = _median_rms(student)
        after_attn = [_unit(x + attention(layer, x * (g_in / s), k), eps) for k, x in enumerate(student)]
        g_mid = _fit_gain(after_attn, teacher_mid)
        mid = [g_mid * u for u in after_attn]
        m = _median_rms(mid)
        after_mlp = [_unit(h + layer.mlp(h * (g_pa / m)), eps) for h in mid]
        g_out = _fit_gain(after_mlp, teacher)
        student = [g_out * u for u in after_mlp]
        error = torch.cat([(_token_rms(x - y) / _token_rms(y)).flatten() for x, y in zip(student, teacher)])
        for key, value in zip(keys, (s, g_mid, m, g_out, error.mean().item())):
            stats[key].append(value)
    return stats
