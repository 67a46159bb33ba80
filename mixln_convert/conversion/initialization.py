"""Fresh weights for layers that are initialized rather than carried over: LLaMA's own scheme, with
the Mix-LN paper's scaled initialization as an option (the projections that write into the residual
stream get std = initializer_range / sqrt(2 L), Shoeybi et al. 2019).

Every tensor is drawn from its own generator seeded by (seed, tensor name), so a tensor's
value does not depend on the order tensors are written in: streaming stays reproducible.
"""

import math
import zlib

import torch


def init_std(role: str, initializer_range: float, num_layers: int, scaled: bool) -> float:
    if scaled and role in ("attention_output", "mlp_output"):
        return initializer_range / math.sqrt(2 * num_layers)
    return initializer_range


def fresh_tensor(name: str, shape, std: float | None, seed: int) -> torch.Tensor:
    """A float32 tensor: ones when ``std`` is None (a norm gain), else normal(0, std)."""
    if std is None:
        return torch.ones(shape)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=generator) * std
