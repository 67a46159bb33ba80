"""The fixed choices of the commands and recipes, in one torch-free place: the CLI offers them
as ``click.Choice`` and the modules that act on them validate against the same tuples."""

STRATEGIES = ("calibrated", "move", "reinit-post", "scratch")  # conversion/plan.py
METHODS = ("angular", "drop", "last")  # analysis/prune.py: how N blocks to remove are chosen
LOSSES = ("kl", "residual")  # healing.py
PRECISIONS = ("auto", "bf16", "fp32")  # training: auto is bf16 autocast on GPU, fp32 on CPU
DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")  # conversion output dtypes
