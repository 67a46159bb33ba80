"""What :func:`~mixln_convert.healing.heal` returns; less ``out``, the record it leaves in the healed
checkpoint's ``mixln_provenance["heal"]`` (config.json), which its model card reads. Its figures are records
whose fields are declared with their kinds, in the order the provenance holds them."""

import dataclasses
from dataclasses import dataclass

from ..io.records import NUMBER
from ..schema import POSITIVE_NUMBER, TOKENS, TOKENS_OR_ZERO, String, setting


@dataclass(frozen=True, kw_only=True)
class ErrorChange:
    """The relative error of the Post-LN blocks' output to the teacher's, before and after the heal."""
    before: float = setting(kind=NUMBER)
    after: float = setting(kind=NUMBER)


@dataclass(frozen=True, kw_only=True)
class Perplexities:
    """A held-out perplexity: the teacher's, and the student's before and after the heal."""
    teacher: float = setting(kind=POSITIVE_NUMBER)
    before: float = setting(kind=POSITIVE_NUMBER)
    after: float = setting(kind=POSITIVE_NUMBER)


@dataclass(frozen=True, kw_only=True)
class HeldOut:
    """The held-out text the figures were measured on: its name, the tokens scored and the window length."""
    data: str = setting(kind=String())
    tokens: int = setting(kind=TOKENS_OR_ZERO)
    seq_len: int = setting(kind=TOKENS)


@dataclass(frozen=True, kw_only=True)
class HealResult:
    out: str  # the healed checkpoint
    post_ln_layers: int
    steps: int
    tokens: int  # trained on
    loss: str  # kl or residual
    lr: float
    dtype: str  # of the frozen weights
    activation_checkpointing: bool
    relative_error: ErrorChange
    perplexity: Perplexities | None  # packed windows; None without the evaluation
    per_document_perplexity: Perplexities | None  # each document from its first token, likewise
    evaluation: HeldOut
    data_passes: float  # how many times the heal went over its training windows (over 1: it repeated them)
    processes: int  # that shared each step
    seconds: float

    def record(self) -> dict:
        """The provenance's record (the output's path is not the checkpoint's to say)."""
        return {key: value for key, value in dataclasses.asdict(self).items() if key != "out"}
