"""LayerNorm Scaling (LNS; arXiv 2502.05795) as a conversion: what a block's norm gains become.

An LNS model multiplies each norm output of block l (counted from 1: layer index i + 1) by
1/sqrt(l), in its forward (``modeling_mixln.py``). A pretrained Pre-LN model becomes an LNS
model computing the same function when each block's two norm gains are multiplied by sqrt(l):
the scaling cancels. Only training then differs: AdamW moves a gain by about the learning rate
whatever its size, so a retrofitted gain's effective step is 1/sqrt(l) of the Pre-LN one's.
"""

import math

NORM_ROLES = ("input_norm", "post_attention_norm")  # the norms of a Pre-LN block (architectures/*.json roles)


def gain_factor(i: int) -> float:
    """What the norm gains of the block with layer index ``i`` are multiplied by for the model's
    1/sqrt(i + 1) to cancel."""
    return math.sqrt(i + 1)
