"""The fixed choices of the commands and recipes, and the evaluation definition, in one torch-free
place: the CLI offers the choices as ``click.Choice`` and the modules that act on them validate
against the same tuples."""

STRATEGIES = ("calibrated", "move", "reinit-post", "scratch")  # conversion/plan.py
# conversion/converter.py: Mix-LN (the first blocks Post-LN) or LayerNorm Scaling (conversion/lns.py)
LAYOUTS = ("mixln", "lns")
# pipeline.py's training arms: the converted Mix-LN model, the Pre-LN control, the LNS retrofit
ARMS = ("mixln", "preln", "lns")
DEFAULT_ARMS = ("mixln", "preln")
METHODS = ("angular", "drop", "last")  # surgery/prune.py: how N blocks to remove are chosen
LOSSES = ("kl", "residual")  # healing/losses.py
HEAL_DTYPES = ("fp32", "bf16")  # healing/: of the frozen weights (the trained blocks stay float32)
# The heal's peak learning rate. 1e-4 diverged on SmolLM2-135M's calibrated conversion (the KL
# loss jumped 3x once warmup passed ~8e-5 and the heal ended worse than it started); 3e-5 heals it.
HEAL_LR = 3e-5
HEAL_SEQ_LEN, HEAL_BATCH_SIZE = 256, 4  # healing/: a step of 4 x 256 tokens
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
