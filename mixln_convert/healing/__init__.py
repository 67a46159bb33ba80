"""``heal()``: cheap recovery of a converted model by distilling only its Post-LN blocks.

Most of what a conversion breaks sits in the first ``post_ln_layers`` (k) blocks, and the
original model is there to teach them. Only those blocks (attention, MLP and their norms) are
trained, so that the residual stream they hand to the first Pre-LN block matches the original's
on the same tokens. Forward and backward run through the k blocks only and the teacher's prefix
(embeddings + k blocks) runs without gradients, so a step costs about k/L of a training step.

The result is a normal converted checkpoint: every tensor of the converted model, the healed
blocks' replaced, ``mixln_provenance["heal"]`` in config.json and ``heal_metrics.jsonl``
(one JSON object per step: step, tokens, loss, lr, seconds since the start; evaluations add
val_relative_error and, with ``perplexity``, val_loss and val_ppl).
"""

from .run import heal

__all__ = ["heal"]
