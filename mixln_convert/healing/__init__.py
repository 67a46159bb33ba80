"""``heal()``: cheap recovery of a converted model by distilling only its Post-LN blocks.

Most of what a conversion breaks sits in the first ``post_ln_layers`` (k) blocks, and the original
model is there to teach them: only those blocks are trained, so that the residual stream they hand
to the first Pre-LN block matches the original's. The result is a normal converted checkpoint with
``mixln_provenance["heal"]`` in config.json and ``heal_metrics.jsonl``: one JSON object per step (step,
tokens, loss, lr, seconds since the start; evaluations add val_relative_error and, with ``perplexity``,
val_loss, val_ppl and val_doc_ppl).
"""

__all__ = ["heal"]


def __getattr__(name: str):  # imported when first used: .options (the CLI's) imports no torch
    if name != "heal":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .run import heal

    return heal
