"""Continued pre-training of a prepared checkpoint (``mixln-convert train``): recipes
(:mod:`.recipe`) and the loop (:mod:`.trainer`); :mod:`mixln_convert.workflows.train` chains the arms."""

from .recipe import Recipe, load_recipe

__all__ = ["Recipe", "load_recipe"]
