"""The fixed choices and the defaults of the commands and recipes, and the evaluation definition,
in one torch-free place: the CLI offers the choices as ``click.Choice`` and shows the defaults,
and the modules that act on them validate against the same tuples and default to the same values."""

from dataclasses import dataclass

STRATEGIES = ("calibrated", "move", "reinit-post", "scratch")  # conversion/plan.py
# conversion/converter.py: Mix-LN (the first blocks Post-LN) or LayerNorm Scaling (architectures/__init__.py)
LAYOUTS = ("mixln", "lns")
# pipeline.py's training arms: the converted Mix-LN model, the Pre-LN control, the LNS retrofit
ARMS = ("mixln", "preln", "lns")
DEFAULT_ARMS = ("mixln", "preln")
METHODS = ("angular", "drop", "last")  # analysis/choice.py: how N blocks to remove are chosen
LOSSES = ("kl", "residual")  # healing/losses.py
HEAL_DTYPES = ("fp32", "bf16")  # healing/: of the frozen weights (the trained blocks stay float32)
# The heal's peak learning rate. 1e-4 diverged on SmolLM2-135M's calibrated conversion (the KL
# loss jumped 3x once warmup passed ~8e-5 and the heal ended worse than it started); 3e-5 heals it.
HEAL_LR = 3e-5
HEAL_SEQ_LEN, HEAL_BATCH_SIZE = 256, 4  # healing/: a step of 4 x 256 tokens
HEAL_TOKENS = 65_536  # healing/: 64 steps
HEAL_LOSS, HEAL_DTYPE = "kl", "fp32"  # healing/: the defaults of LOSSES and HEAL_DTYPES


@dataclass(kw_only=True)
class HealSettings:
    """The settings of a heal's training that a recipe's ``heal`` section holds too: healing/run.py's
    HealRun and training/recipe.py's Heal both extend this (spike_factor: as the recipe's guard)."""
    tokens: int = HEAL_TOKENS
    seq_len: int = HEAL_SEQ_LEN
    batch_size: int = HEAL_BATCH_SIZE
    lr: float = HEAL_LR
    loss: str = HEAL_LOSS
    activation_checkpointing: bool = False
    spike_factor: float = 0.0


ALPHA = 0.25  # conversion/layout.py: the share of leading blocks made Post-LN unless told otherwise
# conversion/converter.py's calibrated gains. Short blocks fit the Post-LN gains better (down to a
# point; docs/measurements.md): each block's first positions carry the massive activations, and
# short blocks give the fit more of them.
CALIBRATION_TOKENS, CALIBRATION_SEQ_LEN = 8192, 128
PRUNE_SEQ_LEN, PRUNE_TOKENS = 256, 8 * 256  # surgery/prune.py: the blocks --method angular/drop measure
BATCH_SIZE = 4  # blocks per forward pass of a measurement (eval, analyze, prune)
MAX_SHARD_SIZE = "5GB"  # the largest output shard a heal or prune writes, and a conversion's cap
SHARD_TOKENS = 2**25  # data/tokenization.py: 32M tokens, 64 MiB of uint16 a shard
VALIDATION_FRACTION = 0.01  # data/tokenization.py: the documents held out, by content hash
# sweep.py: the Post-LN ratios tried, and the rule's limits on perplexity and gradient ratio
SWEEP_ALPHAS = (0.0, 0.0625, 0.125, 0.25, 0.5)
MAX_PPL_INCREASE, MAX_GRAD_RATIO = 0.10, 3.0
PRECISIONS = ("auto", "bf16", "fp32")  # training: auto is bf16 autocast on GPU, fp32 on CPU
# training: transformers' attention implementations; eager is the plain matmul-softmax one, the
# reference to rerun a non-finite bf16 step against (benchmarks/gpu_mission.py)
ATTENTIONS = ("sdpa", "eager")
TRAINING_STRATEGIES = ("single", "ddp", "fsdp")  # training/memory.py: one process, replicated, sharded
DEVICES = ("gpu", "cpu")  # training/memory.py: what a recipe's hardware is
DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")  # conversion output dtypes

# The one evaluation definition: every perplexity the tool reports (eval, analyze, heal, training
# validation, the demo) is measured on the first EVAL_TOKENS tokens of the held-out text (default:
# the embedded corpus's validation split) in packed blocks of EVAL_SEQ_LEN, unless a flag or recipe
# key says otherwise, and each result records the data, token count and block length it used.
EVAL_DATA = "embedded:validation"
EVAL_SEQ_LEN = 256  # the paper's sequence length; short enough for 2 CPU cores
EVAL_TOKENS = 8192  # 32 blocks: enough for a bootstrap interval, seconds per pass for a 135M model on CPU
STUDY_EVAL_TOKENS = 8 * EVAL_SEQ_LEN  # study's analyses: one per arm, scheme and seed, so fewer tokens each


def measured_on(where: dict) -> str:
    """'DATA, N tokens in blocks of S' from a result's {data, tokens, seq_len}: what it was measured on."""
    return f"{where['data']}, {where['tokens']:,} tokens in blocks of {where['seq_len']}"

# The demo's budget (2 CPU cores, minutes): the tool's recommended path at its smallest useful size:
# a heal of 16 steps (the heal curve in the README: most of the conversion's gap closes in the first
# 16,384 tokens), 8 optimizer steps of the CPU recipe per arm, and every stage (training validation
# and analysis alike) measured on the same 8 blocks of EVAL_SEQ_LEN.
DEMO_HEAL_TOKENS = 16 * HEAL_BATCH_SIZE * HEAL_SEQ_LEN
DEMO_TRAIN_TOKENS = 8 * 4 * 256
DEMO_EVAL_TOKENS = 8 * EVAL_SEQ_LEN
# The demo trains at the heal's lr rather than the CPU recipe's: the higher the lr, the more the
# healed Mix-LN arm learns its way back into loops (benchmarks/demo_lr.py, README)
DEMO_LR = HEAL_LR
