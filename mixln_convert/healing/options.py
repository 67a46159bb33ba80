"""The settings of ``mixln-convert heal`` (healing/run.py), shared with a recipe's heal section. Torch-free."""

from dataclasses import dataclass

from ..data.options import text
from ..errors import MixLNError
from ..evaluation.options import EVAL_TOKENS
from ..options import MAX_SHARD_SIZE, SEQ_LEN, Options, Output, Resume, ShardSized
from ..schema import (BATCH, NONNEGATIVE, POSITIVE_NUMBER, SEED, TOKENS, TOKENS_OR_ZERO, Choice, Count, Flag, Number,
                      Size, SpikeFactor, Text, Window, check_windows, declared, flag, flag_in, key_in, same_as, setting)

LOSSES = ("kl", "residual")  # healing/losses.py
# The heal's peak learning rate: 1e-4 diverged on SmolLM2-135M's calibrated conversion (README).
HEAL_LR = 3e-5
HEAL_BETAS = (0.9, 0.999)  # healing/: AdamW's (torch's defaults); a training recipe has its own (optim.betas)
HEAL_BATCH_SIZE = 4  # healing/: a step of 4 windows of SEQ_LEN
HEAL_TOKENS = 65_536  # healing/: 64 steps
KL_CHUNK_TOKENS = 128  # healing/losses.py: positions whose logits a checkpointed kl heal holds at once
KL_BLOCK_ELEMENTS = 2**19  # healing/losses.py: logits the KL goes over at a time (2 MiB in float32: in cache)


@dataclass(kw_only=True)
class HealSettings:
    """The settings of a heal's training that a recipe's ``heal`` section holds too: healing/run.py's
    HealRun and training/recipe.py's Heal both extend this (spike_factor: as the recipe's guard)."""
    tokens: int = setting(HEAL_TOKENS, TOKENS, "Training tokens.")
    seq_len: int = setting(SEQ_LEN, Window(), "Tokens per training window.")
    batch_size: int = setting(HEAL_BATCH_SIZE, BATCH, "Windows per step.")
    lr: float = setting(HEAL_LR, POSITIVE_NUMBER, "Peak learning rate (warmup, then cosine).")
    loss: str = setting("kl", Choice(LOSSES), "kl (KL divergence of the final logits; runs both whole models, ~3.5x "
                        "the FLOPs of a residual step, but recovers far more per token) or residual (relative error of "
                        "the stream entering the first Pre-LN block; runs the Post-LN blocks only).")
    activation_checkpointing: bool = setting(
        False, Flag(), "Keep only each block's input through a step and recompute the rest in the backward (with "
        "--loss kl the logits too, 128 tokens at a time): a step's activations stop growing with the depth, for one "
        "more forward per step. Pays when activations, not weights, set the peak (long --seq-len, large "
        "--batch-size).", flag="--activation-checkpointing/--no-activation-checkpointing")
    spike_factor: float = setting(
        0.0, SpikeFactor(), "Skip the update of a step whose loss exceeds X times the mean of the last 20 steps' (more "
        "than 5 in a row stop the heal); 0: no check. Non-finite losses and gradients always stop it.", metavar="X")
    checkpoint_interval: int = setting(100, Count(0), "Save what --resume continues from (the Post-LN blocks, AdamW's "
                                       "state, the schedule) every N steps, beside --out; 0: never.", metavar="N")

    @staticmethod
    def budget(default: int = 0):
        """:attr:`tokens` as a conversion's heal budget (convert's, demo's and sweep's --heal-tokens, a recipe's
        heal.tokens): 0 is no heal, the default unless ``default``."""
        return same_as(HealSettings, "tokens", default=default, kind=TOKENS_OR_ZERO, metavar="N", help=(
            "Heal the conversion on N tokens: distil its Post-LN blocks from the source, as `mixln-convert heal` (its "
            f"defaults otherwise: {HEAL_BATCH_SIZE * SEQ_LEN:,} tokens a step; {HEAL_TOKENS:,} is heal's own default "
            "budget). 0: no heal."))

    def check_one_step(self, name=flag) -> None:
        """A heal budget (``tokens``, named by ``name(field)`` in the error) of at least one step, or 0 (none)."""
        step = self.batch_size * self.seq_len
        if 0 < self.tokens < step:
            raise MixLNError(f"{name(declared(HealSettings)['tokens'][0])}: {self.tokens} is less than one heal "
                             f"step ({self.batch_size} x {self.seq_len} = {step} tokens)")


@dataclass(kw_only=True)
class HealOptions(Options, HealSettings, ShardSized):
    """``mixln-convert heal``'s options (healing/run.py's HealRun adds the models and the output): ``data`` a
    text path (the API also takes documents or tokens)."""
    data: object = text("Training text (default split: train), best of the kind the model will be scored on: a "
                        "heal carries over to other kinds of text only in part. Or a `mixln-convert tokenize` "
                        "folder (its train split, memory-mapped: nothing is tokenized again).")
    dtype: str = setting("fp32", Choice(("fp32", "bf16"), "dtype"), "Of the frozen weights (everything but the "
                         "Post-LN blocks, which train in fp32); bf16 halves them and computes under bf16 autocast.")
    warmup_ratio: float = setting(0.1, Number(0, 1, high_open=True))
    grad_clip: float = setting(1.0, NONNEGATIVE)
    eval_tokens: int = setting(EVAL_TOKENS, TOKENS, "Held-out tokens measured before and after.")
    eval_data: str | None = setting(None, Text(), "Held-out text measured before and after, packed and each document "
                                    "on its own: a file, folder or glob (default: embedded corpus, validation split), "
                                    "or a `mixln-convert tokenize` folder (its validation split).", metavar="PATH")
    perplexity: bool = setting(True, Flag(), "Also measure whole-model perplexity (the teacher's and CONVERTED's whole "
                               "models, over one copy of the layers they share).", flag="--perplexity/--no-perplexity")
    fsdp: bool = setting(False, Flag(), "Shard the teacher and the student per block over the processes of a launch "
                         "(FSDP2), for a heal that does not fit one device; --loss kl only.", flag="--fsdp/--no-fsdp")
    eval_at: tuple = setting((), TOKENS, multiple=True)  # the API's: validation once this many tokens are trained
    max_shard_size: str | int = setting(MAX_SHARD_SIZE, Size(), "Largest output shard, e.g. 5GB, 500MB.")
    seed: int = setting(0, SEED)

    def check_combination(self):
        self.check_one_step()


@dataclass(frozen=True, kw_only=True)
class HealCommand(Output, Resume):
    """``mixln-convert heal``'s options beside HealOptions: the teacher, and the output (None: beside CONVERTED)."""
    teacher: str = setting(kind=Text(), help="The Pre-LN model CONVERTED was converted from (HF folder, .gguf or "
                           "Hub id).", metavar="ORIGINAL")
    out: str | None = same_as(Output, "out", default=None, default_help="CONVERTED-healed beside it; NAME-healed here "
                              "for a Hub model ORG/NAME")


class HealsConversion:
    """A command healing its conversion on ``heal_tokens`` (convert, sweep): its :attr:`heal`, checked where the budget
    enters and by :meth:`check_model` once the model is known; the heal itself checks neither again."""

    @property
    def heal(self) -> HealSettings:  # no checkpoints: a killed run converts again, so no resume could continue one
        return HealSettings(tokens=self.heal_tokens, checkpoint_interval=0)

    def check_combination(self):
        self.heal.check_one_step(flag_in("heal"))

    def check_model(self, config: dict) -> None:
        if self.heal_tokens:  # windows the command fixes: named as a recipe's heal section names them
            check_windows(self.heal, config, key_in("heal"))
