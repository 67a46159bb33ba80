"""How many leading blocks become Post-LN, and which layout a conversion makes (torch-free: the
CLI checks its flags with it before importing torch)."""

import math

from ..errors import MixLNError
from ..options import ALPHA, LAYOUTS


def post_ln_count(num_layers: int, alpha: float | None = None, post_ln_layers: int | None = None) -> int:
    """``floor(alpha * L)``, or an explicit count; validated against the model's depth."""
    if post_ln_layers is not None:
        if alpha is not None:
            raise MixLNError("--alpha and --post-ln-layers are exclusive: give one")
        if not 0 <= post_ln_layers <= num_layers:
            raise MixLNError(f"--post-ln-layers: {post_ln_layers} is outside [0, {num_layers}] for this {num_layers}-layer model")
        return post_ln_layers
    alpha = ALPHA if alpha is None else alpha
    if not (0.0 <= alpha <= 1.0) or math.isnan(alpha):
        raise MixLNError(f"--alpha: {alpha} is outside [0, 1]")
    # A tiny epsilon keeps floor(0.3 * 10) == 3 despite 0.3 * 10 == 2.9999999999999996.
    return math.floor(alpha * num_layers + 1e-9)


def check_layout(layout: str, alpha, post_ln_layers, strategy: str) -> bool:
    """``layout`` known, and the options given with it meaningful; True for LayerNorm Scaling."""
    if layout not in LAYOUTS:
        raise MixLNError(f"--layout: unknown layout {layout!r} (choose from {', '.join(LAYOUTS)})")
    if layout != "lns":
        return False
    for flag, value in (("--alpha", alpha), ("--post-ln-layers", post_ln_layers)):
        if value is not None:
            raise MixLNError(f"{flag}: --layout lns makes no block Post-LN (it scales every Pre-LN block's norms); "
                             "leave it out")
    if strategy not in ("calibrated", "scratch"):  # calibrated: the default, which is exact here
        raise MixLNError(f"--strategy {strategy}: --layout lns has no Post-LN block for it to convert; leave "
                         "--strategy out (the conversion is exact) or give scratch")
    return True
