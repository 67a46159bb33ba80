"""What :func:`~mixln_convert.healing.heal` returns; less ``out``, the record it leaves in the healed
checkpoint's ``mixln_provenance["heal"]`` (config.json), which its model card reads."""

import dataclasses
from dataclasses import dataclass


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
    relative_error: dict  # the Post-LN blocks' output against the teacher's, {"before", "after"} the heal
    perplexity: dict | None  # packed windows: {"teacher", "before", "after"}; None without the evaluation
    per_document_perplexity: dict | None  # each document from its first token, likewise
    evaluation: dict  # the held-out text: {"data", "tokens" (scored), "seq_len"}
    data_passes: float  # how many times the heal went over its training windows (over 1: it repeated them)
    processes: int  # that shared each step
    seconds: float

    def record(self) -> dict:
        """The provenance's record (the output's path is not the checkpoint's to say)."""
        return {key: value for key, value in dataclasses.asdict(self).items() if key != "out"}
