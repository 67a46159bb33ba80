"""What ``mixln-convert eval`` prints (``--json``: one object): :class:`PerplexityScores` (packed windows) or
:class:`TaskScores` (``--tasks``), each with the per-document scores and greedy continuations asked for, every
field declared with its kind so a saved one reads back checked (``PerplexityScores.read(file)``). Torch-free."""

from dataclasses import dataclass

from ..io.records import NUMBER, NUMBER_LIST, Record, Result
from ..schema import POSITIVE_NUMBER, TOKENS, TOKENS_OR_ZERO, ByName, Flag, Nested, String, setting


@dataclass(frozen=True, kw_only=True)
class DocumentScores(Record):
    """Each document scored on its own from its first token (``evaluate_documents``); loss in nats per token."""
    documents: int = setting(kind=TOKENS)
    tokens: int = setting(kind=TOKENS)
    words: int = setting(kind=TOKENS_OR_ZERO)
    bytes: int = setting(kind=TOKENS_OR_ZERO)
    loss: float = setting(kind=NUMBER)
    token_perplexity: float = setting(kind=POSITIVE_NUMBER)
    word_perplexity: float = setting(kind=POSITIVE_NUMBER)
    byte_perplexity: float = setting(kind=POSITIVE_NUMBER)
    bits_per_byte: float = setting(kind=NUMBER)


@dataclass(frozen=True, kw_only=True)
class Continuation:
    prompt: str = setting(kind=String())
    text: str = setting(kind=String())
    repeated_4gram_share: float = setting(kind=NUMBER)


@dataclass(frozen=True, kw_only=True)
class Generation:
    """Greedy continuations of fixed prompts (``greedy_continuations``) and their mean repeated-4-gram share."""
    continuations: list[Continuation] = setting(kind=Nested(Continuation, "a continuation", many=True))
    new_tokens: int = setting(kind=TOKENS)
    repeated_4gram_share: float = setting(kind=NUMBER)


@dataclass(frozen=True, kw_only=True)
class TaskScore:
    """One lm-evaluation-harness task's figures (``run_tasks``): a standard error is None where lm-eval gives none."""
    metrics: dict[str, float] = setting(kind=ByName(NUMBER))
    stderr: dict[str, float | None] = setting(kind=ByName(NUMBER, or_none=True))
    higher_is_better: dict[str, bool] = setting(kind=ByName(Flag()))
    samples: int = setting(kind=TOKENS_OR_ZERO)
    output_type: str = setting(kind=String())


@dataclass(frozen=True, kw_only=True)
class EvalResult(Result):
    """What both kinds of eval print: the checkpoint first, then the kind's figures, then the parts asked for
    (absent, not null, when not asked for)."""
    WHAT = "a result of `mixln-convert eval`"
    EXTRAS = ("per_document", "generation")

    checkpoint: str = setting(kind=String())
    per_document: DocumentScores | None = setting(None, Nested(DocumentScores, "per-document scores"))
    generation: Generation | None = setting(None, Nested(Generation, "a generation"))

    def to_dict(self) -> dict:
        record = super().to_dict()
        extras = {key: record.pop(key) for key in self.EXTRAS}
        return {**record, **{key: value for key, value in extras.items() if value is not None}}


@dataclass(frozen=True, kw_only=True)
class PerplexityScores(EvalResult):
    """Packed windows of ``seq_len`` tokens (``evaluate_perplexity``): loss in nats, one loss per window."""
    data: str = setting(kind=String())
    seq_len: int = setting(kind=TOKENS)
    perplexity: float = setting(kind=POSITIVE_NUMBER)
    loss: float = setting(kind=NUMBER)
    tokens: int = setting(kind=TOKENS)
    window_losses: list[float] = setting(kind=NUMBER_LIST)


@dataclass(frozen=True, kw_only=True)
class TaskScores(EvalResult):
    """lm-evaluation-harness tasks (``evaluate_tasks``) run with ``limit`` examples each (None: all)."""
    batch_size: int = setting(kind=TOKENS)
    tasks: dict[str, TaskScore] = setting(kind=ByName(Nested(TaskScore, "a task's scores")))
    limit: int | None = setting(None, TOKENS)
    lm_eval_version: str = setting(kind=String())
