"""What :func:`~mixln_convert.healing.heal` returns; less ``out``, the record it leaves in the healed
checkpoint's ``mixln_provenance["heal"]`` (config.json), which its model card reads. Its figures and
held-out text are the records :mod:`..io.lineage` reads them back as."""

from dataclasses import dataclass

from ..io.lineage import Figures, Windows
from ..io.records import Record


@dataclass(frozen=True, kw_only=True)
class HealResult(Record):
    out: str  # the healed checkpoint
    post_ln_layers: int
    steps: int
    tokens: int  # trained on
    loss: str  # kl or residual
    lr: float
    dtype: str  # of the frozen weights
    activation_checkpointing: bool
    relative_error: Figures  # of the Post-LN blocks' output to the teacher's (no teacher's figure)
    perplexity: Figures | None  # packed windows (with the teacher's); None without the evaluation
    per_document_perplexity: Figures | None  # each document from its first token, likewise
    evaluation: Windows  # the held-out text the figures were measured on
    data_passes: float  # how many times the heal went over its training windows (over 1: it repeated them)
    processes: int  # that shared each step
    seconds: float

    def record(self) -> dict:
        """The provenance's record (the output's path is not the checkpoint's to say)."""
        return {key: value for key, value in self.to_dict().items() if key != "out"}
