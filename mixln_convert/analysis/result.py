"""An analysis (``analysis.json`` of ``mixln-convert analyze``): what :func:`~.analyze.analyze` returns and
writes, and what compare, demo, sweep and study read back, each field declared once with its kind. Torch-free."""

from dataclasses import dataclass
from pathlib import Path

from ..errors import MixLNError
from ..evaluation.options import UNKNOWN_LENGTH, Evaluated
from ..evaluation.result import DocumentScores, Generation
from ..io.records import LAYER_COUNT, NUMBER, NUMBER_LIST, POST_LN_COUNT, Record, Result
from ..limits import MAX_TOKENS
from ..schema import (POSITIVE_NUMBER, TOKENS, TOKENS_OR_ZERO, ByName, Count, Flag, Kind, Nested, Numbers, Shaped,
                      String, setting)

# the layer sweep's results: all of them, or none in an analysis made without ``layer_sweep``
PER_LAYER_KEYS = ("layer_drop", "angular_distance_matrix", "grad_norm_per_layer")
PER_WINDOW_TABLES = ("loss_without_layer", "angular_distance", "grad_norm_per_layer")  # rows of one value per layer
NUMBER_ROWS = Shaped(lambda v: isinstance(v, list) and all(NUMBER_LIST.ok(row) and row for row in v),
                     "a list of non-empty lists of numbers")


@dataclass(frozen=True, kw_only=True)
class TaskDrop(Record):
    """One task of ``analyze --task`` (``task_layer_drop``): ``layer_drop``, per block the metric skipping it minus
    the full model's ``value``; ``samples``, the examples it ran (at most ``limit``)."""
    task: str = setting(kind=String())
    metric: str = setting(kind=String())
    higher_is_better: bool = setting(kind=Flag())
    value: float = setting(kind=NUMBER)
    layer_drop: list = setting(kind=NUMBER_LIST)
    samples: int = setting(kind=TOKENS_OR_ZERO)
    limit: int | None = setting(None, TOKENS)


@dataclass(frozen=True, kw_only=True)
class PerWindow(Record):
    """The values intervals are bootstrapped from: per evaluation window its loss and, with the layer sweep,
    one value per layer (per gradient batch for the gradient norms). Their shapes: Analysis.check."""
    SPARSE = True

    loss: list = setting(kind=Numbers(NUMBER, 1, MAX_TOKENS))
    loss_without_layer: list | None = setting(None, NUMBER_ROWS)
    angular_distance: list | None = setting(None, NUMBER_ROWS)
    grad_norm_per_layer: list | None = setting(None, NUMBER_ROWS)


@dataclass(frozen=True, kw_only=True)
class PruneCurve(Record):
    """Perplexity with N = 1..L/2 blocks removed (``removed``), the blocks ``method`` chose for each and
    per removal its window losses (absent from the oldest analyses)."""
    SPARSE = True

    method: str = setting(kind=String())
    removed: list = setting(kind=NUMBER_LIST)
    perplexity: list = setting(kind=NUMBER_LIST)
    layers: list | None = setting(None, Kind())
    window_losses: list | None = setting(None, NUMBER_ROWS)


# kw_only: the fields keep the file's order; a measurement not made (no layer sweep, no prune curve) is None
# and left out of the file
@dataclass(frozen=True, kw_only=True)
class Analysis(Result):
    FILE = "analysis.json"
    WHAT = "an analysis of `mixln-convert analyze`"
    SPARSE = True

    checkpoint: str = setting(kind=String())
    data: str | None = setting(None, String())  # data, tokens, seq_len: absent from the oldest analyses
    seq_len: int | None = setting(None, Count(2, MAX_TOKENS))
    num_layers: int = setting(kind=LAYER_COUNT)
    post_ln_layers: int = setting(kind=POST_LN_COUNT)
    layernorm_scaling: bool | None = setting(None, Flag())  # LayerNorm Scaling: norm outputs x 1/sqrt(l)
    layout: list | None = setting(None, Kind())  # "Post-LN" or "Pre-LN" per block
    tokens: int | None = setting(None, TOKENS_OR_ZERO)
    perplexity: float = setting(kind=POSITIVE_NUMBER)
    layer_drop: list | None = setting(None, NUMBER_LIST)
    angular_distance: list | None = setting(None, Kind())  # null past the last block with span blocks ahead
    angular_distance_matrix: list | None = setting(None, NUMBER_ROWS)
    span: int | None = setting(None, LAYER_COUNT)
    block_influence: list | None = setting(None, Kind())
    grad_norm_per_layer: list | None = setting(None, NUMBER_LIST)
    per_window: PerWindow | None = setting(None, Nested(PerWindow, "the per-window values"))
    tokenizer_vocab_size: int | None = setting(None, TOKENS_OR_ZERO)
    prune_curve: PruneCurve | None = setting(None, Nested(PruneCurve, "a prune curve"))
    generation: Generation | None = setting(None, Nested(Generation, "a generation"))
    per_document: DocumentScores | None = setting(None, Nested(DocumentScores, "per-document scores"))
    task_drop: dict[str, TaskDrop] | None = setting(None, ByName(Nested(TaskDrop, "a task's layer drop")))

    @property
    def layered(self) -> bool:
        """Whether it holds the layer sweep (layer drop, angular distances, gradient norms)."""
        return self.layer_drop is not None

    def evaluation(self) -> Evaluated:
        """The data, tokens and window length it was measured on (as the oldest analyses say: unknown)."""
        return Evaluated(data=self.data or "unknown data", tokens=self.tokens or 0,
                         seq_len=self.seq_len or UNKNOWN_LENGTH)

    def check(self, file: Path) -> None:
        """The per-layer lists one entry per layer, the layer sweep whole, and the per-window tables."""
        num_layers = self.num_layers
        if self.post_ln_layers > num_layers:
            raise MixLNError(f"{file}: post_ln_layers {self.post_ln_layers} exceeds num_layers {num_layers}")
        layered = [key for key in PER_LAYER_KEYS if getattr(self, key) is not None]
        if layered and len(layered) < len(PER_LAYER_KEYS):
            missing = ", ".join(key for key in PER_LAYER_KEYS if getattr(self, key) is None)
            raise MixLNError(f"{file}: has {layered[0]} but not {missing} (a layer analysis has all of them)")
        for key in layered:
            if len(getattr(self, key)) != num_layers:
                raise MixLNError(f"{file}: {key} has {len(getattr(self, key))} entries for {num_layers} layers")
        if self.prune_curve is not None and len(self.prune_curve.removed) != len(self.prune_curve.perplexity):
            raise MixLNError(f"{file}: prune_curve: removed and perplexity must be lists of one length")
        if self.per_window is not None:
            self._check_per_window(file)
        for task, drop in (self.task_drop or {}).items():
            if len(drop.layer_drop) != num_layers:
                raise MixLNError(f"{file}: task_drop.{task}.layer_drop has {len(drop.layer_drop)} entries for "
                                 f"{num_layers} layers")

    def _check_per_window(self, file: Path) -> None:
        """The per-window values the report bootstraps from: one loss per evaluation window, and per
        window (or gradient batch) one value per layer; prune-curve losses per window likewise."""
        per_window, num_layers = self.per_window, self.num_layers
        windows = len(per_window.loss)
        for key in PER_WINDOW_TABLES if self.layered else ():
            table = getattr(per_window, key)
            if not (table and all(len(row) == num_layers for row in table)):
                raise MixLNError(f"{file}: per_window.{key}: must be a non-empty list of rows of {num_layers} numbers")
            if key != "grad_norm_per_layer" and len(table) != windows:
                raise MixLNError(f"{file}: per_window.{key}: {len(table)} rows for {windows} evaluation windows")
        losses = self.prune_curve and self.prune_curve.window_losses
        if losses is not None and not (len(losses) == len(self.prune_curve.removed)
                                       and all(len(row) == windows for row in losses)):
            raise MixLNError(f"{file}: prune_curve.window_losses: must hold one row of {windows} numbers per removal")
