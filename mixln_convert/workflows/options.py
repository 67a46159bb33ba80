"""The settings of ``mixln-convert sweep``, ``study`` and ``demo`` (workflows/), and their CPU recipe. Torch-free."""

from dataclasses import dataclass
from importlib import resources

import yaml

from ..conversion.options import alpha
from ..data.options import text
from ..errors import MixLNError
from ..evaluation.options import EVAL_TOKENS
from ..healing.options import HealsConversion, HealSettings
from ..limits import MAX_ALPHAS, MAX_SEEDS
from ..options import SEQ_LEN, Options, Output, Overrides, Resume
from ..schema import (FRACTION, NONNEGATIVE, OPEN_FRACTION, TOKENS, TOKENS_OR_ZERO, Count, Flag, Names, Number, Numbers,
                      Text, same_as, setting)

MAX_PPL_INCREASE, MAX_GRAD_RATIO = 0.10, 3.0  # workflows/sweep.py: the rule's limits on perplexity and gradient ratio

# The CPU recipe that demo, sweep and study train with (shipped; each overrides what it varies), its keys read
# once here for the demo's defaults and --help: the demo heals as it does, at its lr, counting in its steps
CPU_RECIPE = "smollm2-135m-cpu"
CPU_RECIPE_KEYS = yaml.safe_load((resources.files("mixln_convert") / "recipes" / f"{CPU_RECIPE}.yaml").read_text())
CPU_STEP_TOKENS = CPU_RECIPE_KEYS["global_batch_size"] * SEQ_LEN
SEEDS = Count(1, MAX_SEEDS)  # seeds per arm: each trains every arm once more
STUDY_SCHEMES = {"scaled": True, "plain": False}  # a study's initialization scheme -> conversion.scaled_init


@dataclass(frozen=True, kw_only=True)
class SweepOptions(HealsConversion, Options):
    """What ``mixln-convert sweep`` measures (workflows/sweep.py)."""
    alphas: tuple[float, ...] = setting((0.0, 0.0625, 0.125, 0.25, 0.5), Numbers(FRACTION, 1, MAX_ALPHAS), "Post-LN "
                                        "ratios to try, comma-separated (alphas giving the same block count run "
                                        "once).", metavar="LIST")
    heal_tokens: int = HealSettings.budget()
    train_tokens: int = setting(0, TOKENS_OR_ZERO, "Train each Mix-LN model, and a Pre-LN control once per seed, on "
                                f"N tokens (the {CPU_RECIPE} recipe's steps, same data and order). 0: no training.",
                                metavar="N")
    data: str | None = text("Heal and training text (default: the embedded corpus's train split).")
    seeds: int = setting(1, SEEDS, "Training seeds per arm (with --train-tokens).")
    eval_tokens: int = setting(EVAL_TOKENS, TOKENS, "Held-out tokens each stage is scored and analyzed on (windows "
                               "of 256).", metavar="N")
    max_ppl_increase: float = setting(MAX_PPL_INCREASE, NONNEGATIVE, "Rule: the healed (else converted) perplexity "
                                      "at most X above the original's (0.10 = 10%).", metavar="X")
    max_grad_ratio: float = setting(MAX_GRAD_RATIO, Number(1), "Rule: the largest Post-LN block gradient norm at "
                                    "most Y times the Pre-LN blocks' mean.", metavar="Y")
    lns: bool = setting(False, Flag(), "With --train-tokens, also train the LayerNorm Scaling retrofit of SRC "
                        "(exact: every block's norm gains x sqrt(l), its norm outputs x 1/sqrt(l)) like the control, "
                        "and compare them.")

    def check_combination(self):
        if self.lns and not self.train_tokens:
            raise MixLNError(f"{self.flag('lns')}: the LNS retrofit computes the original's function, so only "
                             f"training tells them apart; add {self.flag('train_tokens')} N")
        super().check_combination()


@dataclass(frozen=True, kw_only=True)
class StudyOptions(Options):
    """What ``mixln-convert study`` trains (workflows/study.py)."""
    recipe: str = setting(CPU_RECIPE, Text(), "Training recipe of every run (a shipped name or a YAML file).",
                          metavar="RECIPE")
    overrides: tuple[str, ...] = same_as(Overrides, "overrides")
    # the Mix-LN arm needs Post-LN and Pre-LN blocks
    alpha: float = alpha(kind=OPEN_FRACTION)
    seeds: int = setting(2, SEEDS, "Seeds per arm and scheme (initialization and data order); verdicts need 2 or "
                         "more.")
    schemes: tuple[str, ...] = setting(tuple(STUDY_SCHEMES), Names(tuple(STUDY_SCHEMES), noun="scheme"),
                                       "Initialization schemes, each applied to every arm: scaled (o_proj/down_proj "
                                       "std / sqrt(2L)), plain (LLaMA's).", flag="--init", metavar="LIST")
    post_ln: bool = setting(True, Flag(), "Train a Post-LN arm (alpha 1) too.", flag="--post-ln/--no-post-ln")
    lns: bool = setting(False, Flag(), "Train a LayerNorm Scaling arm too (arXiv 2502.05795: every block Pre-LN, the "
                        "norm outputs of block l scaled by 1/sqrt(l); the same initialization, norm gains 1 as in its "
                        "paper).", flag="--lns/--no-lns")
    eval_tokens: int = setting(8 * SEQ_LEN, TOKENS, "Held-out tokens each final model is analyzed on (layer "
                               "drop, gradient norms).", metavar="N")  # fewer than eval's: one analysis per run


@dataclass(frozen=True, kw_only=True)
class DemoOptions(Options):
    """What ``mixln-convert demo`` runs (workflows/demo.py)."""
    alpha: float = alpha()
    heal_tokens: int = HealSettings.budget(CPU_RECIPE_KEYS["heal"]["tokens"])
    # the demo's budget (2 CPU cores, minutes): 8 steps per arm, every stage measured on the same 8 windows
    train_tokens: int = setting(8 * CPU_STEP_TOKENS, TOKENS, f"Training tokens per arm (the {CPU_RECIPE} recipe, "
                                f"{CPU_STEP_TOKENS:,} tokens a step, at lr {CPU_RECIPE_KEYS['optim']['lr']:g}); more "
                                "for a real recovery.", metavar="N")
    eval_tokens: int = setting(8 * SEQ_LEN, TOKENS, "Held-out tokens every stage is measured on, by training "
                               "validation and analysis alike.", metavar="N")
    prune_curve: bool = setting(True, Flag(), "Also the perplexity with 1..L/2 blocks removed, for the original and "
                                "both trained arms.", flag="--prune-curve/--no-prune-curve")
    source: str | None = setting(None, Text(), "Your own Pre-LN checkpoint (HF folder, .gguf or Hub id) instead of "
                                 "SmolLM2-135M.", metavar="MODEL")


@dataclass(frozen=True, kw_only=True)
class DemoOutput(Output, Resume):
    out: str = same_as(Output, "out", default="mixln-demo", metavar=None)
