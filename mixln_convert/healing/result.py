"""What :func:`~mixln_convert.healing.heal` returns; less ``out``, the record it leaves in the healed
checkpoint's ``mixln_provenance["heal"]`` (config.json), which its model card reads. Its perplexities and
held-out text are the records :mod:`..io.lineage` reads them back as."""

import dataclasses
from dataclasses import dataclass

from ..io.lineage import Figures, Windows
from ..io.records import NUMBER
from ..schema import setting


@dataclass(frozen=True, kw_only=True)
class ErrorChange:
    """The relative error of the Post-LN blocks' output to the teacher's, before and after the heal."""
    before: float = setting(kind=NUMBER)
    after: float = setting(kind=NUMBER)


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
    perplexity: Figures | None  # packed windows (with the teacher's); None without the evaluation
    per_document_perplexity: Figures | None  # each document from its first token, likewise
    evaluation: Windows  # the held-out text the figures were measured on
    data_passes: float  # how many times the heal went over its training windows (over 1: it repeated them)
    processes: int  # that shared each step
    seconds: float

    def record(self) -> dict:
        """The provenance's record (the output's path is not the checkpoint's to say)."""
        return {key: value for key, value in dataclasses.asdict(self).items() if key != "out"}
