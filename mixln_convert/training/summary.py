"""A trained arm's ``summary.json``: what the trainer says of a finished arm, written last (so it says the arm
is done) and read back by ``train --resume``, ``compare``, demo, sweep and study. Each field is declared once
with its kind (:mod:`mixln_convert.schema`), which checks it where the file is read. Torch-free."""

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..errors import MixLNError
from ..io.records import read_json, write_json
from ..limits import MAX_TOKENS, is_integral
from ..schema import NONNEGATIVE, POSITIVE_NUMBER, TOKENS_OR_ZERO, Count, Flag, Kind, Number, Numbers, read_record, \
    setting


class String(Kind):
    def ok(self, value) -> bool:
        return isinstance(value, str)

    def describe(self) -> str:
        return "a string"


class MeasuredOn(Kind):
    """What a perplexity was measured on: the text's name, the tokens scored and the window length."""

    def ok(self, value) -> bool:
        return (isinstance(value, dict) and isinstance(value.get("data"), str) and is_integral(value.get("tokens"))
                and value["tokens"] >= 0 and is_integral(value.get("seq_len")) and value["seq_len"] > 1)

    def describe(self) -> str:
        return "an object with data (a string), tokens and seq_len (integers)"


LOSS, WINDOW_LOSSES = Number(), Numbers(Number(), 1, MAX_TOKENS)


# kw_only: the fields keep the file's order (a summary written before a field existed lacks it: None)
@dataclass(frozen=True, kw_only=True)
class TrainSummary:
    FILE: ClassVar[str] = "summary.json"

    arm: str = setting(kind=String())
    source: str | None = setting(None, String())  # the checkpoint the arm trained from
    steps: int = setting(kind=TOKENS_OR_ZERO)
    tokens: int = setting(kind=TOKENS_OR_ZERO)
    wall_time_s: float = setting(kind=NONNEGATIVE)
    resumed_from_step: int | None = setting(None, TOKENS_OR_ZERO)
    final_val_loss: float | None = setting(None, LOSS)
    final_val_ppl: float = setting(kind=POSITIVE_NUMBER)
    initial_val_loss: float | None = setting(None, LOSS)
    initial_val_ppl: float = setting(kind=POSITIVE_NUMBER)
    validation: dict | None = setting(None, MeasuredOn())
    initial_val_window_losses: list[float] | None = setting(None, WINDOW_LOSSES)
    final_val_window_losses: list[float] | None = setting(None, WINDOW_LOSSES)
    tokens_per_s: float | None = setting(None, NONNEGATIVE)
    parameters: int | None = setting(None, TOKENS_OR_ZERO)
    num_layers: int | None = setting(None, Count(1, 10**6))
    post_ln_layers: int | None = setting(None, Count(0, 10**6))
    layernorm_scaling: bool | None = setting(None, Flag())
    heal_tokens: int | None = setting(None, TOKENS_OR_ZERO)  # None: written before a heal was recorded
    processes: int | None = setting(None, Count(1))
    precision: str | None = setting(None, String())
    attention: str | None = setting(None, String())
    peak_gpu_memory_bytes: int | None = setting(None, TOKENS_OR_ZERO)

    def write(self, folder: Path) -> None:
        write_json(folder / self.FILE, self.to_dict())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def read(cls, file: Path) -> "TrainSummary":
        """``file``, each field checked: one line naming the file and key if not."""
        summary = read_record(cls, read_json(file), str(file))
        if summary.post_ln_layers is not None and summary.num_layers is not None \
                and summary.post_ln_layers > summary.num_layers:
            raise MixLNError(f"{file}: post_ln_layers {summary.post_ln_layers} exceeds num_layers {summary.num_layers}")
        return summary
