"""Calibration of the Post-LN blocks of a converted model against the original Pre-LN model.

Only the embeddings and the first ``n`` blocks are loaded and run: that is all the Post-LN
blocks depend on, so calibrating a 70B model costs a few of its layers.

The conversion of block i (see :mod:`.plan`) needs four things:

- ``input_scale[i]``: the RMS of the residual stream entering the block. The block's q/k/v
  projections get ``input_layernorm.weight / input_scale[i]`` folded into their input columns,
  so that they see what the Pre-LN norm gave them.
- ``post_attention_gain[i]``: the gain of the Post-LN norm after the attention add.
- ``mid_scale[i]``: the RMS of that norm's output, folded with ``post_attention_layernorm.weight``
  into gate/up.
- ``post_feedforward_gain[i]``: the gain of the norm after the MLP add -- the residual stream the
  next block (and, after the last Post-LN block, the Pre-LN blocks) receives.

A Post-LN block outputs every token at the norm's gain, where the original stream's scale
varies from token to token; the gains decide what the converted stream looks like. They are
fitted block by block on the converted model's own activations (so errors do not compound
unseen), each gain vector by per-channel least squares against the original stream. Unweighted
least squares lets the few tokens with massive activations (residual RMS in the thousands, in a
handful of channels) set those channels' gains, which keeps them massive after the Post-LN norm;
the later Pre-LN layers rely on them. Every variant tried, with its perplexity: docs/measurements.md.

What no gain can restore is the attention sink of a sequence that starts with the BOS token, as
lm-evaluation-harness scores documents and chat templates begin: the original gives that
position a residual norm several times every other token's, which the later Pre-LN blocks read,
and a Post-LN block's output is capped at its gains. Its stream does not depend on any other
token, so after n Post-LN blocks it is one fixed vector in both models. ``sink[n - 1]`` is one
MLP neuron of block n (the first Pre-LN one), the least used on the calibration text, rewritten
to add exactly the difference at that vector and nothing elsewhere: its gate row separates the
BOS-at-0 input from every calibration token by a margin (hinge fit), so elsewhere the gate is
far below zero and SiLU gives 0.
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


# The sink neuron's gate at the BOS-at-0 input, and how far below zero, in units of that gate, it must
# stay on every calibration token: there it is then <= -20, SiLU gives ~4e-8, and the neuron adds 0.
SINK_GATE = 20.0
SINK_MARGIN = 1.0


def _separating_row(sink: torch.Tensor, others: torch.Tensor) -> tuple[torch.Tensor, float]:
    """A row w with ``w . sink = 1`` and ``w . x`` as far below zero as a squared hinge at -10 gets
    it for every ``x`` in ``others``; returns w and the achieved margin ``-max(w . x)``."""
    s, x = sink.double(), others.double()
    scale = x.pow(2).mean().sqrt()
    s, x = s / scale, x / scale  # a well-conditioned problem whatever the stream's scale
    base = s / s.dot(s)
    free = torch.zeros_like(s, requires_grad=True)

    def row():
        return base + free - (free @ s) / s.dot(s) * s  # w . sink stays 1

    optimizer = torch.optim.LBFGS([free], max_iter=500, line_search_fn="strong_wolfe")

    def loss():
        optimizer.zero_grad()
        value = torch.relu(x @ row() + 10.0).pow(2).mean() + 1e-6 * free.pow(2).sum()
        value.backward()
        return value

    with torch.enable_grad():
        optimizer.step(loss)
    w = row().detach()
    return w / scale, -(x @ w).max().item()


def _sink_neuron(layer, attend, stream, first_sink: int, sink_target: torch.Tensor) -> dict | None:
    """The neuron of Pre-LN block ``layer`` that turns the converted model's BOS-at-0 stream into
    the original's after this block, ``sink_target`` (see the module docstring). ``stream``: the
    converted calibration batches, those from ``first_sink`` on starting with BOS (``attend(layer,
    x, k)`` runs the attention of batch k). None when no gate row separates the sink's MLP input
    from every other calibration token's by ``SINK_MARGIN``."""
    mlp = layer.mlp
    mids, inputs = [], []
    for k, x in enumerate(stream):
        mids.append(x + attend(layer, layer.input_layernorm(x), k))
        inputs.append(layer.post_attention_layernorm(mids[-1]))
    mid, at_sink = mids[first_sink][0, 0], inputs[first_sink][0, 0].float()
    others = torch.cat([(x[:, 1:] if k >= first_sink else x).flatten(0, -2) for k, x in enumerate(inputs)]).float()
    use = torch.zeros(mlp.down_proj.weight.shape[1], device=others.device)
    for chunk in others.split(4096):
        use += (mlp.act_fn(mlp.gate_proj(chunk)) * mlp.up_proj(chunk)).abs().sum(0)
    neuron = (use * mlp.down_proj.weight.float().norm(dim=0)).argmin().item()
    gate_row, margin = _separating_row(at_sink, others)
    if margin < SINK_MARGIN:
        return None
    # as the other batches are computed (a matrix-vector product can round differently)
    batch = inputs[first_sink]
    old = (mlp.act_fn(mlp.gate_proj(batch)) * mlp.up_proj(batch))[0, 0, neuron]
    reached = mid + mlp(batch)[0, 0] - old * mlp.down_proj.weight[:, neuron]
    up_row = at_sink.double() / at_sink.double().dot(at_sink.double())
    up_row = up_row / torch.nn.functional.silu(torch.tensor(SINK_GATE, dtype=torch.float64))
    return {"neuron": neuron, "gate": (SINK_GATE * gate_row).float().cpu(), "up": up_row.float().cpu(),
            "down": (sink_target - reached).float().cpu(), "margin": margin}


@torch.no_grad()
def calibrate(prefix, blocks: torch.Tensor, n_post: int, sink_token: int | None = None, batch_size: int = 4,
              progress: bool = True) -> dict:
    """Fit the Post-LN conversion of the first ``n_post`` blocks of ``prefix`` (see the module
    docstring); ``prefix`` may hold one block more, the first Pre-LN one, for the sink neuron.

    Returns per-block lists: ``input_scale`` and ``mid_scale`` (floats), ``post_attention_gain``
    and ``post_feedforward_gain`` (vectors of hidden size), ``relative_error`` (float): the
    mean per-token relative error of the converted stream after each block, what is left to heal;
    and ``sink``: for a conversion of blocks 0..i, block i + 1's sink neuron of ``sink_token``
    (``neuron``, ``gate`` and ``up`` rows, ``down`` column, ``margin``), or None (no such block,
    no token given, or no separating gate).
    """
    eps = prefix.config.rms_norm_eps
    device = next(prefix.parameters()).device
    batches = [blocks[s:s + batch_size].to(device) for s in range(0, len(blocks), batch_size)]
    fitted = len(batches)  # the gains fit these; the same blocks after BOS ride along for the sink neuron
    if sink_token is not None:
        after_bos = torch.cat([torch.full_like(blocks[:, :1], sink_token), blocks[:, :-1]], 1)
        batches += [after_bos[s:s + batch_size].to(device) for s in range(0, len(after_bos), batch_size)]
    positions = [torch.arange(b.shape[1], device=device)[None] for b in batches]
    teacher = [prefix.embed_tokens(b).float() for b in batches]
    student = [t.clone() for t in teacher]
    rope = [prefix.rotary_emb(t, p) for t, p in zip(teacher, positions)]
    keys = ("input_scale", "post_attention_gain", "mid_scale", "post_feedforward_gain", "relative_error", "sink")
    stats = {k: [] for k in keys}

    def attention(layer, x, k):
        return layer.self_attn(hidden_states=x, attention_mask=None, position_embeddings=rope[k],
                               position_ids=positions[k])[0]

    def original(layer, x, k):
        mid = x + attention(layer, layer.input_layernorm(x), k)
        return mid, mid + layer.mlp(layer.post_attention_layernorm(mid))

    for i, layer in enumerate(tqdm(prefix.layers[:n_post], desc="calibrating", disable=not progress, leave=False)):
        g_in = layer.input_layernorm.weight.float()
        g_pa = layer.post_attention_layernorm.weight.float()
        teacher_mid, teacher = map(list, zip(*[original(layer, x, k) for k, x in enumerate(teacher)]))
        # The converted block, on the converted stream.
        s = _median_rms(student[:fitted])
        after_attn = [_unit(x + attention(layer, x * (g_in / s), k), eps) for k, x in enumerate(student)]
        g_mid = _fit_gain(after_attn[:fitted], teacher_mid[:fitted])
        mid = [g_mid * u for u in after_attn]
        m = _median_rms(mid[:fitted])
        after_mlp = [_unit(h + layer.mlp(h * (g_pa / m)), eps) for h in mid]
        g_out = _fit_gain(after_mlp[:fitted], teacher[:fitted])
        student = [g_out * u for u in after_mlp]
        error = torch.cat([(_token_rms(x - y) / _token_rms(y)).flatten()
                           for x, y in zip(student[:fitted], teacher[:fitted])])
        sink = None
        if sink_token is not None and i + 1 < len(prefix.layers):
            following = prefix.layers[i + 1]
            sink = _sink_neuron(following, attention, student, fitted, original(following, teacher[fitted], fitted)[1][0, 0])
        for key, value in zip(keys, (s, g_mid, m, g_out, error.mean().item(), sink)):
            stats[key].append(value)
    return stats
