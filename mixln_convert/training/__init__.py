"""Continued pre-training of a converted Mix-LN model and its Pre-LN original (``mixln-convert train``)."""

from .recipe import DEFAULTS, load_recipe
from .trainer import ARMS, train

__all__ = ["ARMS", "DEFAULTS", "load_recipe", "train"]
