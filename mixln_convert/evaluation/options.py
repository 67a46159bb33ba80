"""The settings of ``mixln-convert eval`` (evaluation/) and the one evaluation definition. Torch-free."""

from dataclasses import dataclass

from ..data.options import text
from ..errors import MixLNError
from ..io.records import Record
from ..limits import MAX_EXAMPLES, MAX_TASKS
from ..options import BATCH_SIZE, SEQ_LEN, Options
from ..schema import (BATCH, TOKENS, TOKENS_OR_ZERO, Count, Flag, Folder, Names, Shaped, String, Window, comma_list,
                      setting)

# The one evaluation definition: every perplexity the tool reports is measured on the first EVAL_TOKENS
# tokens of the held-out text in packed windows of SEQ_LEN unless a flag or recipe key says
# otherwise, and each result records the data, token count and window length it used.
EVAL_DATA = "embedded:validation"
EVAL_TOKENS = 8192  # 32 windows: enough for a bootstrap interval, and quick on CPU
TASKS_HELP = ("lm-evaluation-harness tasks (`pip install 'lm_eval>=0.4.13'`): the shipped offline "
              "mixln_langref_ppl and mixln_langref_next (they ship with the package), lm-eval's own "
              "(e.g. hellaswag,arc_easy, from your datasets cache) or yours in --include-path.")
LIMIT = Count(1, MAX_EXAMPLES)  # examples of one lm-eval task (--limit)
MEASURED_WINDOW = Count(2)  # a measured window scores its tokens after the first: at least one
UNKNOWN_LENGTH = "unknown length"  # an analysis made before its window length was recorded


@dataclass(frozen=True, kw_only=True)
class Measured(Record):
    """What a figure was measured on: the text's name, the tokens scored and the window length."""
    data: str = setting(kind=String())
    tokens: int = setting(kind=TOKENS_OR_ZERO)
    seq_len: int = setting(kind=MEASURED_WINDOW)


@dataclass(frozen=True, kw_only=True)
class Evaluated(Measured):
    """What an analysis was measured on (``Analysis.evaluation``): the oldest analyses recorded no window length,
    which reads as UNKNOWN_LENGTH."""
    seq_len: int | str = setting(kind=Shaped(lambda v: v == UNKNOWN_LENGTH or MEASURED_WINDOW.ok(v),
                                             f"{MEASURED_WINDOW.describe()} or '{UNKNOWN_LENGTH}'"))


def measured_on(where: Measured) -> str:
    """What a figure was measured on (``where``: a :class:`Measured`, or another record of its data, tokens
    (scored) and seq_len: eval's scores, a heal's windows), in one wording for the console, the report and the
    model cards: 'DATA, 8 windows of 256 = 2,048 tokens, 2,040 scored'. A window of S tokens scores S - 1
    next-token predictions (its first token has nothing before it), so both counts are said; a count that is no
    whole number of windows reads 'DATA, N tokens scored in windows of S'."""
    seq_len, tokens = where.seq_len, where.tokens
    if not (isinstance(seq_len, int) and seq_len > 1 and isinstance(tokens, int) and tokens > 0
            and tokens % (seq_len - 1) == 0):
        return f"{where.data}, {tokens:,} tokens scored in windows of {seq_len}"
    windows = tokens // (seq_len - 1)
    return (f"{where.data}, {windows:,} window{'s' if windows > 1 else ''} of {seq_len} = {windows * seq_len:,} "
            f"tokens, {tokens:,} scored")


@dataclass(frozen=True, kw_only=True)
class Measurement(Options):
    """Text a model is measured on: ``max_tokens`` tokens of ``data`` (a path; None: the command's
    embedded split) in packed windows of ``seq_len``, ``batch_size`` windows a forward pass."""
    data: str | None = text("Held-out text.")
    seq_len: int = setting(SEQ_LEN, Window(opt_in="allow_longer"), "Tokens per evaluated window (at most the "
                           "model's max_position_embeddings).")
    max_tokens: int = setting(EVAL_TOKENS, TOKENS, "Held-out tokens scored (whole windows of --seq-len).")
    batch_size: int = setting(BATCH_SIZE, BATCH, "Windows per forward pass.")


@dataclass(frozen=True, kw_only=True)
class EvalOptions(Measurement):
    """``mixln-convert eval``'s options (evaluation/perplexity.py; with ``tasks``, evaluation/downstream.py)."""
    allow_longer: bool = setting(False, Flag(), "Allow a --seq-len beyond the model's max_position_embeddings.")
    per_document: bool = setting(False, Flag(), "Also score each document on its own from its first token "
                                 "(lm-evaluation-harness's rolling loglikelihood: token and word perplexity, bits "
                                 "per byte), windows of --seq-len.")
    generate: bool = setting(False, Flag(), "Also write greedy continuations (64 tokens) of 24 fixed prompts and the "
                             "share of their 4-grams that repeat earlier ones: what a looping model shows and "
                             "perplexity hides.")
    tasks: tuple[str, ...] = setting((), Names(low=0, high=MAX_TASKS), TASKS_HELP + " Instead of the packed "
                                     "perplexity.", metavar="T1,T2")
    batch_size: int = setting(BATCH_SIZE, BATCH, "Windows (with tasks: lm-eval requests) per forward pass.")
    include_path: str | None = setting(None, Folder(), "A folder of your own lm-eval task YAML files.", metavar="DIR")
    limit: int | None = setting(None, LIMIT, "At most N examples of each task (lm-eval's --limit).",
                                metavar="N", default_help="all")

    def __post_init__(self):
        if self.tasks is None or isinstance(self.tasks, str):  # an API caller's None or "a,b": as the CLI reads it
            object.__setattr__(self, "tasks", comma_list(self.tasks) if self.tasks else ())
        super().__post_init__()

    def check_combination(self):
        if not self.tasks and (self.include_path is not None or self.limit is not None):
            raise MixLNError(f"{self.flag('include_path')} and {self.flag('limit')} go with {self.flag('tasks')}")
