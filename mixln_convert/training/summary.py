"""A trained arm's ``summary.json``: what the trainer says of a finished arm, written last (so it says the arm
is done) and read back by ``train --resume``, ``compare``, demo, sweep and study. Each field is declared once
with its kind (:mod:`mixln_convert.schema`), which checks it where the file is read. Torch-free."""

from dataclasses import dataclass
from pathlib import Path

from ..errors import MixLNError
from ..evaluation.options import Measured
from ..io.records import LAYER_COUNT, NUMBER, POST_LN_COUNT, Result
from ..limits import MAX_TOKENS
from ..schema import NONNEGATIVE, POSITIVE_NUMBER, TOKENS_OR_ZERO, Count, Flag, Nested, Numbers, String, setting

MEASURED_ON = Nested(Measured, "what a figure was measured on")
WINDOW_LOSSES = Numbers(NUMBER, 1, MAX_TOKENS)  # one per validation window


# kw_only: the fields keep the file's order (a summary written before a field existed lacks it: None)
@dataclass(frozen=True, kw_only=True)
class TrainSummary(Result):
    FILE = "summary.json"
    WHAT = "a trained arm's summary"

    arm: str = setting(kind=String())
    source: str | None = setting(None, String())  # the checkpoint the arm trained from
    steps: int = setting(kind=TOKENS_OR_ZERO)
    tokens: int = setting(kind=TOKENS_OR_ZERO)
    wall_time_s: float = setting(kind=NONNEGATIVE)
    resumed_from_step: int | None = setting(None, TOKENS_OR_ZERO)
    final_val_loss: float | None = setting(None, NUMBER)
    final_val_ppl: float = setting(kind=POSITIVE_NUMBER)
    initial_val_loss: float | None = setting(None, NUMBER)
    initial_val_ppl: float = setting(kind=POSITIVE_NUMBER)
    validation: Measured | None = setting(None, MEASURED_ON)
    initial_val_window_losses: list[float] | None = setting(None, WINDOW_LOSSES)
    final_val_window_losses: list[float] | None = setting(None, WINDOW_LOSSES)
    tokens_per_s: float | None = setting(None, NONNEGATIVE)
    parameters: int | None = setting(None, TOKENS_OR_ZERO)
    num_layers: int | None = setting(None, LAYER_COUNT)
    post_ln_layers: int | None = setting(None, POST_LN_COUNT)
    layernorm_scaling: bool | None = setting(None, Flag())
    heal_tokens: int | None = setting(None, TOKENS_OR_ZERO)  # None: written before a heal was recorded
    processes: int | None = setting(None, Count(1))
    precision: str | None = setting(None, String())
    attention: str | None = setting(None, String())
    peak_gpu_memory_bytes: int | None = setting(None, TOKENS_OR_ZERO)

    def check(self, file: Path) -> None:
        if self.post_ln_layers is not None and self.num_layers is not None and self.post_ln_layers > self.num_layers:
            raise MixLNError(f"{file}: post_ln_layers {self.post_ln_layers} exceeds num_layers {self.num_layers}")
