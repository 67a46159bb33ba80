"""How many leading blocks become Post-LN (torch-free)."""

import math

from ..errors import MixLNError
from ..options import ALPHA


def post_ln_count(num_layers: int, alpha: float | None = None, post_ln_layers: int | None = None) -> int:
    """``floor(alpha * L)``, or an explicit count; validated against the model's depth."""
    if post_ln_layers is not None:
        if alpha is not None:
            raise MixLNError("--alpha and --post-ln-layers are exclusive: give one")
        if not 0 <= post_ln_layers <= num_layers:
            raise MixLNError(f"--post-ln-layers: {post_ln_layers} is outside [0, {num_layers}] for this "
                             f"{num_layers}-layer model")
        return post_ln_layers
    alpha = resolved_alpha(alpha, post_ln_layers)
    if not 0.0 <= alpha <= 1.0:  # nan fails too
        raise MixLNError(f"--alpha: {alpha} is outside [0, 1]")
    # A tiny epsilon keeps floor(0.3 * 10) == 3 despite 0.3 * 10 == 2.9999999999999996.
    return math.floor(alpha * num_layers + 1e-9)


def resolved_alpha(alpha: float | None, post_ln_layers: int | None) -> float | None:
    """The alpha a layout is derived from, recorded in the converted config: the one given, else the
    default; None where the Post-LN count was given instead."""
    if post_ln_layers is not None:
        return None
    return ALPHA if alpha is None else alpha
