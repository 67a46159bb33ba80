"""The conversion's settings (``mixln-convert convert``: conversion/converter.py) and its defaults. Torch-free."""

from dataclasses import dataclass

from ..errors import MixLNError
from ..healing.options import HealsConversion, HealSettings
from ..options import Options, ShardSized
from ..schema import FRACTION, SEED, TOKENS, Choice, Count, Flag, Size, Text, Window, setting

STRATEGIES = ("calibrated", "move", "reinit-post", "scratch")  # conversion/plan.py
# conversion/converter.py: Mix-LN (the first blocks Post-LN) or LayerNorm Scaling (architectures/__init__.py)
LAYOUTS = ("mixln", "lns")
DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")  # conversion output dtypes
ALPHA = 0.25  # conversion/layout.py: the share of leading blocks made Post-LN unless told otherwise
# conversion/converter.py's calibrated gains. Short windows fit better (docs/measurements.md): each
# window's first positions carry the massive activations, and short windows give the fit more of them.
CALIBRATION_TOKENS, CALIBRATION_SEQ_LEN = 8192, 128


def alpha(default=ALPHA, kind=FRACTION, **declared):
    """The share of leading blocks made Post-LN, wherever a command or recipe takes it."""
    return setting(default, kind, "Fraction of leading layers made Post-LN: floor(alpha * L).", **declared)


@dataclass(frozen=True, kw_only=True)
class ConvertOptions(Options, ShardSized):
    """``mixln-convert convert``'s options (conversion/converter.py)."""
    alpha: float | None = alpha(None, default_help=f"{ALPHA}")  # None: --post-ln-layers may be given
    post_ln_layers: int | None = setting(None, Count(0), "Exact number of leading Post-LN layers (instead of "
                                         "--alpha).")
    layout: str = setting("mixln", Choice(LAYOUTS), "mixln: the first blocks Post-LN (--alpha); lns: LayerNorm Scaling "
                          "(arXiv 2502.05795), every block Pre-LN with its norm outputs scaled by 1/sqrt(l) in the "
                          "forward and its norm gains multiplied by sqrt(l): exactly the source's function (with "
                          "--strategy scratch: fresh weights).")
    strategy: str = setting("calibrated", Choice(STRATEGIES), "calibrated (fold norms, calibrate gains: close to the "
                            "original's perplexity at once; heal before generating text), move (paper layout, weights "
                            "carried over; needs training), reinit-post (re-initialize the Post-LN layers; needs "
                            "training), scratch (fresh Mix-LN model).")
    scaled_init: bool = setting(True, Flag(), "o_proj/down_proj of initialized layers use std "
                                "initializer_range/sqrt(2L).", flag="--scaled-init/--no-scaled-init")
    calibration_data: str | None = setting(None, Text(), "Text for the calibration statistics (default: embedded "
                                           "corpus, calibration split).", metavar="PATH")
    calibration_tokens: int = setting(CALIBRATION_TOKENS, TOKENS, "Tokens the calibrated gains are fitted on.")
    calibration_seq_len: int = setting(CALIBRATION_SEQ_LEN, Window(), "Tokens per calibration window (short "
                                       "windows fit better; docs/measurements.md).")
    max_shard_size: str | int | None = setting(  # None: the source's largest shard, at most MAX_SHARD_SIZE
        None, Size(), "Largest output shard, e.g. 5GB, 500MB. Default: the source's largest shard, at most 5GB "
        "(memory use grows with it).")
    dtype: str | None = setting(None, Choice(DTYPES, "dtype"), "Output dtype; default: the source's.")
    seed: int = setting(0, SEED, "Seed of initialized weights.")

    def check_combination(self):
        if self.alpha is not None and self.post_ln_layers is not None:
            raise MixLNError(f"{self.flag('alpha')} and {self.flag('post_ln_layers')} are exclusive: give one")
        if self.lns:
            for name in ("alpha", "post_ln_layers"):
                if getattr(self, name) is not None:
                    raise MixLNError(f"{self.flag(name)}: {self.flag('layout')} lns makes no block Post-LN (it "
                                     "scales every Pre-LN block's norms); leave it out")
            if self.strategy not in ("calibrated", "scratch"):  # calibrated: the default, which is exact here
                raise MixLNError(f"{self.flag('strategy')} {self.strategy}: {self.flag('layout')} lns has no Post-LN "
                                 f"block for it to convert; leave {self.flag('strategy')} out (the conversion is "
                                 "exact) or give scratch")
        if self.strategy != "calibrated" or self.lns:  # a user who names a file or a number expects it used
            why = (f"{self.flag('layout')} lns has no Post-LN block to calibrate" if self.lns
                   else f"only {self.flag('strategy')} calibrated reads it, not {self.strategy}")
            for name in ("calibration_data", "calibration_tokens", "calibration_seq_len"):
                if getattr(self, name) != getattr(ConvertOptions, name):
                    raise MixLNError(f"{self.flag(name)}: {why}; this run would ignore it")

    @property
    def resolved_alpha(self) -> float | None:
        """The alpha the layout is derived from, recorded in the converted config: the one given, else ALPHA;
        None where --post-ln-layers gives the count instead."""
        if self.post_ln_layers is not None:
            return None
        return ALPHA if self.alpha is None else self.alpha

    @property
    def lns(self) -> bool:
        """Whether this is a LayerNorm Scaling conversion (architectures/__init__.py) rather than Mix-LN."""
        return self.layout == "lns"


@dataclass(frozen=True, kw_only=True)
class ConvertHealOptions(HealsConversion, Options):
    """``convert --heal-tokens``: the conversion healed in the same run (workflows/train.py's convert_and_heal)."""
    heal_tokens: int = HealSettings.budget()
    heal_data: str | None = setting(None, Text(), "Text for --heal-tokens, best of the kind the model will be "
                                    "scored on (default: embedded corpus, train split).", metavar="PATH")

    def check_combination(self):
        if self.heal_data is not None and not self.heal_tokens:
            raise MixLNError(f"{self.flag('heal_data')}: only a heal in the same run reads it "
                             f"({self.flag('heal_tokens')} N); this run would ignore it")
        super().check_combination()
