"""How many leading blocks become Post-LN (torch-free)."""

import math

from ..errors import MixLNError
from .options import ConvertOptions


def post_ln_count(num_layers: int, alpha: float | None, post_ln_layers: int | None = None) -> int:
    """``floor(alpha * L)``, or the count ``post_ln_layers`` where given, which only the model's depth
    bounds (each is range-checked where it enters: conversion/options.py)."""
    if post_ln_layers is not None:
        if post_ln_layers > num_layers:
            raise MixLNError(f"{ConvertOptions.flag('post_ln_layers')}: {post_ln_layers} is outside [0, {num_layers}] "
                             f"for this {num_layers}-layer model")
        return post_ln_layers
    # A tiny epsilon keeps floor(0.3 * 10) == 3 despite 0.3 * 10 == 2.9999999999999996.
    return math.floor(alpha * num_layers + 1e-9)
